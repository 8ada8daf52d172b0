//! Small helpers for a crate's own tests, beside the suites: reading a
//! txn's answer in one line and reading what a local metrics recorder saw.
//! They decide nothing about a store; a failure panics, as in any test.

use std::collections::BTreeMap;
use std::future::Future;

use coord_backend::{Error, TxnOutcome};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

/// Whether the txn `call` applied; panics when the store answers an error.
///
/// ```
/// use coord_backend::{BackendExt, Version};
/// use coord_conformance::support::applied;
/// use coord_memory::SingleProcessMemoryBackend;
///
/// let store = SingleProcessMemoryBackend::new("support-doc").unwrap();
/// let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
/// runtime.block_on(async {
///     assert!(applied(store.put_if("k", Version::MISSING, b"v".to_vec())).await);
///     assert!(!applied(store.put_if("k", Version::MISSING, b"w".to_vec())).await);
/// });
/// ```
pub async fn applied(call: impl Future<Output = Result<TxnOutcome, Error>>) -> bool {
    call.await.expect("the txn answers").applied
}

/// Run `workload` to its end on a current-thread runtime, every metric it
/// records going to `recorder` (and only there: a local recorder sees
/// nothing of tests running beside it).
pub fn with_recorder<T>(recorder: &DebuggingRecorder, workload: impl Future<Output = T>) -> T {
    metrics::with_local_recorder(recorder, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
            .block_on(workload)
    })
}

/// Every counter `recorder` saw: `name{label=value,...}` (or `name` without
/// labels) → its value.
pub fn counters(recorder: &DebuggingRecorder) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        if let DebugValue::Counter(n) = value {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = if labels.is_empty() {
                key.name().to_owned()
            } else {
                format!("{}{{{}}}", key.name(), labels.join(","))
            };
            out.insert(name, n);
        }
    }
    out
}

/// The runtime the stores' benches drive their clients on: multi-thread
/// with one worker, timers and I/O enabled, so every store is measured
/// the same way.
pub fn bench_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
