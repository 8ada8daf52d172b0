//! The scheduler suite on the in-process memory store; proof that it goes red
//! on broken run stores (a check that cannot fail is a defect); and tests of
//! the scheduler runtime driven by a `ManualClock` (catch-up, skips,
//! `run_now`, DST, clock jumps, takeover, shutdown, `LockingHint` with a
//! broken store).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use coord_backend::{
    Assert, Backend, Clock, Entry, ManualClock, Mutation, SystemClock, TxnOutcome,
};
use coord_conformance::scheduler::{self as suite, run_store_maker, SchedulerEnv, StoreMaker};
use coord_conformance::{factory, unique_namespace, BackendFactory, CheckResult};
use coord_memory::SingleProcessMemoryBackend;
use coord_scheduler::{
    handler, ActiveRun, Claim, ClaimRequest, Error, FinalStatus, Handler, Job, JobOptions, Lease,
    LockingHint, ManualRun, RunRecord, RunStatus, RunStore, RunStoreOptions, Schedule, Scheduler,
    SchedulerOptions, SkipReason, Slot, SlotStore, TickAction,
};

fn memory() -> BackendFactory {
    factory(|namespace| async move {
        Ok(Arc::new(SingleProcessMemoryBackend::shared(&namespace)?) as Arc<dyn Backend>)
    })
}

mod memory_suite {
    coord_conformance::scheduler_tests!(super::memory());
}

// ---------------------------------------------------------------------------
// Broken stores: each must turn the relevant checks red.
// ---------------------------------------------------------------------------

/// A store whose txn ignores its asserts: every decision becomes
/// read-then-write (the classic bug of seed 002's sequence diagram).
#[derive(Debug)]
struct NonAtomicBackend(SingleProcessMemoryBackend);

