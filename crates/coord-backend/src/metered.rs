//! [`Metered`]: a decorator that counts and times every txn of any store
//! through the `metrics` facade.
//!
//! It lives here, next to [`Backend`], because it needs nothing but the
//! trait: it knows no store and no adapter. The `coord` facade's `connect`
//! wraps every store it opens; a program that builds a store directly wraps
//! it with [`Metered::wrap`]. Without a recorder installed (the `metrics`
//! crate's default) every call below is a no-op, so libraries pay nothing and
//! force no exporter on their users. Names, labels and meaning are documented
//! in docs/operations.md.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use crate::{Assert, Backend, Entry, Error, Limits, Mutation, Result, TxnOutcome};

/// Counter `coord_txn_total{store, outcome}`: txns sent to a store, by how they ended.
///
/// `outcome` is one of `applied`, `rejected` (an assert did not hold, nothing
/// written), `indeterminate` (sent, answer lost), `unavailable` (not sent or
/// refused before doing anything), `invalid` (refused input) or `error`
/// (anything else, e.g. a malformed record).
pub const TXN_TOTAL: &str = "coord_txn_total";

/// Counter `coord_reclaimed_total{store}`: tombstones removed by
/// [`Backend::reclaim`] through this wrapper.
pub const RECLAIMED_TOTAL: &str = "coord_reclaimed_total";

/// Histogram `coord_txn_seconds{store}`: wall time of each txn call, whatever its outcome.
pub const TXN_SECONDS: &str = "coord_txn_seconds";

/// Every value of the `outcome` label of [`TXN_TOTAL`].
pub const TXN_OUTCOMES: [&str; 6] = [
    "applied",
    "rejected",
    "indeterminate",
    "unavailable",
    "invalid",
    "error",
];

/// Describe [`TXN_TOTAL`] and [`TXN_SECONDS`] to the current recorder (their HELP text).
pub fn describe() {
    metrics::describe_counter!(
        TXN_TOTAL,
        "Txns sent to a store, by store kind and outcome (applied, rejected, indeterminate, unavailable, invalid, error)"
    );
    metrics::describe_histogram!(
        TXN_SECONDS,
        metrics::Unit::Seconds,
        "Wall time of each txn call, by store kind"
    );
}

/// The `outcome` label of [`TXN_TOTAL`] for a txn's result.
pub fn txn_outcome(result: &Result<TxnOutcome>) -> &'static str {
    match result {
        Ok(outcome) if outcome.applied => "applied",
        Ok(_) => "rejected",
        Err(Error::Indeterminate { .. }) => "indeterminate",
        Err(Error::Unavailable { .. }) => "unavailable",
        Err(Error::InvalidInput(_)) => "invalid",
        Err(_) => "error",
    }
}

/// Any store, with every txn counted in [`TXN_TOTAL`] and timed in
/// [`TXN_SECONDS`] under the label `store` (a fixed name such as the URL
/// scheme, never a key or a URL: labels must be few).
///
/// Snapshots and key listings pass through uncounted. `Debug` is the inner
/// store's.
///
/// ```
/// use std::sync::Arc;
/// use coord_backend::{Backend, Metered};
/// # fn wrap(store: Arc<dyn Backend>) -> Arc<dyn Backend> {
/// let store: Arc<dyn Backend> = Metered::wrap("sqlite", store);
/// # store }
/// ```
pub struct Metered {
    store: &'static str,
    inner: Arc<dyn Backend>,
}

impl Metered {
    /// `inner`, counted under `store = <store>`. Registers this store's
    /// series at 0 in the current recorder (so they are exported before the
    /// first txn, and a rate over them starts from 0).
    pub fn new(store: &'static str, inner: Arc<dyn Backend>) -> Self {
        describe();
        for outcome in TXN_OUTCOMES {
            metrics::counter!(TXN_TOTAL, "store" => store, "outcome" => outcome).increment(0);
        }
        Metered { store, inner }
    }

    /// [`Metered::new`], as a shared trait object.
    pub fn wrap(store: &'static str, inner: Arc<dyn Backend>) -> Arc<dyn Backend> {
        Arc::new(Self::new(store, inner))
    }

    /// The `store` label.
    pub fn store(&self) -> &'static str {
        self.store
    }

    /// The store underneath.
    pub fn inner(&self) -> &Arc<dyn Backend> {
        &self.inner
    }
}

