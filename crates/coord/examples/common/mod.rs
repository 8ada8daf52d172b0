//! What every example shares: the store URL.

/// The store the examples use: `COORD_STORE` when set (any URL
/// `coord::connect` takes: `redis://127.0.0.1:6379`, `postgres://…`), else a
/// SQLite file in the current directory, which several processes of this host
/// can share (run an example twice at once to see them coordinate).
pub(crate) fn store_url() -> String {
    std::env::var("COORD_STORE")
        .unwrap_or_else(|_| "sqlite://coord-examples.db?namespace=examples".to_owned())
}