#[async_trait]
impl Backend for NonAtomicBackend {
    fn namespace(&self) -> &str {
        self.0.namespace()
    }
    async fn snapshot(&self, keys: &[String]) -> coord_backend::Result<Vec<Entry>> {
        self.0.snapshot(keys).await
    }
    async fn txn(
        &self,
        _asserts: &[Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<TxnOutcome> {
        self.0.txn(&[], mutations).await
    }
    async fn keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.0.keys(prefix).await
    }
}

fn non_atomic() -> BackendFactory {
    factory(|namespace| async move {
        Ok(
            Arc::new(NonAtomicBackend(SingleProcessMemoryBackend::shared(
                &namespace,
            )?)) as Arc<dyn Backend>,
        )
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Claim replaces the caller's token with a fresh one (not retry-safe).
    FreshTokenPerClaim,
    /// Heartbeat / finish / release use the holder's token, whoever calls.
    UncheckedOwner,
    /// Claim always allows overlap.
    IgnoresOverlap,
    /// History comes back oldest first.
    OldestFirst,
    /// Claims to remember forever while configured to forget.
    HidesWindow,
    /// Reports every skip as recorded by this call.
    SkipAlwaysRecorded,
    /// Drops a second manual run at the same instant.
    DedupesManual,
    /// None: the double must pass everything.
    Honest,
}

#[derive(Debug)]
struct Broken {
    inner: RunStore,
    flaw: Flaw,
    /// Winning tokens, shared by every client of one maker (UncheckedOwner).
    holders: Arc<Mutex<HashMap<(String, Slot), String>>>,
}

impl Broken {
    fn token(&self, job: &str, slot: Slot, token: &str) -> String {
        if self.flaw == Flaw::UncheckedOwner {
            let holders = self.holders.lock().unwrap();
            if let Some(t) = holders.get(&(job.to_owned(), slot)) {
                return t.clone();
            }
        }
        token.to_owned()
    }
}

#[async_trait]
impl SlotStore for Broken {
    fn dedupe_window(&self) -> Option<Duration> {
        match self.flaw {
            Flaw::HidesWindow => None,
            _ => self.inner.dedupe_window(),
        }
    }
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, Error> {
        let mut request = request.clone();
        match self.flaw {
            Flaw::FreshTokenPerClaim => request.token = coord_adapters::mint_token(),
            Flaw::IgnoresOverlap => request.allow_overlap = true,
            _ => {}
        }
        let claim = self.inner.claim(&request).await?;
        if claim.won {
            let mut holders = self.holders.lock().unwrap();
            holders.insert((request.job.clone(), request.slot), request.token.clone());
        }
        Ok(claim)
    }
    async fn heartbeat(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        ttl: Duration,
    ) -> Result<Lease, Error> {
        self.inner
            .heartbeat(job, slot, &self.token(job, slot, token), ttl)
            .await
    }
    async fn finish(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        status: FinalStatus,
    ) -> Result<(), Error> {
        self.inner
            .finish(job, slot, &self.token(job, slot, token), status)
            .await
    }
    async fn release(&self, job: &str, slot: Slot, token: &str) -> Result<(), Error> {
        self.inner
            .release(job, slot, &self.token(job, slot, token))
            .await
    }
    async fn active(&self, job: &str) -> Result<Vec<ActiveRun>, Error> {
        self.inner.active(job).await
    }
    async fn record_manual(&self, run: &ManualRun) -> Result<(), Error> {
        if self.flaw == Flaw::DedupesManual {
            let history = self.inner.history(&run.job, 1_000).await?;
            if history.iter().any(|r| r.manual && r.slot == run.slot) {
                return Ok(());
            }
        }
        self.inner.record_manual(run).await
    }
    async fn record_skip(
        &self,
        job: &str,
        slot: Slot,
        instance: &str,
        reason: SkipReason,
    ) -> Result<bool, Error> {
        let recorded = self.inner.record_skip(job, slot, instance, reason).await?;
        Ok(recorded || self.flaw == Flaw::SkipAlwaysRecorded)
    }
    async fn history(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>, Error> {
        let mut all = self.inner.history(job, usize::MAX).await?;
        if self.flaw == Flaw::OldestFirst {
            all.reverse();
        }
        all.truncate(limit);
        Ok(all)
    }
}

fn broken(flaw: Flaw) -> SchedulerEnv {
    let holders = Arc::new(Mutex::new(HashMap::new()));
    let maker: StoreMaker = Arc::new(move |backend, clock, options| {
        Ok(Arc::new(Broken {
            inner: RunStore::new(backend, clock, options)?,
            flaw,
            holders: holders.clone(),
        }) as Arc<dyn SlotStore>)
    });
    SchedulerEnv::new(memory()).with_stores(maker)
}

/// Every check of the suite by name, runnable on any env.
async fn run_check(name: &str, env: &SchedulerEnv) -> CheckResult {
    match name {
        "claim_race" => suite::claim_race(env, 8, 5).await,
        "repeat_safety" => suite::repeat_safety(env).await,
        "history_newest_first" => suite::history_newest_first(env).await,
        "heartbeat_ownership" => suite::heartbeat_ownership(env).await,
        "takeover_after_expiry" => suite::takeover_after_expiry(env).await,
        "overlap_protection" => suite::overlap_protection(env).await,
        "finish_release_by_token" => suite::finish_release_by_token(env).await,
        "skip_recorded_once" => suite::skip_recorded_once(env).await,
        "manual_runs_not_deduplicated" => suite::manual_runs_not_deduplicated(env).await,
        "dedupe_window_refusal" => suite::dedupe_window_refusal(env).await,
        other => panic!("unknown check {other}"),
    }
}

async fn assert_red(env: &SchedulerEnv, what: &str, checks: &[&str]) {
    for check in checks {
        let result = run_check(check, env).await;
        assert!(result.is_err(), "{check} stayed green on {what}");
        eprintln!("{what}: {check} red as expected: {}", result.unwrap_err());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_check_runs_through_the_name_table() {
    // The table above must cover the suite, and the honest double passes it all.
    let env = broken(Flaw::Honest);
    for case in suite::cases() {
        run_check(case.name, &env)
            .await
            .unwrap_or_else(|f| panic!("{} failed on the honest double: {f}", case.name));
    }
    let _ = run_store_maker();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn red_on_a_read_then_write_claim() {
    assert_red(
        &SchedulerEnv::new(non_atomic()),
        "a store whose txn ignores asserts",
        &["claim_race", "repeat_safety"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn red_on_a_claim_that_ignores_the_token() {
    assert_red(
        &broken(Flaw::FreshTokenPerClaim),
        "a claim that ignores the token",
        &["repeat_safety"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn red_on_unchecked_ownership() {
    assert_red(
        &broken(Flaw::UncheckedOwner),
        "heartbeat/finish/release without an ownership check",
        &[
            "heartbeat_ownership",
            "takeover_after_expiry",
            "finish_release_by_token",
        ],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn red_on_the_other_flaws() {
    assert_red(
        &broken(Flaw::IgnoresOverlap),
        "a claim without overlap check",
        &["overlap_protection"],
    )
    .await;
    assert_red(
        &broken(Flaw::OldestFirst),
        "history oldest first",
        &["history_newest_first"],
    )
    .await;
    assert_red(
        &broken(Flaw::HidesWindow),
        "a store hiding its dedupe window",
        &["dedupe_window_refusal"],
    )
    .await;
    assert_red(
        &broken(Flaw::SkipAlwaysRecorded),
        "skips recorded twice",
        &["skip_recorded_once"],
    )
    .await;
    assert_red(
        &broken(Flaw::DedupesManual),
        "deduplicated manual runs",
        &["manual_runs_not_deduplicated"],
    )
    .await;
}

// ---------------------------------------------------------------------------
// The runtime, driven by a ManualClock.
// ---------------------------------------------------------------------------

const SEC: u64 = 1_000;
const MIN: u64 = 60 * SEC;
const HOUR: u64 = 60 * MIN;
/// 2023-11-14T22:13:20Z: a round instant, far from any DST change (runs are in UTC anyway).
const T0: u64 = 1_700_000_000_000;

type RunLog = Arc<Mutex<Vec<(String, Slot, bool)>>>;

fn recorder(log: &RunLog, instance: &str) -> Handler {
    let log = log.clone();
    let instance = instance.to_owned();
    handler(move |ctx| {
        let log = log.clone();
        let instance = instance.clone();
        async move {
            log.lock().unwrap().push((instance, ctx.slot, ctx.manual));
            Ok(())
        }
    })
}

fn slots_run(log: &RunLog) -> BTreeMap<Slot, usize> {
    let mut counts = BTreeMap::new();
    for (_, slot, manual) in log.lock().unwrap().iter() {
        if !manual {
            *counts.entry(*slot).or_insert(0) += 1;
        }
    }
    counts
}

struct Instance {
    scheduler: Scheduler,
    clock: Arc<ManualClock>,
    store: Arc<dyn SlotStore>,
}

fn instance(ns: &str, name: &str, start_ms: u64) -> Instance {
    let clock = Arc::new(ManualClock::at_millis(start_ms));
    let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::shared(ns).unwrap());
    let store: Arc<dyn SlotStore> =
        Arc::new(RunStore::new(backend, clock.clone(), RunStoreOptions::default()).unwrap());
    let scheduler = Scheduler::new(
        Some(store.clone()),
        clock.clone(),
        SchedulerOptions::instance(name),
    );
    Instance {
        scheduler,
        clock,
        store,
    }
}

impl Instance {
    async fn tick_to(&self, ms: u64) -> coord_scheduler::TickReport {
        self.clock.set(UNIX_EPOCH + Duration::from_millis(ms));
        let report = self.scheduler.tick_at(ms).await;
        self.scheduler.wait_idle().await;
        report
    }
}

fn every(period: &str, options: JobOptions, h: Handler) -> Job {
    Job::new("job", Schedule::parse(period, None).unwrap(), h).with_options(options)
}

#[tokio::test]
async fn catches_up_within_max_late_and_records_older_slots_as_skipped() {
    let ns = unique_namespace("catch_up");
    let log: RunLog = Arc::default();
    let a = instance(&ns, "a", T0);
    let opts = JobOptions::default()
        .max_late(Duration::from_secs(5))
        .allow_overlap(true);
    a.scheduler
        .add_job(every("every 1s", opts, recorder(&log, "a")))
        .unwrap();

    // Started 10.5 s after T0: looks back max_late, runs the 5 slots inside it.
    let report = a.tick_to(T0 + 10_500).await;
    let started: Vec<Slot> = report.started().iter().map(|(_, s)| *s).collect();
    assert_eq!(started, (6..=10).map(|i| T0 + i * SEC).collect::<Vec<_>>());

    // A 10 s stall: slots older than max_late are skipped and recorded, the rest caught up.
    let report = a.tick_to(T0 + 20_500).await;
    let late: Vec<Slot> = report
        .events
        .iter()
        .filter(|e| {
            matches!(
                e.action,
                TickAction::Late {
                    reason: SkipReason::Late,
                    recorded: true
                }
            )
        })
        .map(|e| e.slot)
        .collect();
    assert_eq!(late, (11..=15).map(|i| T0 + i * SEC).collect::<Vec<_>>());
    let started: Vec<Slot> = report.started().iter().map(|(_, s)| *s).collect();
    assert_eq!(started, (16..=20).map(|i| T0 + i * SEC).collect::<Vec<_>>());

    let history = a.store.history("job", 100).await.unwrap();
    assert_eq!(history.len(), 15);
    assert!(
        history.windows(2).all(|w| w[0].slot > w[1].slot),
        "newest first"
    );
    for record in &history {
        let want = if (T0 + 11 * SEC..=T0 + 15 * SEC).contains(&record.slot) {
            RunStatus::Skipped(SkipReason::Late)
        } else {
            RunStatus::Succeeded
        };
        assert_eq!(record.status, want, "{record:?}");
    }
    assert_eq!(slots_run(&log).values().copied().max(), Some(1));
}

#[tokio::test]
async fn a_long_gap_skips_without_listing_every_slot() {
    let ns = unique_namespace("long_gap");
    let log: RunLog = Arc::default();
    let a = instance(&ns, "a", T0);
    let opts = JobOptions::default()
        .max_late(Duration::from_secs(3))
        .allow_overlap(true);
    a.scheduler
        .add_job(every("every 1s", opts, recorder(&log, "a")))
        .unwrap();
    a.tick_to(T0).await;
    let report = a.tick_to(T0 + HOUR).await;
    let listed = report
        .events
        .iter()
        .filter(|e| matches!(e.action, TickAction::Late { .. }))
        .count();
    assert!(listed <= 20, "{listed} skips listed one by one");
    assert!(report
        .events
        .iter()
        .any(|e| matches!(e.action, TickAction::LateUnlisted { .. })));
    let started: Vec<Slot> = report.started().iter().map(|(_, s)| *s).collect();
    assert_eq!(
        started,
        (0..=3)
            .rev()
            .map(|i| T0 + HOUR - i * SEC)
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn run_now_is_recorded_and_never_deduplicated() {
    let ns = unique_namespace("run_now");
    let log: RunLog = Arc::default();
    let a = instance(&ns, "a", T0);
    let b = instance(&ns, "b", T0);
    a.scheduler
        .add_job(every(
            "every 1h",
            JobOptions::default().hint(LockingHint::RequireGlobal),
            recorder(&log, "a"),
        ))
        .unwrap();
    b.scheduler
        .add_job(every(
            "every 1h",
            JobOptions::default(),
            recorder(&log, "b"),
        ))
        .unwrap();
    let first = a.scheduler.run_now("job").await.unwrap();
    let second = b.scheduler.run_now("job").await.unwrap();
    let third = a.scheduler.run_now("job").await.unwrap();
    assert!(first.recorded && first.status == FinalStatus::Succeeded);
    assert_eq!(
        (first.slot, second.slot, third.slot),
        (T0, T0, T0),
        "same instant, three runs"
    );
    assert_eq!(log.lock().unwrap().len(), 3);
    let history = a.store.history("job", 10).await.unwrap();
    assert_eq!(history.len(), 3);
    assert!(history
        .iter()
        .all(|r| r.manual && r.status == RunStatus::Succeeded));
    assert!(matches!(
        a.scheduler.run_now("nope").await,
        Err(Error::UnknownJob(_))
    ));

    // A failing handler is recorded as failed, with its message.
    let failing = handler(|_| async { Err("disk full".into()) });
    a.scheduler
        .add_job(Job::new(
            "fails",
            Schedule::parse("every 1h", None).unwrap(),
            failing,
        ))
        .unwrap();
    let report = a.scheduler.run_now("fails").await.unwrap();
    assert_eq!(report.status, FinalStatus::Failed("disk full".into()));
    let history = a.store.history("fails", 1).await.unwrap();
    assert_eq!(
        (history[0].status, history[0].message.as_deref()),
        (RunStatus::Failed, Some("disk full"))
    );
}

#[tokio::test]
async fn timeout_stops_the_handler_and_is_recorded() {
    let ns = unique_namespace("timeout");
    let a = instance(&ns, "a", T0);
    let slow = handler(|_| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    });
    let opts = JobOptions::default().timeout(Some(Duration::from_millis(50)));
    a.scheduler.add_job(every("every 1s", opts, slow)).unwrap();
    let report = a.tick_to(T0).await;
    assert_eq!(report.started().len(), 1);
    let history = a.store.history("job", 1).await.unwrap();
    assert_eq!(history[0].status, RunStatus::TimedOut);
}

#[tokio::test]
async fn two_instances_run_each_slot_once_and_overlap_waits() {
    let ns = unique_namespace("overlap_runtime");
    let log: RunLog = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let blocking = |instance: &str| {
        let log = log.clone();
        let gate = gate.clone();
        let instance = instance.to_owned();
        handler(move |ctx| {
            let (log, gate, instance) = (log.clone(), gate.clone(), instance.clone());
            async move {
                log.lock().unwrap().push((instance, ctx.slot, false));
                gate.acquire()
                    .await
                    .map(|p| p.forget())
                    .map_err(|e| e.to_string())?;
                Ok(())
            }
        })
    };
    let a = instance(&ns, "a", T0);
    let b = instance(&ns, "b", T0);
    let opts = JobOptions::default().max_late(Duration::from_millis(1_500));
    a.scheduler
        .add_job(every("every 1s", opts.clone(), blocking("a")))
        .unwrap();
    b.scheduler
        .add_job(every("every 1s", opts, blocking("b")))
        .unwrap();
    // First ticks look back max_late: slots T0-1s and T0 are due. One instance
    // runs T0-1s; T0 is blocked by it everywhere (no overlap).
    let ra = a.scheduler.tick_at(T0).await;
    let rb = b.scheduler.tick_at(T0).await;
    let started: Vec<Slot> = ra
        .started()
        .iter()
        .chain(rb.started().iter())
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(started, vec![T0 - SEC], "{ra:?} {rb:?}");
    for r in [&ra, &rb] {
        assert!(
            r.events.iter().any(|e| e.slot == T0
                && matches!(e.action, TickAction::Overlap { running_slot } if running_slot == T0 - SEC)),
            "{r:?}"
        );
    }
    gate.add_permits(1);
    a.scheduler.wait_idle().await;
    b.scheduler.wait_idle().await;
    // Retried on the next tick, within max_late, by exactly one instance.
    let ra = a.scheduler.tick_at(T0 + 500).await;
    let rb = b.scheduler.tick_at(T0 + 500).await;
    let both: Vec<Slot> = ra
        .started()
        .iter()
        .chain(rb.started().iter())
        .map(|(_, s)| *s)
        .collect();
    assert_eq!(both, vec![T0]);
    gate.add_permits(10);
    a.scheduler.wait_idle().await;
    b.scheduler.wait_idle().await;
    assert_eq!(slots_run(&log), BTreeMap::from([(T0 - SEC, 1), (T0, 1)]));
}

#[tokio::test]
async fn a_backup_takes_over_an_expired_lease_and_shutdown_releases() {
    let ns = unique_namespace("takeover_runtime");
    let log: RunLog = Arc::default();
    let hang = |instance: &str| {
        let log = log.clone();
        let instance = instance.to_owned();
        handler(move |ctx| {
            let (log, instance) = (log.clone(), instance.clone());
            async move {
                log.lock().unwrap().push((instance, ctx.slot, false));
                std::future::pending::<()>().await;
                Ok(())
            }
        })
    };
    let opts = JobOptions::default()
        .lease_ttl(Duration::from_secs(3_600)) // heartbeats (every ttl/3 of real time) never fire here
        .max_late(Duration::from_secs(10));
    let (a, b, c) = (
        instance(&ns, "a", T0),
        instance(&ns, "b", T0),
        instance(&ns, "c", T0),
    );
    a.scheduler
        .add_job(every("every 1h", opts.clone(), hang("a")))
        .unwrap();
    b.scheduler
        .add_job(every("every 1h", opts.clone(), hang("b")))
        .unwrap();
    c.scheduler
        .add_job(every("every 1h", opts, hang("c")))
        .unwrap();
    let slot = Schedule::parse("every 1h", None)
        .unwrap()
        .next_after(T0)
        .unwrap();
    for i in [&a, &b, &c] {
        i.clock.set(UNIX_EPOCH + Duration::from_millis(slot));
    }
    assert_eq!(a.scheduler.tick_at(slot).await.started().len(), 1);
    for backup in [&b, &c] {
        let r = backup.scheduler.tick_at(slot).await;
        assert!(
            matches!(r.events[0].action, TickAction::HeldElsewhere { .. }),
            "{r:?}"
        );
    }

    // a stalls past its lease (no heartbeat): b takes the slot over when it looks again.
    let later = slot + HOUR + 5 * SEC; // the lease was 1 h; also the next slot is due
    b.clock.set(UNIX_EPOCH + Duration::from_millis(later));
    let rb = b.scheduler.tick_at(later).await;
    let takeover = rb
        .events
        .iter()
        .find(|e| e.slot == slot)
        .expect("slot looked at again");
    assert_eq!(
        takeover.action,
        TickAction::Started {
            takeover: true,
            coordinated: true
        }
    );
    let history = b.store.history("job", 10).await.unwrap();
    let record = history.iter().find(|r| r.slot == slot).unwrap();
    assert_eq!((record.instance.as_str(), record.takeovers), ("b", 1));

    // Graceful shutdown of b releases its leases: c takes them over at once.
    b.scheduler.shutdown().await;
    c.clock.set(UNIX_EPOCH + Duration::from_millis(later));
    let rc = c.scheduler.tick_at(later).await;
    let taken: Vec<Slot> = rc
        .events
        .iter()
        .filter(|e| {
            e.action
                == TickAction::Started {
                    takeover: true,
                    coordinated: true,
                }
        })
        .map(|e| e.slot)
        .collect();
    assert!(taken.contains(&slot), "{rc:?}");
    assert!(
        b.scheduler.tick_at(later).await.events.is_empty(),
        "a shut-down scheduler does nothing"
    );
    assert!(matches!(
        b.scheduler.run_now("job").await,
        Err(Error::ShutDown)
    ));
    a.scheduler.shutdown().await;
    c.scheduler.shutdown().await;
    let history = c.store.history("job", 10).await.unwrap();
    assert!(
        history.iter().all(|r| r.status == RunStatus::Released),
        "{history:?}"
    );
}

/// Tick two instances every 15 minutes across a DST change of New York.
async fn dst_runs(schedule: &str, from: u64, to: u64) -> (Vec<Slot>, BTreeMap<Slot, usize>) {
    let ns = unique_namespace("dst");
    let log: RunLog = Arc::default();
    let (a, b) = (instance(&ns, "a", from), instance(&ns, "b", from));
    for (i, name) in [(&a, "a"), (&b, "b")] {
        let job = Job::new(
            "nightly",
            Schedule::parse(schedule, Some("America/New_York")).unwrap(),
            recorder(&log, name),
        )
        .with_options(JobOptions::default().max_late(Duration::from_secs(600)));
        i.scheduler.add_job(job).unwrap();
    }
    let mut now = from;
    while now <= to {
        a.tick_to(now).await;
        b.tick_to(now + 7 * SEC).await;
        now += 15 * MIN;
    }
    let history: Vec<Slot> = a
        .store
        .history("nightly", 50)
        .await
        .unwrap()
        .iter()
        .map(|r| r.slot)
        .collect();
    (history, slots_run(&log))
}

#[tokio::test]
async fn dst_fall_back_does_not_double_fire() {
    // 2025-11-02 01:30 happens twice in New York (EDT, then EST).
    let from = 1_761_955_200_000; // 2025-11-01T00:00Z
    let (history, runs) = dst_runs("0 30 1 * * *", from, from + 3 * 24 * HOUR).await;
    let nov = |d: u64, h: u64| from + (d - 1) * 24 * HOUR + h * HOUR + 30 * MIN;
    assert_eq!(history, vec![nov(3, 6), nov(2, 5), nov(1, 5)]);
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
}

#[tokio::test]
async fn dst_spring_forward_runs_once_after_the_gap() {
    // 2025-03-09 02:30 does not exist in New York: the run moves to 03:00 EDT (07:00Z).
    let from = 1_741_392_000_000; // 2025-03-08T00:00Z
    let (history, runs) = dst_runs("0 30 2 * * *", from, from + 3 * 24 * HOUR).await;
    let day = |d: u64| from + (d - 8) * 24 * HOUR;
    assert_eq!(
        history,
        vec![
            day(10) + 6 * HOUR + 30 * MIN,
            day(9) + 7 * HOUR,
            day(8) + 7 * HOUR + 30 * MIN
        ]
    );
    assert!(runs.values().all(|n| *n == 1), "{runs:?}");
}

#[tokio::test]
async fn a_clock_jump_on_one_instance_never_runs_a_slot_twice() {
    let ns = unique_namespace("clock_jump");
    let log: RunLog = Arc::default();
    let (a, b) = (instance(&ns, "a", T0), instance(&ns, "b", T0));
    let opts = JobOptions::default().max_late(Duration::from_secs(120));
    a.scheduler
        .add_job(every("every 1m", opts.clone(), recorder(&log, "a")))
        .unwrap();
    b.scheduler
        .add_job(every("every 1m", opts, recorder(&log, "b")))
        .unwrap();
    let start = T0 - T0 % MIN;
    let mut real = start;
    // Normal operation for 10 minutes.
    while real < start + 10 * MIN {
        a.tick_to(real).await;
        b.tick_to(real + SEC).await;
        real += 20 * SEC;
    }
    // a's clock jumps back one hour for 10 minutes: it re-lives slots already run.
    while real < start + 20 * MIN {
        a.tick_to(real - HOUR).await;
        b.tick_to(real + SEC).await;
        real += 20 * SEC;
    }
    // A restarted instance whose clock is an hour behind re-examines old slots: all done.
    let c = instance(&ns, "c", real);
    let looks_back = JobOptions::default().max_late(Duration::from_secs(20 * 60));
    c.scheduler
        .add_job(every("every 1m", looks_back, recorder(&log, "c")))
        .unwrap();
    let report = c.tick_to(real - SEC).await;
    assert!(report.events.len() >= 19, "{report:?}");
    assert!(
        report
            .events
            .iter()
            .all(|e| e.action == TickAction::AlreadyDone),
        "{report:?}"
    );
    // a's clock jumps one hour ahead: it claims what is within max_late of its
    // clock early and records the rest as skipped; b still runs those on time.
    while real < start + 90 * MIN {
        a.tick_to(real + HOUR).await;
        b.tick_to(real + SEC).await;
        real += 20 * SEC;
    }
    let runs = slots_run(&log);
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "slots run more than once: {twice:?}");
    // Every slot b reached was run exactly once, by someone.
    for minute in 0..90 {
        let slot = start + minute * MIN;
        assert_eq!(
            runs.get(&slot),
            Some(&1),
            "slot {minute} min after start did not run"
        );
    }
    let by_a_early = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(i, s, _)| i == "a" && *s > start + 21 * MIN)
        .count();
    assert!(
        by_a_early > 0,
        "the jumped instance claimed nothing early (test not exercising the jump)"
    );
}

/// A store that is down: every call fails with `Unavailable`.
#[derive(Debug, Default)]
struct DownBackend {
    calls: AtomicUsize,
}

impl DownBackend {
    fn fail<T>(&self) -> coord_backend::Result<T> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Err(coord_backend::Error::Unavailable {
            message: "connection refused (test double)".into(),
            source: None,
        })
    }
}

#[async_trait]
impl Backend for DownBackend {
    fn namespace(&self) -> &str {
        "down"
    }
    async fn snapshot(&self, _keys: &[String]) -> coord_backend::Result<Vec<Entry>> {
        self.fail()
    }
    async fn txn(&self, _a: &[Assert], _m: &[Mutation]) -> coord_backend::Result<TxnOutcome> {
        self.fail()
    }
    async fn keys(&self, _prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.fail()
    }
}

#[tokio::test]
async fn locking_hints_with_a_broken_store_and_without_a_store() {
    let log: RunLog = Arc::default();
    let down = Arc::new(DownBackend::default());
    let clock = Arc::new(ManualClock::at_millis(T0));
    let store: Arc<dyn SlotStore> =
        Arc::new(RunStore::new(down.clone(), clock.clone(), RunStoreOptions::default()).unwrap());
    let with_down = Scheduler::new(Some(store), clock.clone(), SchedulerOptions::instance("x"));
    let opts = |hint| {
        JobOptions::default()
            .hint(hint)
            .max_late(Duration::from_secs(2))
    };
    let job = |name: &str, hint| {
        Job::new(
            name,
            Schedule::parse("every 1s", None).unwrap(),
            recorder(&log, name),
        )
        .with_options(opts(hint))
    };
    with_down
        .add_job(job("required", LockingHint::RequireGlobal))
        .unwrap();
    with_down
        .add_job(job("preferred", LockingHint::PreferGlobal))
        .unwrap();

    // NodeLocal over the broken store: runs, and never calls the store.
    let down_local = Arc::new(DownBackend::default());
    let local_store: Arc<dyn SlotStore> = Arc::new(
        RunStore::new(
            down_local.clone(),
            clock.clone(),
            RunStoreOptions::default(),
        )
        .unwrap(),
    );
    let local_only = Scheduler::new(
        Some(local_store),
        clock.clone(),
        SchedulerOptions::instance("l"),
    );
    local_only
        .add_job(job("local", LockingHint::NodeLocal))
        .unwrap();
    let report = local_only.tick_at(T0).await;
    local_only.wait_idle().await;
    assert!(
        !report.started().is_empty()
            && report.events.iter().all(|e| matches!(
                e.action,
                TickAction::Started {
                    coordinated: false,
                    ..
                } | TickAction::LocalOverlap
            )),
        "{report:?}"
    );
    assert_eq!(
        local_only.run_now("local").await.unwrap().status,
        FinalStatus::Succeeded
    );
    assert_eq!(
        down_local.calls.load(Ordering::SeqCst),
        0,
        "NodeLocal touched the store"
    );

    let report = with_down.tick_at(T0).await;
    with_down.wait_idle().await;
    for name in ["required", "preferred"] {
        let events: Vec<_> = report.of(name).collect();
        assert!(
            !events.is_empty()
                && events
                    .iter()
                    .all(|e| matches!(e.action, TickAction::StoreError { .. })),
            "{name}: {events:?}"
        );
    }
    let ran = log
        .lock()
        .unwrap()
        .iter()
        .filter(|(n, _, _)| n != "local")
        .count();
    assert_eq!(ran, 0, "a coordinated job ran with the store down");
    assert!(
        down.calls.load(Ordering::SeqCst) >= 2,
        "the coordinated jobs did not even try the store"
    );

    // Still down: the failed slot is retried until it is late, then dropped (not recordable).
    let report = with_down.tick_at(T0 + 5 * SEC).await;
    with_down.wait_idle().await;
    assert!(report.of("required").any(|e| e.slot == T0
        && matches!(
            e.action,
            TickAction::Late {
                recorded: false,
                ..
            }
        )));
    // run_now of a coordinated job refuses when the store cannot record it.
    assert!(matches!(
        with_down.run_now("required").await,
        Err(Error::Store(_))
    ));

    // Without a store: RequireGlobal is refused, PreferGlobal runs locally.
    let no_store = Scheduler::new(None, clock.clone(), SchedulerOptions::instance("y"));
    assert!(matches!(
        no_store.add_job(job("required", LockingHint::RequireGlobal)),
        Err(Error::NoStore(_))
    ));
    no_store
        .add_job(job("preferred", LockingHint::PreferGlobal))
        .unwrap();
    let report = no_store.tick_at(T0).await;
    no_store.wait_idle().await;
    let actions: Vec<TickAction> = report.of("preferred").map(|e| e.action.clone()).collect();
    assert_eq!(
        actions[0],
        TickAction::Started {
            takeover: false,
            coordinated: false
        },
        "{actions:?}"
    );
    assert!(
        actions[1..].iter().all(|a| *a == TickAction::LocalOverlap),
        "{actions:?}"
    );
    let manual = no_store.run_now("preferred").await.unwrap();
    assert!(!manual.recorded);
}

#[tokio::test]
async fn node_local_runs_on_every_instance() {
    let ns = unique_namespace("node_local");
    let log: RunLog = Arc::default();
    let (a, b) = (instance(&ns, "a", T0), instance(&ns, "b", T0));
    let opts = JobOptions::default()
        .hint(LockingHint::NodeLocal)
        .max_late(Duration::ZERO);
    a.scheduler
        .add_job(every("every 1s", opts.clone(), recorder(&log, "a")))
        .unwrap();
    b.scheduler
        .add_job(every("every 1s", opts, recorder(&log, "b")))
        .unwrap();
    a.tick_to(T0).await;
    b.tick_to(T0).await;
    assert_eq!(
        slots_run(&log).get(&T0),
        Some(&2),
        "each instance runs its own copy"
    );
    assert!(
        a.store.history("job", 10).await.unwrap().is_empty(),
        "NodeLocal never writes the store"
    );
}

#[tokio::test]
async fn add_job_refusals_are_typed() {
    let ns = unique_namespace("refusals");
    let a = instance(&ns, "a", T0);
    let h = handler(|_| async { Ok(()) });
    let s = Schedule::parse("every 1s", None).unwrap();
    a.scheduler
        .add_job(Job::new("x", s.clone(), h.clone()))
        .unwrap();
    assert!(matches!(
        a.scheduler.add_job(Job::new("x", s.clone(), h.clone())),
        Err(Error::DuplicateJob(_))
    ));
    assert!(matches!(
        a.scheduler
            .add_job(Job::new("no/slash", s.clone(), h.clone())),
        Err(Error::InvalidJobName(_))
    ));
    let zero = JobOptions::default().lease_ttl(Duration::ZERO);
    assert!(matches!(
        a.scheduler.add_job(Job::new("y", s, h).with_options(zero)),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(a.scheduler.job_names(), vec!["x".to_owned()]);
}

/// The real loop on the system clock: two instances, a 100 ms job, ~1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tick_loop_runs_each_slot_once_across_instances() {
    let ns = unique_namespace("loop");
    let log: RunLog = Arc::default();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let mut schedulers = Vec::new();
    for name in ["a", "b"] {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::shared(&ns).unwrap());
        let store: Arc<dyn SlotStore> =
            Arc::new(RunStore::new(backend, clock.clone(), RunStoreOptions::default()).unwrap());
        let options = SchedulerOptions::instance(name).poll_interval(Duration::from_millis(20));
        let scheduler = Scheduler::new(Some(store), clock.clone(), options);
        let opts = JobOptions::default().max_late(Duration::from_millis(300));
        scheduler
            .add_job(every("every 100ms", opts, recorder(&log, name)))
            .unwrap();
        scheduler.start();
        schedulers.push(scheduler);
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    for s in &schedulers {
        s.shutdown().await;
    }
    let runs = slots_run(&log);
    assert!(runs.len() >= 5, "only {} slots ran in 1.2 s", runs.len());
    assert!(runs.values().all(|n| *n == 1), "a slot ran twice: {runs:?}");
}

/// Commits a txn but loses its reply, once, then loses every call (the
/// re-reads and resends that would tell) until `blind` is cleared.
#[derive(Debug)]
struct LostReplyBackend {
    inner: SingleProcessMemoryBackend,
    armed: std::sync::atomic::AtomicBool,
    blind: std::sync::atomic::AtomicBool,
}

#[async_trait]
impl Backend for LostReplyBackend {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }
    async fn snapshot(&self, keys: &[String]) -> coord_backend::Result<Vec<Entry>> {
        if self.blind.load(Ordering::SeqCst) {
            return Err(coord_backend::Error::Indeterminate {
                message: "connection reset (test double)".into(),
                source: None,
            });
        }
        self.inner.snapshot(keys).await
    }
    async fn txn(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<TxnOutcome> {
        if self.blind.load(Ordering::SeqCst) {
            return Err(coord_backend::Error::Indeterminate {
                message: "connection reset (test double)".into(),
                source: None,
            });
        }
        let outcome = self.inner.txn(asserts, mutations).await?;
        if outcome.applied && !mutations.is_empty() && self.armed.swap(false, Ordering::SeqCst) {
            self.blind.store(true, Ordering::SeqCst);
            return Err(coord_backend::Error::Indeterminate {
                message: "reply lost (test double)".into(),
                source: None,
            });
        }
        Ok(outcome)
    }
    async fn keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.inner.keys(prefix).await
    }
}

#[tokio::test]
async fn a_claim_whose_reply_was_lost_is_retried_with_the_same_token() {
    let ns = unique_namespace("lost_reply");
    let log: RunLog = Arc::default();
    let clock = Arc::new(ManualClock::at_millis(T0));
    let flaky = Arc::new(LostReplyBackend {
        inner: SingleProcessMemoryBackend::shared(&ns).unwrap(),
        armed: true.into(),
        blind: false.into(),
    });
    let store: Arc<dyn SlotStore> =
        Arc::new(RunStore::new(flaky.clone(), clock.clone(), RunStoreOptions::default()).unwrap());
    let a = Scheduler::new(Some(store), clock.clone(), SchedulerOptions::instance("a"));
    let b = instance(&ns, "b", T0);
    let opts = JobOptions::default().max_late(Duration::from_secs(5));
    a.add_job(every("every 1m", opts.clone(), recorder(&log, "a")))
        .unwrap();
    b.scheduler
        .add_job(every("every 1m", opts, recorder(&log, "b")))
        .unwrap();
    let slot = T0 - T0 % MIN + MIN;
    clock.set(UNIX_EPOCH + Duration::from_millis(slot));

    // a's claim committed but a cannot tell: the tick reports a store error, nothing runs.
    let report = a.tick_at(slot).await;
    assert!(
        matches!(report.events[0].action, TickAction::StoreError { .. }),
        "{report:?}"
    );
    flaky.blind.store(false, Ordering::SeqCst);
    // b sees the slot held (by a's committed claim) and does not run it.
    let report = b.tick_to(slot + 100).await;
    assert!(
        matches!(report.events[0].action, TickAction::HeldElsewhere { .. }),
        "{report:?}"
    );
    // a's next tick claims again with the same token: recognised as its own, it runs.
    let report = a.tick_at(slot + 200).await;
    a.wait_idle().await;
    assert_eq!(report.started(), vec![("job", slot)], "{report:?}");
    assert_eq!(slots_run(&log), BTreeMap::from([(slot, 1)]));
    let history = b.store.history("job", 10).await.unwrap();
    assert_eq!(
        (
            history[0].instance.as_str(),
            history[0].status,
            history[0].takeovers
        ),
        ("a", RunStatus::Succeeded, 0)
    );
}
