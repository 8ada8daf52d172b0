use std::fmt::Debug;

use async_trait::async_trait;

use crate::{Assert, Entry, Mutation, ReclaimOptions, Reclaimed, Result, TxnOutcome, Version};

/// What one store accepts. The provided [`Backend`] methods check input
/// against these limits before any store code runs, so bad input gets
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
    /// server limits returns its own from [`Backend::limits`] (etcd: 42 keys
    /// and 29 KiB values per call, so a whole txn fits its 1.5 MiB request).
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

/// The three storage primitives. A store implements them atomically
/// (`raw_snapshot`, `raw_txn`, `raw_keys`); the provided `snapshot`, `txn`
/// and `keys` callers use check the input once, for every store, and every
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
    ///
    /// Provided: checks `keys` against [`Backend::limits`] (bad input is
    /// [`crate::Error::InvalidInput`] and reaches no store), answers an empty
    /// call without the store, and asks [`Backend::raw_snapshot`] once for
    /// the distinct keys. Stores implement `raw_snapshot`, not this.
    async fn snapshot(&self, keys: &[String]) -> Result<Vec<Entry>> {
        crate::validate::validate_keys(keys, &self.limits())?;
        let distinct = crate::validate::distinct_keys(keys.iter().map(String::as_str));
        if distinct.is_empty() {
            return Ok(Vec::new());
        }
        let found = self.raw_snapshot(&distinct).await?;
        Ok(in_order(&distinct, found))
    }

    /// Apply every mutation if, and only if, every assert holds, in one atomic step.
    ///
    /// On success every written key's version moves by exactly 1. On failure
    /// nothing is written and [`TxnOutcome::current`] carries the current
    /// entries of the asserted keys. A lost answer after sending is
    /// [`crate::Error::Indeterminate`], never `applied = false`.
    ///
    /// Provided: checks the input with [`crate::validate_txn`] (bad input
    /// reaches no store), applies an empty txn (no asserts, no mutations)
    /// without the store, and sends the rest to [`Backend::raw_txn`].
    async fn txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        crate::validate::validate_txn(asserts, mutations, &self.limits())?;
        if asserts.is_empty() && mutations.is_empty() {
            return Ok(TxnOutcome::applied());
        }
        self.raw_txn(asserts, mutations).await
    }

    /// Every existing key that starts with `prefix`, sorted by bytes, with the
    /// same consistency as a snapshot. The prefix is literal data: `%`, `_`,
    /// `*`, `?`, `[`, `{`, `\` and non-ASCII characters match only themselves.
    ///
    /// Provided: checks the prefix, then asks [`Backend::raw_keys`].
    async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        crate::validate::validate_prefix(prefix, &self.limits())?;
        self.raw_keys(prefix).await
    }

    /// The first `limit` keys [`Backend::keys`] would list under `prefix`
    /// (fewer when fewer exist), so a reader of the head of a long index
    /// does not pay for the whole of it.
    ///
    /// Provided: checks the prefix, answers `limit = 0` without the store,
    /// then asks [`Backend::raw_first_keys`].
    async fn first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        crate::validate::validate_prefix(prefix, &self.limits())?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.raw_first_keys(prefix, limit).await
    }

    /// Remove tombstones (deleted keys' counters) without ever handing a
    /// version out twice: see [`crate::reclaim`] for the floor that makes it
    /// safe, and for why it needs no grace period.
    ///
    /// Not one of the three primitives: a maintenance operation, run by
    /// `coordctl gc` or a background task. The default answers
    /// [`crate::Error::Unsupported`]; every store of this project implements
    /// it.
    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        let _ = options;
        Err(crate::Error::Unsupported {
            what: "reclaim",
            store: self.store_name(),
        })
    }

    /// The store's snapshot, called by [`Backend::snapshot`] only, with
    /// checked, distinct keys (at least one): one consistent read. Entries
    /// may come in any order; a key without an entry reads as missing.
    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>>;

    /// The store's txn, called by [`Backend::txn`] only, with checked input
    /// (at least one assert or mutation; no key written twice, none asserted
    /// at two versions; within the limits). Atomic; on rejection `current`
    /// holds the asserted keys' entries, one per distinct key, in assert order.
    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome>;

    /// The store's key listing, called by [`Backend::keys`] only, with a
    /// checked prefix: the existing keys under it, sorted by bytes.
    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>>;

    /// The store's listing of the first `limit` keys (at least 1) under a
    /// checked prefix, called by [`Backend::first_keys`] only. The default
    /// lists everything and keeps the head: correct on any store, and what a
    /// wrapper that does not forward it gets; every store of this project
    /// stops at `limit` in the store itself.
    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        let mut keys = self.raw_keys(prefix).await?;
        keys.truncate(limit);
        Ok(keys)
    }
}

/// The entries of `keys` (distinct) in their order, from what a store
/// returned in any order; keys it left out read as missing.
fn in_order(keys: &[&str], found: Vec<Entry>) -> Vec<Entry> {
    let mut by_key: std::collections::HashMap<String, Entry> =
        found.into_iter().map(|e| (e.key.clone(), e)).collect();
    keys.iter()
        .map(|k| by_key.remove(*k).unwrap_or_else(|| Entry::missing(*k)))
        .collect()
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::{Error, InvalidInput};

    /// Records what reaches the raw calls; key `x` exists at version 3.
    #[derive(Debug, Default)]
    struct Recording(Mutex<Vec<String>>);

    #[async_trait]
    impl Backend for Recording {
        fn namespace(&self) -> &str {
            "t"
        }
        async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
            self.0.lock().unwrap().push(format!("snapshot {keys:?}"));
            // Any order, and missing keys left out.
            Ok(vec![Entry::present("x", Version(3), b"v".to_vec())])
        }
        async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
            self.0
                .lock()
                .unwrap()
                .push(format!("txn {} {}", asserts.len(), mutations.len()));
            Ok(TxnOutcome::applied())
        }
        async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
            self.0.lock().unwrap().push(format!("keys {prefix:?}"));
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn the_store_sees_only_checked_distinct_non_empty_calls() {
        let store = Recording::default();
        assert!(store.snapshot(&[]).await.unwrap().is_empty());
        assert!(store.txn(&[], &[]).await.unwrap().applied);
        let keys = ["a", "x", "a"].map(String::from);
        let entries = store.snapshot(&keys).await.unwrap();
        assert_eq!(
            entries,
            vec![
                Entry::missing("a"),
                Entry::present("x", Version(3), b"v".to_vec())
            ]
        );
        for bad in [
            store.snapshot(&["".to_owned()]).await.map(|_| ()),
            store
                .txn(&[], &[Mutation::put("k\0", b"v".to_vec())])
                .await
                .map(|_| ()),
            store.keys("p\0").await.map(|_| ()),
        ] {
            assert!(matches!(bad, Err(Error::InvalidInput(_))), "{bad:?}");
        }
        let too_many: Vec<String> = (0..=Limits::DEFAULT.max_keys_per_call)
            .map(|i| format!("k{i}"))
            .collect();
        assert!(matches!(
            store.snapshot(&too_many).await,
            Err(Error::InvalidInput(InvalidInput::TooManyKeys { .. }))
        ));
        assert_eq!(*store.0.lock().unwrap(), vec![r#"snapshot ["a", "x"]"#]);
    }
}