impl std::fmt::Debug for Metered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

#[async_trait]
impl Backend for Metered {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn store_name(&self) -> &'static str {
        self.store
    }

    fn changes(&self) -> Option<&dyn crate::Changes> {
        self.inner.changes()
    }

    async fn snapshot(&self, keys: &[String]) -> Result<Vec<Entry>> {
        self.inner.snapshot(keys).await
    }

    async fn txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let started = Instant::now();
        let result = self.inner.txn(asserts, mutations).await;
        metrics::histogram!(TXN_SECONDS, "store" => self.store)
            .record(started.elapsed().as_secs_f64());
        metrics::counter!(TXN_TOTAL, "store" => self.store, "outcome" => txn_outcome(&result))
            .increment(1);
        result
    }

    async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.keys(prefix).await
    }

    async fn first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.inner.first_keys(prefix, limit).await
    }

    async fn reclaim(&self, options: &crate::ReclaimOptions) -> Result<crate::Reclaimed> {
        let result = self.inner.reclaim(options).await;
        if let Ok(done) = &result {
            metrics::counter!(RECLAIMED_TOTAL, "store" => self.store).increment(done.removed);
        }
        result
    }

    // The checked calls above go to the inner store's own (which check
    // once); these serve callers of the raw calls, uncounted like reads.
    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        self.inner.raw_snapshot(keys).await
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        self.inner.raw_txn(asserts, mutations).await
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.raw_keys(prefix).await
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.inner.raw_first_keys(prefix, limit).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;
    use crate::Version;

    /// Applies a txn when its first assert is "missing", rejects it otherwise,
    /// and fails as told for keys named after an error.
    #[derive(Debug, Default)]
    struct Scripted(Mutex<u64>);

    #[async_trait]
    impl Backend for Scripted {
        fn namespace(&self) -> &str {
            "t"
        }
        async fn raw_snapshot(&self, _: &[&str]) -> Result<Vec<Entry>> {
            Ok(Vec::new())
        }
        async fn raw_txn(&self, asserts: &[Assert], _: &[Mutation]) -> Result<TxnOutcome> {
            *self.0.lock().unwrap() += 1;
            match asserts[0].key.as_str() {
                "lost" => Err(Error::Indeterminate {
                    message: "lost".into(),
                    source: None,
                }),
                "down" => Err(Error::Unavailable {
                    message: "down".into(),
                    source: None,
                }),
                _ if asserts[0].version == Version::MISSING => Ok(TxnOutcome::applied()),
                _ => Ok(TxnOutcome::rejected(Vec::new())),
            }
        }
        async fn raw_keys(&self, _: &str) -> Result<Vec<String>> {
            Ok(Vec::new())
        }
    }

    #[test]
    fn counts_each_txn_by_outcome_and_times_it() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let inner = Arc::new(Scripted::default());
        let store = Metered::wrap("scripted", inner.clone());
        metrics::with_local_recorder(&recorder, || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(async {
                for (key, version) in [
                    ("a", Version::MISSING),
                    ("b", Version::MISSING),
                    ("a", Version(7)),
                    ("lost", Version(1)),
                    ("down", Version(1)),
                    ("down", Version(1)),
                ] {
                    let _ = store.txn(&[Assert::at(key, version)], &[]).await;
                }
            });
        });
        let mut counts = std::collections::BTreeMap::new();
        let mut timed = 0;
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let key = key.key();
            let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
            assert!(labels.contains(&("store", "scripted")), "{labels:?}");
            match (key.name(), value) {
                (TXN_TOTAL, DebugValue::Counter(0)) => {}
                (TXN_TOTAL, DebugValue::Counter(n)) => {
                    let outcome = key.labels().find(|l| l.key() == "outcome").unwrap();
                    counts.insert(outcome.value().to_owned(), n);
                }
                (TXN_SECONDS, DebugValue::Histogram(samples)) => timed += samples.len(),
                other => panic!("unexpected metric {other:?}"),
            }
        }
        let expected: std::collections::BTreeMap<String, u64> = [
            ("applied", 2),
            ("rejected", 1),
            ("indeterminate", 1),
            ("unavailable", 2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(counts, expected);
        assert_eq!(timed as u64, *inner.0.lock().unwrap());
        assert_eq!(timed, 6);
    }
}
