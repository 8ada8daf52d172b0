//! `coord_scheduler_runs_total{result}` counted against the ticks that ran.
//!
//! A local `DebuggingRecorder` (metrics::with_local_recorder) sees only this
//! thread; the scheduler runs on a current-thread runtime, so its spawned
//! runs stay on this thread too.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{ManualClock, Metered};
use coord_conformance::support::{counters, with_recorder};
use coord_memory::SingleProcessMemoryBackend;
use coord_scheduler::telemetry::SCHEDULER_RUNS_TOTAL;
use coord_scheduler::{
    handler, ClaimRequest, Job, JobOptions, RunContext, RunStore, RunStoreOptions, Schedule,
    Scheduler, SchedulerOptions, SlotStore, TickAction, TickReport,
};
use metrics_util::debugging::DebuggingRecorder;

const T0: u64 = 1_700_000_000_000;

/// `coord_scheduler_runs_total` by its `result` label.
fn runs_by_result(recorder: &DebuggingRecorder) -> BTreeMap<String, u64> {
    let prefix = format!("{SCHEDULER_RUNS_TOTAL}{{result=");
    counters(recorder)
        .into_iter()
        .filter_map(|(name, n)| {
            Some((name.strip_prefix(&prefix)?.strip_suffix('}')?.to_owned(), n))
        })
        .collect()
}

/// A run store over a metered memory store of its own, judged by `clock`.
fn metered_run_store(namespace: &str, clock: &Arc<ManualClock>) -> Arc<RunStore> {
    let backend = Metered::wrap(
        "memory",
        Arc::new(SingleProcessMemoryBackend::new(namespace).unwrap()),
    );
    Arc::new(RunStore::new(backend, clock.clone(), RunStoreOptions::default()).unwrap())
}

#[test]
fn runs_total_counts_started_skipped_and_failed_slots() {
    let recorder = DebuggingRecorder::new();
    let failures = Arc::new(AtomicU64::new(0));
    let mut reports: Vec<TickReport> = Vec::new();
    with_recorder(&recorder, async {
        let clock = Arc::new(ManualClock::at_millis(T0));
        let store = metered_run_store("sched-metrics", &clock);
        let scheduler = Scheduler::new(Some(store), clock.clone(), SchedulerOptions::instance("a"));
        let failed = failures.clone();
        // Odd seconds fail: some runs succeed, some fail.
        let job = Job::new(
            "metered",
            Schedule::every(Duration::from_secs(1)).unwrap(),
            handler(move |ctx: RunContext| {
                let failed = failed.clone();
                async move {
                    if (ctx.slot / 1000) % 2 == 1 {
                        failed.fetch_add(1, Ordering::SeqCst);
                        return Err("odd second".into());
                    }
                    Ok(())
                }
            }),
        )
        .with_options(
            JobOptions::default()
                .with_max_late(Duration::from_millis(1500))
                .with_allow_overlap(true),
        );
        scheduler.add_job(job).unwrap();
        reports.push(scheduler.tick_at(T0).await);
        scheduler.wait_idle().await;
        // Five seconds later: the oldest slots are too late, the newest run.
        clock.advance(Duration::from_secs(5));
        reports.push(scheduler.tick_at(T0 + 5_000).await);
        scheduler.wait_idle().await;
        scheduler.shutdown().await;
    });
    let events: Vec<&TickAction> = reports
        .iter()
        .flat_map(|r| r.events.iter().map(|e| &e.action))
        .collect();
    let started = events
        .iter()
        .filter(|a| matches!(a, TickAction::Started { .. }))
        .count() as u64;
    let late = events
        .iter()
        .filter(|a| matches!(a, TickAction::Late { .. }))
        .count() as u64;
    let failed = failures.load(Ordering::SeqCst);
    // The workload must have produced every kind counted below.
    assert!(started >= 3 && late >= 2 && failed >= 1, "{events:?}");
    let counts = runs_by_result(&recorder);
    assert_eq!(counts.get("ran").copied(), Some(started), "{counts:?}");
    assert_eq!(
        counts.get("skipped_late").copied(),
        Some(late),
        "{counts:?}"
    );
    assert_eq!(counts.get("failed").copied(), Some(failed), "{counts:?}");
    assert_eq!(counts.get("takeover"), None, "{counts:?}");
}

#[test]
fn a_slot_taken_over_from_a_dead_holder_counts_as_takeover() {
    let recorder = DebuggingRecorder::new();
    let mut took_over = false;
    with_recorder(&recorder, async {
        let clock = Arc::new(ManualClock::at_millis(T0));
        let store = metered_run_store("sched-takeover", &clock);
        let lease = Duration::from_millis(100);
        // A holder that claimed slot T0 and died.
        let dead = ClaimRequest::new("adopted", T0, "dead-token", "dead", lease);
        assert!(store.claim(&dead).await.unwrap().won);
        clock.advance(Duration::from_millis(500));
        let scheduler = Scheduler::new(
            Some(store),
            clock.clone(),
            SchedulerOptions::instance("heir"),
        );
        let job = Job::new(
            "adopted",
            Schedule::every(Duration::from_secs(1)).unwrap(),
            handler(|_: RunContext| async { Ok(()) }),
        )
        .with_options(
            JobOptions::default()
                .with_lease_ttl(lease)
                .with_max_late(Duration::from_secs(1)),
        );
        scheduler.add_job(job).unwrap();
        // The heir follows the dead lease for a full lease on its own
        // monotonic clock, then takes the slot over.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::time::Instant::now() < deadline {
            let report = scheduler.tick_at(T0 + 500).await;
            if report
                .events
                .iter()
                .any(|e| matches!(e.action, TickAction::Started { takeover: true, .. }))
            {
                took_over = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        scheduler.wait_idle().await;
        scheduler.shutdown().await;
    });
    assert!(took_over, "the slot was never taken over");
    let counts = runs_by_result(&recorder);
    assert_eq!(counts.get("takeover").copied(), Some(1), "{counts:?}");
    assert_eq!(counts.get("ran"), None, "{counts:?}");
}
