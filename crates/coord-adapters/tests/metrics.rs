//! The adapters' metrics, counted against a workload whose outcome is known.
//!
//! A local `DebuggingRecorder` (metrics::with_local_recorder) captures only
//! this thread's metrics, so tests running in parallel do not mix counts; the
//! workload runs on a current-thread runtime to stay on this thread.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::{GenericLock, GuardOptions, Lock, LockGuard, LockOptions};
use coord_adapters::sideeffect::{
    Action, EffectResult, Outcome, Runner, SideEffectAdapter, SideEffectError,
};
use coord_adapters::telemetry::*;
use coord_backend::{Backend, ManualClock, Metered, TXN_TOTAL};
use coord_conformance::support::{counters, with_recorder};
use coord_memory::SingleProcessMemoryBackend;
use metrics_util::debugging::DebuggingRecorder;

fn sum(counts: &BTreeMap<String, u64>, name: &str) -> u64 {
    counts
        .iter()
        .filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

/// The count of one series: the metric `name` with `labels` (`""`: none);
/// `None` when it was never recorded.
fn series(counts: &BTreeMap<String, u64>, name: &str, labels: &str) -> Option<u64> {
    let key = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    counts.get(&key).copied()
}

fn store(name: &str) -> Arc<dyn Backend> {
    Metered::wrap(
        "memory",
        Arc::new(SingleProcessMemoryBackend::new(name).unwrap()),
    )
}

#[test]
fn lock_metrics_count_grants_and_losses() {
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, async {
        let clock = Arc::new(ManualClock::starting_now());
        let lock = GenericLock::with_options(
            store("lock-metrics"),
            LockOptions::default().with_clock(clock.clone()),
        );
        let ttl = Duration::from_secs(10);
        let first = lock.try_lock("a", ttl).await.unwrap().unwrap();
        assert!(lock.try_lock("a", ttl).await.unwrap().is_none());
        clock.advance(Duration::from_secs(11));
        let second = lock.try_lock("a", ttl).await.unwrap().unwrap();
        // The first holder learns it lost the lock: one loss, taken over.
        assert!(lock.renew(&first).await.unwrap_err().is_lost());
        lock.release(second).await.unwrap();
        let third = lock.try_lock("b", ttl).await.unwrap().unwrap();
        lock.release(third).await.unwrap();
    });
    let counts = counters(&recorder);
    assert_eq!(
        series(&counts, LOCK_ACQUIRED_TOTAL, ""),
        Some(3),
        "{counts:#?}"
    );
    assert_eq!(
        series(&counts, LOCK_LOST_TOTAL, "reason=taken_over"),
        Some(1),
        "{counts:#?}"
    );
    assert_eq!(sum(&counts, LOCK_LOST_TOTAL), 1, "{counts:#?}");
    // Every txn the engine sent went through the metered store, and the other way round.
    let attempts = sum(&counts, CAS_ATTEMPTS_TOTAL);
    assert!(attempts >= 5, "{counts:#?}");
    assert_eq!(attempts, sum(&counts, TXN_TOTAL), "{counts:#?}");
    assert_eq!(
        sum(&counts, CAS_CONFLICTS_TOTAL),
        series(&counts, TXN_TOTAL, "store=memory,outcome=rejected").unwrap_or(0),
        "{counts:#?}"
    );
}

#[test]
fn a_guard_that_loses_its_lock_counts_one_loss() {
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, async {
        let clock = Arc::new(ManualClock::starting_now());
        let lock: Arc<dyn Lock> = Arc::new(GenericLock::with_options(
            store("guard-metrics"),
            LockOptions::default().with_clock(clock.clone()),
        ));
        let handle = lock
            .try_lock("g", Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        // Another holder takes over (the store's clock says the lease ran
        // out), so the guard's next renewal answers Lost.
        clock.advance(Duration::from_secs(6));
        let other = lock
            .try_lock("g", Duration::from_secs(10))
            .await
            .unwrap()
            .unwrap();
        let guard = LockGuard::new(
            lock.clone(),
            handle,
            GuardOptions::default().with_renew_every(Duration::from_millis(10)),
        );
        let lost = guard.lost().await;
        assert!(lost.is_lost(), "{lost}");
        drop(guard);
        lock.release(other).await.unwrap();
    });
    let counts = counters(&recorder);
    assert_eq!(
        series(&counts, LOCK_ACQUIRED_TOTAL, ""),
        Some(2),
        "{counts:#?}"
    );
    // Counted once: by the lock's renew, not again by the guard.
    assert_eq!(sum(&counts, LOCK_LOST_TOTAL), 1, "{counts:#?}");
}

