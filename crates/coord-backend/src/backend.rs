use std::fmt::Debug;

use async_trait::async_trait;

use crate::{Assert, Entry, Mutation, Result, TxnOutcome, Version};

/// What one store accepts. Every store validates input against its limits
/// with [`crate::validate_txn`] before touching anything, so bad input gets
/// [`crate::Error::InvalidInput`] and nothing stored changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Longest key, in bytes (UTF-8).
    pub max_key_bytes: usize,
    /// Largest value, in bytes.
    pub max_value_bytes: usize,
    /// Most distinct keys one snapshot or txn may name.
    pub max_keys_per_call: usize,
}

impl Limits {
    /// The default limits: 1 KiB keys, 512 KiB values, 128 keys per call.
    /// Memory, SQLite, Redis and PostgreSQL accept them; a store with tighter
    /// server limits returns its own from [`Backend::limits`] (etcd: 64 keys
    /// and 18 KiB values per call, so a whole txn fits its 1.5 MiB request).
    pub const DEFAULT: Limits = Limits {
        max_key_bytes: 1024,
        max_value_bytes: 512 * 1024,
        max_keys_per_call: 128,
    };

    /// Limits with another maximum value size.
    pub const fn with_max_value_bytes(mut self, max: usize) -> Self {
        self.max_value_bytes = max;
        self
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// The three storage primitives. A store implements them atomically; every
/// decision is made above, in `coord-adapters`.
///
/// Keys are UTF-8 strings relative to the backend's [`namespace`](Backend::namespace):
/// two backends with different namespaces never see each other's keys, even
/// when one namespace is a prefix of the other.
///
/// The trait is object safe: pick a store at run time and pass
/// `Arc<dyn Backend>` around.
#[async_trait]
pub trait Backend: Send + Sync + Debug {
    /// The namespace this instance reads and writes in.
    fn namespace(&self) -> &str;

    /// What this store accepts (key length, value size, keys per call).
    fn limits(&self) -> Limits {
        Limits::DEFAULT
    }

    /// A short fixed name of the kind of store (`sqlite`, `redis`, ...), for
    /// metric labels and tracing spans; never a URL or anything secret.
    /// `"unnamed"` unless the store, or the [`crate::Metered`] wrapper that
    /// `coord::connect` puts around every store, says otherwise.
    fn store_name(&self) -> &'static str {
        "unnamed"
    }

    /// Change notifications, when this store offers them (see
    /// [`crate::Changes`]: wake-ups only, never a source of truth). `None`
    /// (the default): waiters poll.
    fn changes(&self) -> Option<&dyn crate::Changes> {
        None
    }

    /// A consistent view of `keys` at one instant.
    ///
    /// Returns one entry per distinct key, in the order of first appearance.
    /// A missing (or deleted) key comes back with [`Version::MISSING`] and no value.
    async fn snapshot(&self, keys: &[String]) -> Result<Vec<Entry>>;

    /// Apply every mutation if, and only if, every assert holds, in one atomic step.
    ///
    /// On success every written key's version moves by exactly 1. On failure
    /// nothing is written and [`TxnOutcome::current`] carries the current
    /// entries of the asserted keys. A lost answer after sending is
    /// [`crate::Error::Indeterminate`], never `applied = false`.
    async fn txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome>;

    /// Every existing key that starts with `prefix`, sorted by bytes, with the
    /// same consistency as a snapshot. The prefix is literal data: `%`, `_`,
    /// `*`, `?`, `[`, `{`, `\` and non-ASCII characters match only themselves.
    async fn keys(&self, prefix: &str) -> Result<Vec<String>>;
}

/// Conveniences over [`Backend`]; implemented for every backend.
#[async_trait]
pub trait BackendExt: Backend {
    /// Read one key.
    async fn get(&self, key: &str) -> Result<Entry> {
        let mut entries = self.snapshot(&[key.to_owned()]).await?;
        Ok(entries.pop().unwrap_or_else(|| Entry::missing(key)))
    }

    /// Put `value` at `key` only if the key is at `expected`.
    async fn put_if(&self, key: &str, expected: Version, value: Vec<u8>) -> Result<TxnOutcome> {
        self.txn(&[Assert::at(key, expected)], &[Mutation::put(key, value)])
            .await
    }

    /// Delete `key` only if it is at `expected`.
    async fn delete_if(&self, key: &str, expected: Version) -> Result<TxnOutcome> {
        self.txn(&[Assert::at(key, expected)], &[Mutation::delete(key)])
            .await
    }
}

impl<B: Backend + ?Sized> BackendExt for B {}
