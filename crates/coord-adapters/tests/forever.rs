//! "Wait forever" and "hold until released": every waiting call with a
//! timeout of `Duration::MAX` and every TTL-taking call with a TTL of
//! `Duration::MAX` works (no overflow of an instant or of the milliseconds
//! stored), free keys at once and contended ones once freed. A retention of
//! more milliseconds than a `u64` holds keeps everything.
//!
//! Each call runs in its own task, so one that panics does not hide the
//! others: the test lists every call that panicked. Time is paused (tokio's
//! test clock), so the waits cost nothing.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, TaskSpec};
use coord_adapters::election::{Election, GenericElection};
use coord_adapters::lock::{
    FairLock, GenericLock, GenericSemaphore, GuardOptions, Lock, LockError, LockExt, LockGuard,
    Semaphore, WaitOptions,
};
use coord_adapters::retention::PruneOptions;
use coord_adapters::runs::{ClaimRequest, RunStore, RunStoreOptions, SlotStore};
use coord_adapters::rwlock::{GenericRwLock, RwLock};
use coord_adapters::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};
use coord_backend::{Backend, ManualClock};
use coord_memory::SingleProcessMemoryBackend;

const MAX: Duration = Duration::MAX;
const SHORT: Duration = Duration::from_secs(1);

type Call = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

fn store() -> Arc<dyn Backend> {
    Arc::new(SingleProcessMemoryBackend::new("forever").unwrap())
}

fn call(f: impl Future<Output = ()> + Send + 'static) -> Call {
    Box::pin(f)
}

/// Free `key` of `lock` after a while (virtual time), from another task.
fn release_later(lock: Arc<dyn Lock>, held: coord_adapters::lock::LockHandle) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        lock.release(held).await.unwrap();
    });
}

