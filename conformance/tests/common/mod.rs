//! What this crate's test binaries share: the in-process memory store the
//! suites run on here, and the proof that a check goes red on a
//! deliberately broken double.
// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use coord_adapters::lock::{LockError, LockHandle, LostReason};
use coord_backend::{Backend, ManualClock};
use coord_conformance::clients::{client_factory, ClientFactory};
use coord_conformance::{factory, BackendFactory, BoxFuture, CheckResult};
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
    let expires = UNIX_EPOCH + Duration::from_millis(expires_ms);
    LockHandle::new(key, token, fence, ttl, expires)
}

/// A suite's checks by name, each runnable against an environment `E`.
pub(crate) type Checks<E> = Vec<(&'static str, fn(E) -> BoxFuture<'static, CheckResult>)>;

/// Every check passes against what `env()` makes (a double with no bug
/// switched on), so a red elsewhere comes from the bug.
pub(crate) async fn all_pass<E>(checks: Checks<E>, env: impl Fn() -> E, what: &str) {
    for (name, run) in checks {
        if let Err(failure) = run(env()).await {
            panic!("{what}: {name} failed: {failure}");
        }
    }
}

/// Each check named fails against what `env()` makes.
pub(crate) async fn each_fails<E>(checks: &Checks<E>, names: &[&str], env: impl Fn() -> E) {
    for name in names {
        let (_, run) = checks
            .iter()
            .find(|(check, _)| check == name)
            .unwrap_or_else(|| panic!("no check named {name}"));
        must_fail(run(env()), name).await;
    }
}

/// A bug of a double (the setter switching it on in a set `B` of bug
/// switches) and the checks it must turn red.
pub(crate) type Red<'a, B> = (fn(&mut B), &'a [&'a str]);

/// For each bug (switched on alone, in a default `B`), the checks named
/// beside it fail against `env(bugs)`.
pub(crate) async fn red_on_each_bug<B: Copy + Default, E>(
    checks: &Checks<E>,
    env: impl Fn(B) -> E,
    reds: &[Red<'_, B>],
) {
    for (switch_on, names) in reds {
        let mut bugs = B::default();
        switch_on(&mut bugs);
        each_fails(checks, names, || env(bugs)).await;
    }
}

/// A fresh manual clock at a round instant well after the epoch.
pub(crate) fn manual_clock() -> Arc<ManualClock> {
    Arc::new(ManualClock::at_millis(1_700_000_000_000))
}

/// A client factory whose every client is `double`: one in-process double
/// stands for every process.
pub(crate) fn every_client<T, E>(double: Arc<T>) -> ClientFactory<T, E>
where
    T: ?Sized + Send + Sync + 'static,
    E: 'static,
{
    client_factory(move || {
        let double = double.clone();
        async move { Ok(double) }
    })
}
