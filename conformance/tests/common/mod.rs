//! What this crate's test binaries share: the in-process memory store the
//! suites run on here, and the proof that a check goes red on a
//! deliberately broken double.
// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use coord_adapters::lock::{LockError, LockHandle, LostReason};
use coord_backend::Backend;
use coord_conformance::{factory, BackendFactory, CheckResult};
use coord_memory::SingleProcessMemoryBackend;

/// Clients of the memory store (one process: every client of a namespace
/// shares its state).
pub(crate) fn memory() -> BackendFactory {
    factory(|namespace| async move {
        Ok(Arc::new(SingleProcessMemoryBackend::shared(&namespace)?) as Arc<dyn Backend>)
    })
}

/// A client of the memory store's `namespace`.
pub(crate) fn shared_memory(namespace: &str) -> Arc<dyn Backend> {
    Arc::new(SingleProcessMemoryBackend::shared(namespace).expect("memory store"))
}

/// The check must fail: it runs against a deliberately broken double.
pub(crate) async fn must_fail(check: impl Future<Output = CheckResult>, what: &str) {
    match check.await {
        Err(failure) => eprintln!("{what}: red as expected: {failure}"),
        Ok(()) => panic!("{what}: the check passed against a deliberately broken double"),
    }
}

/// `LockError::Lost` of `key`.
pub(crate) fn lost(key: &str, reason: LostReason) -> LockError {
    LockError::Lost {
        key: key.to_owned(),
        reason,
    }
}

/// A lock handle whose lease ends `expires_ms` after the epoch.
pub(crate) fn handle(
    key: &str,
    token: &str,
    fence: u64,
    ttl: Duration,
    expires_ms: u64,
) -> LockHandle {
    LockHandle::new(
        key,
        token,
        fence,
        ttl,
        UNIX_EPOCH + Duration::from_millis(expires_ms),
    )
}