fn calls() -> Vec<(&'static str, Call)> {
    let backend = store();
    let lock: Arc<dyn Lock> = Arc::new(GenericLock::new(backend.clone()));
    let fair: Arc<dyn Lock> = Arc::new(FairLock::new(backend.clone()));
    let sem = Arc::new(GenericSemaphore::new(backend.clone()));
    let rw = Arc::new(GenericRwLock::new(backend.clone()));
    let election = Arc::new(GenericElection::new(backend.clone()));
    let (l, f, s, r, e, b) = (
        lock.clone(),
        fair.clone(),
        sem.clone(),
        rw.clone(),
        election.clone(),
        backend.clone(),
    );
    let mut calls: Vec<(&'static str, Call)> = Vec::new();
    let lock_calls: [(&'static str, Arc<dyn Lock>); 2] = [("lock", l), ("fair lock", f)];
    for (name, lock) in lock_calls {
        let one = lock.clone();
        calls.push((
            name,
            call(async move {
                let held = one.try_lock("try", MAX).await.unwrap().unwrap();
                one.renew(&held).await.unwrap();
                one.release(held).await.unwrap();
                let held = one.lock("wait", MAX, MAX).await.unwrap();
                one.release(held).await.unwrap();
            }),
        ));
        let one = lock.clone();
        calls.push((
            name,
            call(async move {
                // Contended: wait forever, for a lock held until released.
                let held = one.try_lock("busy", SHORT).await.unwrap().unwrap();
                release_later(one.clone(), held);
                let got = one.lock("busy", MAX, MAX).await.unwrap();
                one.release(got).await.unwrap();
            }),
        ));
        let one = lock.clone();
        calls.push((
            name,
            call(async move {
                // A backoff of Duration::MAX waits out the timeout, no more.
                let held = one.try_lock("slow", SHORT).await.unwrap().unwrap();
                let wait =
                    WaitOptions::with_timeout(Duration::from_millis(20)).with_backoff(MAX, MAX);
                let waited = one.lock_with("slow", SHORT, &wait).await;
                assert!(
                    matches!(waited, Err(LockError::Timeout { .. })),
                    "{waited:?}"
                );
                one.release(held).await.unwrap();
            }),
        ));
        let one = lock;
        calls.push((
            name,
            call(async move {
                let held = one.try_lock("guarded", MAX).await.unwrap().unwrap();
                let guard = LockGuard::new(one.clone(), held, GuardOptions::default());
                tokio::time::sleep(Duration::from_secs(3_600)).await;
                assert!(guard.is_valid());
                guard.release().await.unwrap();
            }),
        ));
    }
    calls.push((
        "semaphore",
        call(async move {
            let permit = s.try_acquire("try", 2, MAX).await.unwrap().unwrap();
            s.renew(&permit).await.unwrap();
            s.release(permit).await.unwrap();
            let forever = WaitOptions::with_timeout(MAX);
            let permit = s.acquire("wait", 1, MAX, &forever).await.unwrap();
            let sem = s.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                sem.release(permit).await.unwrap();
            });
            let permit = s.acquire("wait", 1, MAX, &forever).await.unwrap();
            s.release(permit).await.unwrap();
        }),
    ));
    calls.push((
        "rwlock",
        call(async move {
            let read = r.try_read("try", MAX).await.unwrap().unwrap();
            r.renew(&read).await.unwrap();
            r.release(read).await.unwrap();
            let write = r.try_write("try", MAX).await.unwrap().unwrap();
            r.release(write).await.unwrap();
            let read = r.read("wait", MAX, MAX).await.unwrap();
            let rw = r.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                rw.release(read).await.unwrap();
            });
            let write = r.write("wait", MAX, MAX).await.unwrap();
            r.release(write).await.unwrap();
        }),
    ));
    calls.push((
        "election",
        call(async move {
            let lead = e.try_campaign("try", "a", "x", MAX).await.unwrap().unwrap();
            e.renew(&lead).await.unwrap();
            e.resign(lead).await.unwrap();
            let lead = e.campaign("wait", "a", "x", MAX, MAX).await.unwrap();
            let seen = e.observe("wait", None, MAX).await.unwrap();
            assert_eq!(seen.map(|l| l.term), Some(lead.term()));
            let el = e.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                el.resign(lead).await.unwrap();
            });
            let next = e.campaign("wait", "b", "y", MAX, MAX).await.unwrap();
            e.resign(next).await.unwrap();
        }),
    ));
    let backend = b.clone();
    calls.push((
        "board",
        call(async move {
            let board = BoardAdapter::new(backend);
            board.add(TaskSpec::new("t", b"x".to_vec())).await.unwrap();
            let claimed = board.claim("t", "agent", MAX).await.unwrap();
            board.renew("t", &claimed.token, MAX).await.unwrap();
            board
                .complete("t", &claimed.token, b"done".to_vec())
                .await
                .unwrap();
        }),
    ));
    let backend = b.clone();
    calls.push((
        "side effects",
        call(async move {
            let clock = Arc::new(ManualClock::at_millis(1_000_000_000));
            let adapter = Arc::new(SideEffectAdapter::with_clock(backend, clock.clone()));
            let runner = Runner::new(adapter.clone());
            let action = Action::new("refund/1", "payments");
            runner
                .execute(&action, MAX, |_lease| async {
                    Ok::<_, std::io::Error>(EffectResult::from("ok"))
                })
                .await
                .unwrap();
            // Longer than a u64 of milliseconds (2^64 + 384 ms): kept.
            clock.advance(Duration::from_secs(3_600));
            let retention = Duration::from_secs(18_446_744_073_709_552);
            let pruned = adapter
                .prune(&PruneOptions::after(retention))
                .await
                .unwrap();
            assert_eq!(
                pruned.removed, 0,
                "a retention of ~584 million years pruned"
            );
        }),
    ));
    calls.push((
        "run store",
        call(async move {
            let clock = Arc::new(ManualClock::at_millis(1_000_000));
            let runs = RunStore::new(b, clock, RunStoreOptions::default()).unwrap();
            let claim = runs
                .claim(&ClaimRequest::new("job", 1, "t", "a", MAX))
                .await
                .unwrap();
            assert!(claim.won);
            runs.heartbeat("job", 1, "t", MAX).await.unwrap();
        }),
    ));
    calls
}

#[tokio::test(start_paused = true)]
async fn every_call_takes_duration_max() {
    let mut failed = Vec::new();
    for (i, (name, call)) in calls().into_iter().enumerate() {
        // Virtual time: a call stuck waiting reaches this at once.
        let bounded = tokio::time::timeout(Duration::from_secs(86_400), call);
        match tokio::spawn(bounded).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => failed.push(format!("{name} (call {i}): still waiting after a day")),
            Err(error) => failed.push(format!("{name} (call {i}): {error}")),
        }
    }
    assert!(failed.is_empty(), "calls that failed: {failed:#?}");
}