#[test]
fn sideeffect_metrics_count_each_outcome() {
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, async {
        let runner = Runner::new(Arc::new(SideEffectAdapter::new(store("se-metrics"))));
        let ttl = Duration::from_secs(30);
        let ok = Action::new("refund/1", "payments");
        let ran = runner
            .execute(&ok, ttl, |_| async {
                Ok::<_, std::io::Error>(EffectResult::from("r"))
            })
            .await
            .unwrap();
        assert_eq!(ran.outcome, Outcome::Applied);
        let again = runner
            .execute(&ok, ttl, |_| async {
                Ok::<_, std::io::Error>(EffectResult::from("x"))
            })
            .await
            .unwrap();
        assert_eq!(again.outcome, Outcome::Replayed);
        let failing = Action::new("refund/2", "payments");
        let error = runner
            .execute(&failing, ttl, |_| async {
                Err::<EffectResult, _>(std::io::Error::other("timeout"))
            })
            .await
            .unwrap_err();
        assert!(
            matches!(error, SideEffectError::OutcomeUnknown { .. }),
            "{error}"
        );
        let blocked = runner
            .execute(&failing, ttl, |_| async {
                Ok::<_, std::io::Error>(EffectResult::from("r"))
            })
            .await
            .unwrap();
        assert_eq!(blocked.outcome, Outcome::Uncertain);
    });
    let counts = counters(&recorder);
    for outcome in ["applied", "replayed", "outcome_unknown", "uncertain"] {
        assert_eq!(
            series(&counts, SIDEEFFECT_TOTAL, &format!("outcome={outcome}")),
            Some(1),
            "{outcome}: {counts:#?}"
        );
    }
    assert_eq!(sum(&counts, SIDEEFFECT_TOTAL), 4, "{counts:#?}");
    assert_eq!(
        sum(&counts, CAS_ATTEMPTS_TOTAL),
        sum(&counts, TXN_TOTAL),
        "{counts:#?}"
    );
}

#[test]
fn rwlock_and_election_metrics_count_grants_wins_and_losses() {
    use coord_adapters::election::{Election, ElectionError, ElectionOptions, GenericElection};
    use coord_adapters::rwlock::{GenericRwLock, RwLock, RwLockOptions};
    use coord_adapters::LockError;
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, async {
        let clock = Arc::new(ManualClock::starting_now());
        let ttl = Duration::from_secs(10);
        let rw = GenericRwLock::with_options(
            store("rw-metrics"),
            RwLockOptions::default().with_clock(clock.clone()),
        );
        let r1 = rw.try_read("k", ttl).await.unwrap().unwrap();
        let _r2 = rw.read("k", ttl, Duration::from_secs(1)).await.unwrap();
        assert!(rw.try_write("k", ttl).await.unwrap().is_none());
        clock.advance(Duration::from_secs(11));
        let _w = rw.try_write("k", ttl).await.unwrap().unwrap();
        assert!(matches!(rw.renew(&r1).await, Err(LockError::Lost { .. })));

        let election = GenericElection::with_options(
            store("election-metrics"),
            ElectionOptions::default().with_clock(clock.clone()),
        );
        let first = election
            .try_campaign("leader", "a", "v", ttl)
            .await
            .unwrap()
            .unwrap();
        assert!(election
            .try_campaign("leader", "b", "v", ttl)
            .await
            .unwrap()
            .is_none());
        clock.advance(Duration::from_secs(11));
        let second = election
            .try_campaign("leader", "b", "v", ttl)
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(
            election.renew(&first).await,
            Err(ElectionError::Lost { .. })
        ));
        assert!(matches!(
            election.proclaim(&first, "w").await,
            Err(ElectionError::Lost { .. })
        ));
        election.renew(&second).await.unwrap();
    });
    let counts = counters(&recorder);
    assert_eq!(
        series(&counts, "coord_rwlock_acquired_total", "mode=read"),
        Some(2),
        "{counts:?}"
    );
    assert_eq!(
        series(&counts, "coord_rwlock_acquired_total", "mode=write"),
        Some(1),
        "{counts:?}"
    );
    assert_eq!(sum(&counts, RWLOCK_LOST_TOTAL), 1, "{counts:?}");
    assert_eq!(
        series(&counts, "coord_election_won_total", ""),
        Some(2),
        "{counts:?}"
    );
    assert_eq!(
        series(&counts, "coord_election_lost_total", "reason=taken_over"),
        Some(2),
        "{counts:?}"
    );
}
