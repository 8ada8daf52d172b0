//! Random tokens minted by adapters at commit time.

/// A fresh 128-bit token from the operating system's CSPRNG, as 32 hex digits.
///
/// Only the txn that writes a token can commit it (its asserts guarantee
/// that), so a loser's token never reaches the store, and the token in a
/// record proves which attempt wrote it (used to resolve indeterminate txns).
pub fn mint_token() -> String {
    hex128(rand::random::<u128>())
}

/// `bits` as 32 lowercase hex digits, as `format!("{bits:032x}")` writes
/// them: each lock cycle mints two tokens (token and nonce), and the
/// formatting machinery cost more than the random numbers.
fn hex128(bits: u128) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 32];
    for (i, digit) in digits.iter_mut().enumerate() {
        *digit = HEX[((bits >> ((31 - i) * 4)) & 0xf) as usize];
    }
    // Hex digits are ASCII: the check cannot fail.
    String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_32_hex_digits_as_format_writes_them() {
        for bits in [0, 1, 0xabc, u128::MAX, u128::MAX / 3, 1 << 127] {
            assert_eq!(hex128(bits), format!("{bits:032x}"));
        }
        let (a, b) = (mint_token(), mint_token());
        assert_ne!(a, b);
        assert!(
            a.len() == 32
                && a.bytes()
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
    }
}
