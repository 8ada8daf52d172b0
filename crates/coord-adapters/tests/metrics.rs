//! The adapters' metrics, counted against a workload whose outcome is known.
//!
//! A local `DebuggingRecorder` (metrics::with_local_recorder) captures only
//! this thread's metrics, so tests running in parallel do not mix counts; the
//! workload runs on a current-thread runtime to stay on this thread.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::{GenericLock, GuardOptions, Lock, LockGuard, LockOptions};
use coord_adapters::sideeffect::{
    Action, EffectResult, Execution, Outcome, Runner, SideEffectAdapter, SideEffectError,
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

/// Check that the series `name{labels}` counted `expected`.
#[track_caller]
fn assert_series(counts: &BTreeMap<String, u64>, name: &str, labels: &str, expected: u64) {
    assert_eq!(
        series(counts, name, labels),
        Some(expected),
        "{name}{{{labels}}}: {counts:#?}"
    );
}

/// Every counter `workload` records, run on this thread (see `with_recorder`).
fn count(workload: impl Future<Output = ()>) -> BTreeMap<String, u64> {
    let recorder = DebuggingRecorder::new();
    with_recorder(&recorder, workload);
    counters(&recorder)
}

/// `runner` executes `action` with an effect that answers `effect` (an
/// `Err` is the effect failing, its outcome unknown).
async fn execute(
    runner: &Runner,
    action: &Action,
    effect: Result<&'static str, &'static str>,
) -> Result<Execution, SideEffectError> {
    runner
        .execute(action, Duration::from_secs(30), |_| async move {
            effect
                .map(EffectResult::from)
                .map_err(std::io::Error::other)
        })
        .await
}

fn store(name: &str) -> Arc<dyn Backend> {
    Metered::wrap(
        "memory",
        Arc::new(SingleProcessMemoryBackend::new(name).unwrap()),
    )
}

#[test]
fn lock_metrics_count_grants_and_losses() {
    let counts = count(async {
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
    assert_series(&counts, LOCK_ACQUIRED_TOTAL, "", 3);
    assert_series(&counts, LOCK_LOST_TOTAL, "reason=taken_over", 1);
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
    let counts = count(async {
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
    assert_series(&counts, LOCK_ACQUIRED_TOTAL, "", 2);
    // Counted once: by the lock's renew, not again by the guard.
    assert_eq!(sum(&counts, LOCK_LOST_TOTAL), 1, "{counts:#?}");
}

#[test]
fn sideeffect_metrics_count_each_outcome() {
    let counts = count(async {
        let runner = Runner::new(Arc::new(SideEffectAdapter::new(store("se-metrics"))));
        let ok = Action::new("refund/1", "payments");
        let ran = execute(&runner, &ok, Ok("r")).await.unwrap();
        assert_eq!(ran.outcome, Outcome::Applied);
        let again = execute(&runner, &ok, Ok("x")).await.unwrap();
        assert_eq!(again.outcome, Outcome::Replayed);
        let failing = Action::new("refund/2", "payments");
        let error = execute(&runner, &failing, Err("timeout"))
            .await
            .unwrap_err();
        assert!(
            matches!(error, SideEffectError::OutcomeUnknown { .. }),
            "{error}"
        );
        let blocked = execute(&runner, &failing, Ok("r")).await.unwrap();
        assert_eq!(blocked.outcome, Outcome::Uncertain);
    });
    for outcome in ["applied", "replayed", "outcome_unknown", "uncertain"] {
        assert_series(&counts, SIDEEFFECT_TOTAL, &format!("outcome={outcome}"), 1);
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
    let counts = count(async {
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
    assert_series(&counts, "coord_rwlock_acquired_total", "mode=read", 2);
    assert_series(&counts, "coord_rwlock_acquired_total", "mode=write", 1);
    assert_eq!(sum(&counts, RWLOCK_LOST_TOTAL), 1, "{counts:?}");
    assert_series(&counts, "coord_election_won_total", "", 2);
    assert_series(&counts, "coord_election_lost_total", "reason=taken_over", 2);
}

/// Every gauge `recorder` saw: `name{label=value,...}` → its value.
fn gauges(recorder: &DebuggingRecorder) -> BTreeMap<String, f64> {
    use metrics_util::debugging::DebugValue;
    let mut out = BTreeMap::new();
    for (key, _, _, value) in recorder.snapshotter().snapshot().into_vec() {
        if let DebugValue::Gauge(v) = value {
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
            out.insert(name, v.into_inner());
        }
    }
    out
}

/// `refresh_queue_metrics` sets each queue's gauges from its index: ready,
/// timed, depth, dead, the oldest ready task's age, and the truncated flags
/// (a limit of 1 cuts the listings of a queue of 2 ready tasks).
#[test]
fn queue_gauges_follow_each_queue() {
    use coord_adapters::board::{Board, BoardAdapter, BoardOptions, RetryPolicy, TaskSpec};
    let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
    let board = BoardAdapter::with_options(
        store("queue_gauges"),
        BoardOptions::default().with_clock(clock.clone()),
    );
    let recorder = DebuggingRecorder::new();
    let cut = with_recorder(&recorder, async {
        let once = RetryPolicy::attempts(1);
        board
            .add(TaskSpec::new("a", vec![]).in_queue("mail"))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(3));
        board
            .add(TaskSpec::new("b", vec![]).in_queue("mail"))
            .await
            .unwrap();
        board
            .add(TaskSpec::new("x", vec![]).in_queue("sms").with_retry(once))
            .await
            .unwrap();
        board
            .add(TaskSpec::new("y", vec![]).in_queue("sms"))
            .await
            .unwrap();
        let ttl = Duration::from_secs(60);
        let x = board.claim("x", "w", ttl).await.unwrap();
        board.fail("x", &x.token, "bounced").await.unwrap();
        board.claim("y", "w", ttl).await.unwrap();
        let all = board.refresh_queue_metrics(10, 100).await.unwrap();
        assert_eq!(all.queues.len(), 2);
        assert!(!all.more);
        let snapshot = gauges(&recorder);
        // Cut: at most 1 queue, at most 1 key per listing.
        let cut = board.refresh_queue_metrics(1, 1).await.unwrap();
        (snapshot, cut)
    });
    let (seen, cut) = cut;
    let expect = [
        ("coord_queue_ready{queue=mail}", 2.0),
        ("coord_queue_timed{queue=mail}", 0.0),
        ("coord_queue_depth{queue=mail}", 2.0),
        ("coord_queue_dead{queue=mail}", 0.0),
        ("coord_queue_oldest_ready_seconds{queue=mail}", 3.0),
        ("coord_queue_truncated{queue=mail}", 0.0),
        ("coord_queue_ready{queue=sms}", 0.0),
        ("coord_queue_timed{queue=sms}", 1.0),
        ("coord_queue_depth{queue=sms}", 1.0),
        ("coord_queue_dead{queue=sms}", 1.0),
        ("coord_queue_oldest_ready_seconds{queue=sms}", 0.0),
        ("coord_queues_truncated", 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(seen.get(series), Some(&value), "{series}: {seen:#?}");
    }
    assert!(cut.more && cut.queues.len() == 1, "{cut:?}");
    let after = gauges(&recorder);
    assert_eq!(after.get("coord_queues_truncated"), Some(&1.0));
    assert_eq!(after.get("coord_queue_truncated{queue=mail}"), Some(&1.0));
    assert_eq!(after.get("coord_queue_ready{queue=mail}"), Some(&1.0));
}
