//! Random tokens minted by adapters at commit time.

/// A fresh 128-bit token from the operating system's CSPRNG, as 32 hex digits.
///
/// Only the txn that writes a token can commit it (its asserts guarantee
/// that), so a loser's token never reaches the store, and the token in a
/// record proves which attempt wrote it (used to resolve indeterminate txns).
pub fn mint_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}
