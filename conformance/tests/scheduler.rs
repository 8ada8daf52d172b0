//! The scheduler suite on the in-process memory store; proof that it goes red
//! on broken run stores (a check that cannot fail is a defect); and tests of
//! the scheduler runtime driven by a `ManualClock` (catch-up, skips,
//! `run_now`, DST, clock jumps, takeover, shutdown, `LockingHint` with a
//! broken store).

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
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
    handler, ActiveRun, Backoff, Claim, ClaimRequest, Error, FinalStatus, Handler, HandlerResult,
    Job, JobOptions, Lease, LockingHint, ManualRun, RunContext, RunError, RunRecord, RunStatus,
    RunStore, RunStoreOptions, Schedule, Scheduler, SchedulerOptions, SkipReason, Slot, SlotStore,
    TickAction,
};

mod common;

use common::memory;

// ---------------------------------------------------------------------------
// Broken stores: each must turn the relevant checks red.
// ---------------------------------------------------------------------------

/// A store whose txn ignores its asserts: every decision becomes
/// read-then-write (the classic double run).
#[derive(Debug)]
struct NonAtomicBackend(SingleProcessMemoryBackend);

#[async_trait]
impl Backend for NonAtomicBackend {
    fn namespace(&self) -> &str {
        self.0.namespace()
    }
    async fn raw_snapshot(&self, keys: &[&str]) -> coord_backend::Result<Vec<Entry>> {
        self.0.raw_snapshot(keys).await
    }
    async fn raw_txn(
        &self,
        _asserts: &[Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<TxnOutcome> {
        self.0.raw_txn(&[], mutations).await
    }
    async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.0.raw_keys(prefix).await
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
    /// Refuses every slot below the forgotten ones as done, running or not.
    FloorFirst,
    /// Prunes by a clock a window behind: keeps runs abandoned longer than the window ago.
    PrunesBehind,
    /// Prunes by a clock an hour ahead: forgets live runs.
    PrunesAhead,
    /// Claims without the request's attempt bound: takes over past `max_attempts`.
    UncappedAttempts,
    /// None: the double must pass everything.
    Honest,
}

#[derive(Debug)]
struct Broken {
    inner: RunStore,
    flaw: Flaw,
    /// Winning tokens, shared by every client of one maker (UncheckedOwner).
    holders: Arc<Mutex<HashMap<(String, Slot), String>>>,
    /// Per job, one above the newest finished slot a prune forgot (FloorFirst).
    floors: Arc<Mutex<HashMap<String, Slot>>>,
    /// The store `prune` goes through: `inner`'s, on a shifted clock (PrunesBehind, PrunesAhead).
    pruner: Option<RunStore>,
}

/// A clock `shift_ms` away from another.
#[derive(Debug)]
struct Shifted(Arc<dyn Clock>, i64);

impl Clock for Shifted {
    fn now(&self) -> std::time::SystemTime {
        let base = self.0.now();
        let shift = Duration::from_millis(self.1.unsigned_abs());
        if self.1 < 0 {
            base - shift
        } else {
            base + shift
        }
    }
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
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, RunError> {
        let mut request = request.clone();
        match self.flaw {
            Flaw::FreshTokenPerClaim => request.token = coord_adapters::mint_token(),
            Flaw::IgnoresOverlap => request.allow_overlap = true,
            Flaw::UncappedAttempts => request.max_attempts = None,
            _ => {}
        }
        let floor = self.floors.lock().unwrap().get(&request.job).copied();
        if self.flaw == Flaw::FloorFirst && floor.is_some_and(|f| request.slot < f) {
            // What the store answers for a forgotten slot (slot 0 never ran).
            request.slot = 0;
            return self.inner.claim(&request).await;
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
    ) -> Result<Lease, RunError> {
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
    ) -> Result<(), RunError> {
        self.inner
            .finish(job, slot, &self.token(job, slot, token), status)
            .await
    }
    async fn release(&self, job: &str, slot: Slot, token: &str) -> Result<(), RunError> {
        self.inner
            .release(job, slot, &self.token(job, slot, token))
            .await
    }
    async fn record_attempt(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        attempt: u32,
        failure: &str,
    ) -> Result<(), RunError> {
        self.inner
            .record_attempt(job, slot, &self.token(job, slot, token), attempt, failure)
            .await
    }
    async fn active(&self, job: &str) -> Result<Vec<ActiveRun>, RunError> {
        self.inner.active(job).await
    }
    async fn record_manual(&self, run: &ManualRun) -> Result<(), RunError> {
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
    ) -> Result<bool, RunError> {
        let recorded = self.inner.record_skip(job, slot, instance, reason).await?;
        Ok(recorded || self.flaw == Flaw::SkipAlwaysRecorded)
    }
    async fn history(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>, RunError> {
        let mut all = self.inner.history(job, usize::MAX).await?;
        if self.flaw == Flaw::OldestFirst {
            all.reverse();
        }
        all.truncate(limit);
        Ok(all)
    }
    async fn prune(&self, job: &str) -> Result<usize, RunError> {
        let finished = self.inner.history(job, usize::MAX).await?;
        let pruned = self
            .pruner
            .as_ref()
            .unwrap_or(&self.inner)
            .prune(job)
            .await?;
        if pruned > 0 {
            let newest = finished
                .iter()
                .filter(|r| r.status != RunStatus::Running)
                .map(|r| r.slot + 1)
                .max();
            if let Some(floor) = newest {
                self.floors.lock().unwrap().insert(job.to_owned(), floor);
            }
        }
        Ok(pruned)
    }
}

fn broken(flaw: Flaw) -> SchedulerEnv {
    let holders = Arc::new(Mutex::new(HashMap::new()));
    let floors = Arc::new(Mutex::new(HashMap::new()));
    let maker: StoreMaker = Arc::new(move |backend, clock, options: RunStoreOptions| {
        let window = options.forget_claims_after.unwrap_or_default();
        let shift = match flaw {
            Flaw::PrunesBehind => -i64::try_from(window.as_millis()).unwrap(),
            Flaw::PrunesAhead => 3_600_000,
            _ => 0,
        };
        let pruner = (shift != 0)
            .then(|| {
                let shifted = Arc::new(Shifted(clock.clone(), shift));
                RunStore::new(backend.clone(), shifted, options.clone())
            })
            .transpose()?;
        Ok(Arc::new(Broken {
            inner: RunStore::new(backend, clock, options)?,
            flaw,
            holders: holders.clone(),
            floors: floors.clone(),
            pruner,
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
        "running_slot_below_the_floor" => suite::running_slot_below_the_floor(env).await,
        "abandoned_run_forgotten" => suite::abandoned_run_forgotten(env).await,
        "attempts_by_token" => suite::attempts_by_token(env).await,
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

/// One test per broken env: each check listed must go red on it.
macro_rules! red_on {
    ($($test:ident: $env:expr, $what:literal, [$($check:literal),+ $(,)?];)+) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            assert_red(&$env, $what, &[$($check),+]).await;
        }
    )+};
}

red_on! {
    red_on_a_read_then_write_claim: SchedulerEnv::new(non_atomic()),
        "a store whose txn ignores asserts", ["claim_race", "repeat_safety"];
    red_on_a_claim_that_ignores_the_token: broken(Flaw::FreshTokenPerClaim),
        "a claim that ignores the token", ["repeat_safety"];
    red_on_unchecked_ownership: broken(Flaw::UncheckedOwner),
        "heartbeat/finish/release without an ownership check",
        ["heartbeat_ownership", "takeover_after_expiry", "finish_release_by_token", "attempts_by_token"];
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn red_on_the_other_flaws() {
    for (flaw, what, check) in [
        (
            Flaw::IgnoresOverlap,
            "a claim without overlap check",
            "overlap_protection",
        ),
        (
            Flaw::OldestFirst,
            "history oldest first",
            "history_newest_first",
        ),
        (
            Flaw::HidesWindow,
            "a store hiding its dedupe window",
            "dedupe_window_refusal",
        ),
        (
            Flaw::SkipAlwaysRecorded,
            "skips recorded twice",
            "skip_recorded_once",
        ),
        (
            Flaw::DedupesManual,
            "deduplicated manual runs",
            "manual_runs_not_deduplicated",
        ),
        (
            Flaw::FloorFirst,
            "a floor that refuses running slots",
            "running_slot_below_the_floor",
        ),
        (
            Flaw::PrunesBehind,
            "a prune that keeps abandoned runs",
            "abandoned_run_forgotten",
        ),
        (
            Flaw::PrunesAhead,
            "a prune that forgets live runs",
            "abandoned_run_forgotten",
        ),
        (
            Flaw::UncappedAttempts,
            "takeovers past max_attempts",
            "attempts_by_token",
        ),
    ] {
        assert_red(&broken(flaw), what, &[check]).await;
    }
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

/// A handler that logs each run under `instance`, then does `rest`.
fn logging<F, Fut>(log: &RunLog, instance: &str, rest: F) -> Handler
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    let (log, instance) = (log.clone(), instance.to_owned());
    handler(move |ctx| {
        let (log, instance, slot, manual) = (log.clone(), instance.clone(), ctx.slot, ctx.manual);
        let rest = rest(ctx);
        async move {
            log.lock().unwrap().push((instance, slot, manual));
            rest.await
        }
    })
}

fn recorder(log: &RunLog, instance: &str) -> Handler {
    logging(log, instance, |_| async { Ok(()) })
}

/// A handler that waits for a permit of `gate` (spent, not returned) after logging.
fn gated(log: &RunLog, gate: &Arc<tokio::sync::Semaphore>, instance: &str) -> Handler {
    let gate = gate.clone();
    logging(log, instance, move |_| {
        let gate = gate.clone();
        async move {
            gate.acquire()
                .await
                .map(|p| p.forget())
                .map_err(|e| e.to_string())?;
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

/// A scheduler over a [`RunStore`] (default options) on `backend`, and that store.
fn scheduler_over(
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    options: SchedulerOptions,
) -> (Scheduler, Arc<dyn SlotStore>) {
    scheduler_with(backend, clock, RunStoreOptions::default(), options)
}

fn scheduler_with(
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    store_options: RunStoreOptions,
    options: SchedulerOptions,
) -> (Scheduler, Arc<dyn SlotStore>) {
    let store: Arc<dyn SlotStore> =
        Arc::new(RunStore::new(backend, clock.clone(), store_options).unwrap());
    (Scheduler::new(Some(store.clone()), clock, options), store)
}

fn instance(ns: &str, name: &str, start_ms: u64) -> Instance {
    let clock = Arc::new(ManualClock::at_millis(start_ms));
    let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::shared(ns).unwrap());
    let (scheduler, store) =
        scheduler_over(backend, clock.clone(), SchedulerOptions::instance(name));
    Instance {
        scheduler,
        clock,
        store,
    }
}

/// Instances named `names` of one fresh namespace, their clocks at `start_ms`.
fn instances<const N: usize>(prefix: &str, names: [&str; N], start_ms: u64) -> [Instance; N] {
    let ns = unique_namespace(prefix);
    names.map(|name| instance(&ns, name, start_ms))
}

/// One instance at [`T0`] running "job" every second (overlapping runs
/// allowed), catching up `max_late`.
fn alone_every_second(prefix: &str, max_late: Duration, log: &RunLog) -> Instance {
    let [a] = instances(prefix, ["a"], T0);
    let opts = JobOptions::default()
        .with_max_late(max_late)
        .with_allow_overlap(true);
    a.add_recorded("every 1s", opts, log);
    a
}

/// Options of a job holding a lease of `ttl`, catching up `max_late`.
fn leased(ttl: Duration, max_late: Duration) -> JobOptions {
    JobOptions::default()
        .with_lease_ttl(ttl)
        .with_max_late(max_late)
}

fn started_slots(report: &coord_scheduler::TickReport) -> Vec<Slot> {
    report.started().iter().map(|(_, s)| *s).collect()
}

impl Instance {
    /// Adds the job "job" on `period`, its runs logged under this instance's name.
    fn add_recorded(&self, period: &str, opts: JobOptions, log: &RunLog) {
        let handler = recorder(log, self.scheduler.instance_id());
        self.scheduler
            .add_job(every(period, opts, handler))
            .unwrap();
    }

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
    let log: RunLog = Arc::default();
    let a = alone_every_second("catch_up", Duration::from_secs(5), &log);

    // Started 10.5 s after T0: looks back max_late, runs the 5 slots inside it.
    let report = a.tick_to(T0 + 10_500).await;
    let started = started_slots(&report);
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
    let started = started_slots(&report);
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

// Paused time: the tick counts the real time its claims take, and the slot
// exactly at max_late (started here) must not turn late because the machine is busy.
#[tokio::test(start_paused = true)]
async fn a_long_gap_skips_without_listing_every_slot() {
    let log: RunLog = Arc::default();
    let a = alone_every_second("long_gap", Duration::from_secs(3), &log);
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
    let started = started_slots(&report);
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
    let log: RunLog = Arc::default();
    let [a, b] = instances("run_now", ["a", "b"], T0);
    let global = JobOptions::default().with_hint(LockingHint::RequireGlobal);
    a.add_recorded("every 1h", global, &log);
    b.add_recorded("every 1h", JobOptions::default(), &log);
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
    let [a] = instances("timeout", ["a"], T0);
    let slow = handler(|_| async {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Ok(())
    });
    let opts = JobOptions::default().with_timeout(Some(Duration::from_millis(50)));
    a.scheduler.add_job(every("every 1s", opts, slow)).unwrap();
    let report = a.tick_to(T0).await;
    assert_eq!(report.started().len(), 1);
    let history = a.store.history("job", 1).await.unwrap();
    assert_eq!(history[0].status, RunStatus::TimedOut);
}

#[tokio::test]
async fn two_instances_run_each_slot_once_and_overlap_waits() {
    let log: RunLog = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let [a, b] = instances("overlap_runtime", ["a", "b"], T0);
    let opts = JobOptions::default().with_max_late(Duration::from_millis(1_500));
    a.scheduler
        .add_job(every("every 1s", opts.clone(), gated(&log, &gate, "a")))
        .unwrap();
    b.scheduler
        .add_job(every("every 1s", opts, gated(&log, &gate, "b")))
        .unwrap();
    // First ticks look back max_late: slots T0-1s and T0 are due. One instance
    // runs T0-1s; T0 is blocked by it everywhere (no overlap).
    let ra = a.scheduler.tick_at(T0).await;
    let rb = b.scheduler.tick_at(T0).await;
    let started = [started_slots(&ra), started_slots(&rb)].concat();
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
    let both = [started_slots(&ra), started_slots(&rb)].concat();
    assert_eq!(both, vec![T0]);
    gate.add_permits(10);
    a.scheduler.wait_idle().await;
    b.scheduler.wait_idle().await;
    assert_eq!(slots_run(&log), BTreeMap::from([(T0 - SEC, 1), (T0, 1)]));
}

/// A lease of `Duration::MAX` (a run nobody takes over while it lasts):
/// the run starts, heartbeats and finishes, and another instance follows it,
/// without an instant overflowing anywhere.
#[tokio::test(start_paused = true)]
async fn a_lease_of_duration_max_runs_and_is_followed() {
    let log: RunLog = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let [a, b] = instances("forever_lease", ["a", "b"], T0);
    let opts = JobOptions::default().with_lease_ttl(Duration::MAX);
    for instance in [&a, &b] {
        let name = instance.scheduler.instance_id().to_owned();
        instance
            .scheduler
            .add_job(every("every 1h", opts.clone(), gated(&log, &gate, &name)))
            .unwrap();
    }
    let slot = Schedule::parse("every 1h", None)
        .unwrap()
        .next_after(T0)
        .unwrap();
    for instance in [&a, &b] {
        instance.clock.set(UNIX_EPOCH + Duration::from_millis(slot));
    }
    let ra = a.scheduler.tick_at(slot).await;
    assert_eq!(started_slots(&ra), vec![slot], "{ra:?}");
    let rb = b.scheduler.tick_at(slot).await;
    assert!(
        matches!(rb.events[0].action, TickAction::HeldElsewhere { .. }),
        "{rb:?}"
    );
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    gate.add_permits(2);
    a.scheduler.wait_idle().await;
    let history = a.store.history("job", 1).await.unwrap();
    assert_eq!(history[0].status, RunStatus::Succeeded, "{history:?}");
    assert_eq!(slots_run(&log), BTreeMap::from([(slot, 1)]));
}

/// A holder cut off from the store (its heartbeats hang) is taken over by a
/// backup once its lease stayed unchanged for a full lease, within
/// `max_late`; a graceful shutdown releases at once.
#[tokio::test(start_paused = true)]
async fn a_backup_takes_over_an_expired_lease_and_shutdown_releases() {
    let ns = unique_namespace("takeover_runtime");
    let log: RunLog = Arc::default();
    let hang = |instance: &str| logging(&log, instance, |_| std::future::pending());
    let max_late = Duration::from_secs(10);
    let opts = leased(Duration::from_secs(3), max_late);
    let slot = Schedule::parse("every 1h", None)
        .unwrap()
        .next_after(T0)
        .unwrap();
    let make = |name: &str| on_faulty(&ns, name, slot, every("every 1h", opts.clone(), hang(name)));
    let (a, _, ca, a_backend) = make("a");
    let (b, b_store, cb, _) = make("b");
    let (c, c_store, cc, _) = make("c");
    assert_eq!(a.tick_at(ca.now_millis()).await.started().len(), 1);
    for (backup, clock) in [(&b, &cb), (&c, &cc)] {
        let r = backup.tick_at(clock.now_millis()).await;
        assert!(
            matches!(r.events[0].action, TickAction::HeldElsewhere { .. }),
            "{r:?}"
        );
    }

    // a is cut off (its heartbeats hang): b takes the slot over when it looks again.
    a_backend.set(HANG);
    let mut takeover = None;
    while takeover.is_none() && cb.now_millis() < slot + millis(max_late) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let rb = b.tick_at(cb.now_millis()).await;
        takeover = rb
            .events
            .into_iter()
            .find(|e| e.slot == slot && matches!(e.action, TickAction::Started { .. }));
    }
    assert_eq!(
        takeover.map(|e| e.action),
        Some(TickAction::Started {
            takeover: true,
            coordinated: true
        }),
        "not taken over within max_late"
    );
    let history = b_store.history("job", 10).await.unwrap();
    let record = history.iter().find(|r| r.slot == slot).unwrap();
    assert_eq!((record.instance.as_str(), record.takeovers), ("b", 1));

    // Graceful shutdown of b releases its leases: c takes them over at once.
    b.shutdown().await;
    let rc = c.tick_at(cc.now_millis()).await;
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
        b.tick_at(cb.now_millis()).await.events.is_empty(),
        "a shut-down scheduler does nothing"
    );
    assert!(matches!(b.run_now("job").await, Err(Error::ShutDown)));
    a.shutdown().await;
    c.shutdown().await;
    let history = c_store.history("job", 10).await.unwrap();
    assert!(
        history.iter().all(|r| r.status == RunStatus::Released),
        "{history:?}"
    );
}

/// Tick two instances every 15 minutes across a DST change of New York.
async fn dst_runs(schedule: &str, from: u64, to: u64) -> (Vec<Slot>, BTreeMap<Slot, usize>) {
    let log: RunLog = Arc::default();
    let [a, b] = instances("dst", ["a", "b"], from);
    for (i, name) in [(&a, "a"), (&b, "b")] {
        let job = Job::new(
            "nightly",
            Schedule::parse(schedule, Some("America/New_York")).unwrap(),
            recorder(&log, name),
        )
        .with_options(JobOptions::default().with_max_late(Duration::from_secs(600)));
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
    let opts = JobOptions::default().with_max_late(Duration::from_secs(120));
    a.add_recorded("every 1m", opts.clone(), &log);
    b.add_recorded("every 1m", opts, &log);
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
    let looks_back = JobOptions::default().with_max_late(Duration::from_secs(20 * 60));
    c.add_recorded("every 1m", looks_back, &log);
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
fn down_backend() -> Arc<coord_conformance::faults::FaultyBackend> {
    let inner = SingleProcessMemoryBackend::shared(&unique_namespace("down")).unwrap();
    let down = coord_conformance::faults::FaultyBackend::new(Arc::new(inner), 2);
    down.always(
        coord_conformance::faults::Target::Any,
        coord_conformance::faults::Fault::Refuse,
    );
    Arc::new(down)
}

#[tokio::test]
async fn locking_hints_with_a_broken_store_and_without_a_store() {
    let log: RunLog = Arc::default();
    let down = down_backend();
    let clock = Arc::new(ManualClock::at_millis(T0));
    let (with_down, _) =
        scheduler_over(down.clone(), clock.clone(), SchedulerOptions::instance("x"));
    let opts = |hint| {
        JobOptions::default()
            .with_hint(hint)
            .with_max_late(Duration::from_secs(2))
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
    let down_local = down_backend();
    let (local_only, _) = scheduler_over(
        down_local.clone(),
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
        down_local.fired() as usize,
        0,
        "NodeLocal touched the store"
    );

    let report = with_down.tick_at(T0).await;
    with_down.wait_idle().await;
    for name in ["required", "preferred"] {
        let events: Vec<_> = report.of(name).collect();
        // The oldest slot sits exactly at `max_late`: the time the tick
        // spends on the failed claims before it may make it late (the tick
        // counts real time spent, by design), so `Late` is allowed too.
        assert!(
            events
                .iter()
                .any(|e| matches!(e.action, TickAction::StoreError { .. }))
                && events.iter().all(|e| matches!(
                    e.action,
                    TickAction::StoreError { .. } | TickAction::Late { .. }
                )),
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
        down.fired() as usize >= 2,
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
        Err(Error::Runs(RunError::Store(_)))
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
    let log: RunLog = Arc::default();
    let [a, b] = instances("node_local", ["a", "b"], T0);
    let opts = JobOptions::default()
        .with_hint(LockingHint::NodeLocal)
        // Looks back less than a period (no catch-up of T0 - 1 s), with
        // most of a second of slack: a tick judges lateness again with the
        // monotonic time it took, which a loaded machine stretches.
        .with_max_late(Duration::from_millis(900));
    a.add_recorded("every 1s", opts.clone(), &log);
    b.add_recorded("every 1s", opts, &log);
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
    let [a] = instances("refusals", ["a"], T0);
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
    let zero = JobOptions::default().with_lease_ttl(Duration::ZERO);
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
        let options =
            SchedulerOptions::instance(name).with_poll_interval(Duration::from_millis(20));
        let (scheduler, _) = scheduler_over(backend, clock.clone(), options);
        let opts = JobOptions::default().with_max_late(Duration::from_millis(300));
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

#[tokio::test]
async fn a_claim_whose_reply_was_lost_is_retried_with_the_same_token() {
    let ns = unique_namespace("lost_reply");
    let log: RunLog = Arc::default();
    let clock = Arc::new(ManualClock::at_millis(T0));
    // The claim commits but its reply is lost, then every call (the
    // resends that would tell) is lost too, until healed.
    let flaky = Arc::new(coord_conformance::faults::FaultyBackend::new(
        Arc::new(SingleProcessMemoryBackend::shared(&ns).unwrap()),
        1,
    ));
    flaky.once(
        coord_conformance::faults::Target::WritingTxn,
        coord_conformance::faults::Fault::LoseReply,
    );
    flaky.always(
        coord_conformance::faults::Target::Any,
        coord_conformance::faults::Fault::Drop,
    );
    let (a, _) = scheduler_over(
        flaky.clone(),
        clock.clone(),
        SchedulerOptions::instance("a"),
    );
    let b = instance(&ns, "b", T0);
    let opts = JobOptions::default().with_max_late(Duration::from_secs(5));
    a.add_job(every("every 1m", opts.clone(), recorder(&log, "a")))
        .unwrap();
    b.add_recorded("every 1m", opts, &log);
    let slot = T0 - T0 % MIN + MIN;
    clock.set(UNIX_EPOCH + Duration::from_millis(slot));

    // a's claim committed but a cannot tell: the tick reports a store error, nothing runs.
    let report = a.tick_at(slot).await;
    assert!(
        matches!(report.events[0].action, TickAction::StoreError { .. }),
        "{report:?}"
    );
    flaky.heal();
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

// ---------------------------------------------------------------------------
// Cut-off holders, paused and clock-stepped followers, a stopped instance.
// Run on tokio's paused clock: deterministic, no real waiting.
// ---------------------------------------------------------------------------

/// A wall clock that moves with tokio's (paused) clock, plus a settable step
/// (a wall-clock jump that the monotonic clock does not see).
#[derive(Debug)]
struct TokioClock {
    base_ms: u64,
    start: tokio::time::Instant,
    step_ms: std::sync::atomic::AtomicU64,
}

impl TokioClock {
    fn at(base_ms: u64) -> Arc<Self> {
        Arc::new(TokioClock {
            base_ms,
            start: tokio::time::Instant::now(),
            step_ms: 0.into(),
        })
    }
    fn step_forward(&self, by: Duration) {
        self.step_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Clock for TokioClock {
    fn now(&self) -> std::time::SystemTime {
        UNIX_EPOCH
            + Duration::from_millis(
                self.base_ms
                    + self.start.elapsed().as_millis() as u64
                    + self.step_ms.load(Ordering::SeqCst),
            )
    }
}

const FINE: u8 = 0;
const UNAVAILABLE: u8 = 1;
const INDETERMINATE: u8 = 2;
const HANG: u8 = 3;

/// A store that can be cut off from one instance: its txns (and snapshots)
/// fail with `Unavailable`, fail with `Indeterminate` (not applied), or hang;
/// `hang_next` hangs that many txns once; `reply_delay` delays the reply of
/// an applied txn (it committed when sent); `frozen` makes every txn wait
/// (a stopped process holding the store's write lock, as SQLite's is).
#[derive(Debug)]
struct FaultyBackend {
    inner: SingleProcessMemoryBackend,
    mode: std::sync::atomic::AtomicU8,
    hang_next: AtomicUsize,
    reply_delay_ms: std::sync::atomic::AtomicU64,
    latency_ms: u64,
    frozen: Option<tokio::sync::watch::Receiver<bool>>,
}

impl FaultyBackend {
    fn new(ns: &str) -> Arc<Self> {
        Arc::new(Self::with(ns, 0, None))
    }
    fn with(ns: &str, latency_ms: u64, frozen: Option<tokio::sync::watch::Receiver<bool>>) -> Self {
        FaultyBackend {
            inner: SingleProcessMemoryBackend::shared(ns).unwrap(),
            mode: FINE.into(),
            hang_next: 0.into(),
            reply_delay_ms: 0.into(),
            latency_ms,
            frozen,
        }
    }
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }
    async fn gate(&self) -> coord_backend::Result<()> {
        if self.latency_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.latency_ms)).await;
        }
        match self.mode.load(Ordering::SeqCst) {
            UNAVAILABLE => Err(coord_backend::Error::Unavailable {
                message: "cut off (test double)".into(),
                source: None,
            }),
            INDETERMINATE => Err(coord_backend::Error::Indeterminate {
                message: "reply lost (test double)".into(),
                source: None,
            }),
            HANG => std::future::pending().await,
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }
    async fn raw_snapshot(&self, keys: &[&str]) -> coord_backend::Result<Vec<Entry>> {
        self.gate().await?;
        self.inner.raw_snapshot(keys).await
    }
    async fn raw_txn(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> coord_backend::Result<TxnOutcome> {
        if let Some(frozen) = &self.frozen {
            let mut frozen = frozen.clone();
            let _ = frozen.wait_for(|f| !*f).await;
        }
        if self
            .hang_next
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return std::future::pending().await;
        }
        self.gate().await?;
        let outcome = self.inner.raw_txn(asserts, mutations).await?;
        let delay = self.reply_delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(outcome)
    }
    async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
        self.gate().await?;
        self.inner.raw_keys(prefix).await
    }
}

/// `name`'s scheduler on its own [`FaultyBackend`] client of `ns` and its own
/// wall clock (at `at` when made), running `job`.
fn on_faulty(
    ns: &str,
    name: &str,
    at: u64,
    job: Job,
) -> (
    Scheduler,
    Arc<dyn SlotStore>,
    Arc<TokioClock>,
    Arc<FaultyBackend>,
) {
    let clock = TokioClock::at(at);
    let backend = FaultyBackend::new(ns);
    let (scheduler, store) = scheduler_on(
        backend.clone(),
        clock.clone(),
        name,
        RunStoreOptions::default(),
    );
    scheduler.add_job(job).unwrap();
    (scheduler, store, clock, backend)
}

fn scheduler_on(
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    name: &str,
    options: RunStoreOptions,
) -> (Scheduler, Arc<dyn SlotStore>) {
    let poll = SchedulerOptions::instance(name).with_poll_interval(Duration::from_millis(200));
    scheduler_with(backend, clock, options, poll)
}

/// `(instant the handler saw its lease lost, or None)` per run.
type LostLog = Arc<Mutex<Vec<(Slot, Option<tokio::time::Instant>)>>>;

/// A handler that runs up to `work`, stopping early when its lease is lost.
fn lease_watcher(lost: &LostLog, log: &RunLog, instance: &str, work: Duration) -> Handler {
    let lost = lost.clone();
    logging(log, instance, move |ctx| {
        let lost = lost.clone();
        async move {
            let seen = tokio::select! {
                _ = ctx.lease_lost() => Some(tokio::time::Instant::now()),
                _ = tokio::time::sleep(work) => None,
            };
            assert_eq!(seen.is_some(), ctx.is_lease_lost());
            lost.lock().unwrap().push((ctx.slot, seen));
            Ok(())
        }
    })
}

async fn wait_for_len<T>(log: &Arc<Mutex<Vec<T>>>, n: usize, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while log.lock().unwrap().len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing recorded within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A holder cut off from the store (heartbeats fail or hang) learns that its
/// lease ran out by its own monotonic clock, counted from when the claim was
/// SENT (its reply here arrives 0.5 s late): at most one lease after sending.
#[tokio::test(start_paused = true)]
async fn a_holder_cut_off_from_the_store_learns_its_lease_ran_out() {
    let ttl = Duration::from_secs(3);
    for (mode, what) in [
        (UNAVAILABLE, "Unavailable"),
        (INDETERMINATE, "Indeterminate"),
        (HANG, "hanging"),
    ] {
        let ns = unique_namespace("cut_off");
        let slot = T0 - T0 % HOUR + HOUR;
        let (lost, log): (LostLog, RunLog) = Default::default();
        let opts = leased(ttl, Duration::from_secs(10));
        let watcher = lease_watcher(&lost, &log, "a", 10 * ttl);
        let (a, _, clock, backend) = on_faulty(&ns, "a", slot, every("every 1h", opts, watcher));
        // The claim's reply arrives 0.5 s after it was sent (before the
        // first heartbeat is due): the lease counts from the sending.
        backend.reply_delay_ms.store(500, Ordering::SeqCst);
        let sent = tokio::time::Instant::now();
        let report = a.tick_at(clock.now_millis()).await;
        assert_eq!(report.started(), vec![("job", slot)], "{what}: {report:?}");
        backend.reply_delay_ms.store(0, Ordering::SeqCst);
        backend.set(mode);
        wait_for_len(&lost, 1, 20 * ttl).await;
        let seen = lost.lock().unwrap()[0].1;
        let Some(at) = seen else {
            panic!(
                "{what} heartbeats: the handler never learned its lease ran out (ran {:?})",
                10 * ttl
            );
        };
        assert!(
            at <= sent + ttl,
            "{what} heartbeats: lease lost noticed {:?} after the claim was sent (lease {ttl:?})",
            at - sent
        );
    }
}

/// A heartbeat that never answers is timed out and the next one renews the
/// lease: the holder keeps its run, and a backup never takes it over.
#[tokio::test(start_paused = true)]
async fn a_hung_heartbeat_is_timed_out_and_the_lease_kept() {
    let ttl = Duration::from_secs(3);
    let ns = unique_namespace("hung_heartbeat");
    let slot = T0 - T0 % HOUR + HOUR;
    let (lost, log): (LostLog, RunLog) = Default::default();
    let opts = leased(ttl, Duration::from_secs(60));
    // One wall clock for both: b looks at the slot exactly when a does.
    let clock = TokioClock::at(slot);
    let [(a, backend), (b, _)] = ["a", "b"].map(|name| {
        let backend = FaultyBackend::new(&ns);
        let (s, _) = scheduler_on(
            backend.clone(),
            clock.clone(),
            name,
            RunStoreOptions::default(),
        );
        let watcher = lease_watcher(&lost, &log, name, 8 * ttl);
        s.add_job(every("every 1h", opts.clone(), watcher)).unwrap();
        (s, backend)
    });
    assert_eq!(a.tick_at(clock.now_millis()).await.started().len(), 1);
    backend.hang_next.store(1, Ordering::SeqCst); // a's first heartbeat
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let report = b.tick_at(clock.now_millis()).await;
        assert!(
            report.started().is_empty(),
            "b took over a live holder whose one heartbeat hung: {report:?}"
        );
    }
    wait_for_len(&lost, 1, 20 * ttl).await;
    assert_eq!(lost.lock().unwrap()[0], (slot, None), "a lost its lease");
}

/// A follower that did not tick for longer than the store remembers claims
/// must not claim the forgotten slot again: a followed slot becomes late
/// like any other.
#[tokio::test]
async fn a_paused_follower_never_claims_a_forgotten_slot() {
    let ns = unique_namespace("paused_follower");
    let log: RunLog = Arc::default();
    let window = Some(Duration::from_secs(10));
    let start = T0 - T0 % MIN + MIN;
    let (ca, cb) = (
        Arc::new(ManualClock::at_millis(start)),
        Arc::new(ManualClock::at_millis(start)),
    );
    let memory =
        || -> Arc<dyn Backend> { Arc::new(SingleProcessMemoryBackend::shared(&ns).unwrap()) };
    let options = RunStoreOptions::default().with_forget_claims_after(window);
    let (a, _) = scheduler_on(memory(), ca.clone(), "a", options.clone());
    let (b, b_store) = scheduler_on(memory(), cb.clone(), "b", options);
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let opts = leased(Duration::from_secs(3), Duration::from_secs(5));
    a.add_job(every("every 1m", opts.clone(), gated(&log, &gate, "a")))
        .unwrap();
    b.add_job(every("every 1m", opts, gated(&log, &gate, "b")))
        .unwrap();
    assert_eq!(a.tick_at(start).await.started(), vec![("job", start)]);
    let rb = b.tick_at(start + 100).await;
    assert!(
        matches!(rb.events[0].action, TickAction::HeldElsewhere { .. }),
        "{rb:?}"
    );
    // a finishes the slot; a minute later it runs the next one and forgets
    // the first claim (finished longer than the window ago).
    ca.set(UNIX_EPOCH + Duration::from_millis(start + 2 * SEC));
    gate.add_permits(1);
    a.wait_idle().await;
    ca.set(UNIX_EPOCH + Duration::from_millis(start + MIN));
    assert_eq!(
        a.tick_at(start + MIN).await.started(),
        vec![("job", start + MIN)]
    );
    gate.add_permits(1);
    a.wait_idle().await;
    assert!(b_store
        .history("job", 10)
        .await
        .unwrap()
        .iter()
        .any(|r| r.slot == start));
    // b was paused for a minute and comes back.
    cb.set(UNIX_EPOCH + Duration::from_millis(start + MIN + 500));
    gate.add_permits(10);
    let rb = b.tick_at(start + MIN + 500).await;
    b.wait_idle().await;
    assert!(
        !rb.started().contains(&("job", start)),
        "the paused follower ran a forgotten slot again: {rb:?}"
    );
    assert_eq!(slots_run(&log).get(&start), Some(&1));
}

/// A follower whose wall clock steps +1 h must not take over a live holder
/// (heartbeating normally); neither may an instance whose clock was +1 h
/// from its first look. When the holder really stops, the slot is taken over.
#[tokio::test(start_paused = true)]
async fn a_clock_step_on_a_follower_never_takes_over_a_live_holder() {
    let ttl = Duration::from_secs(3);
    let ns = unique_namespace("stepped_follower");
    let slot = T0 - T0 % (24 * HOUR) + 24 * HOUR;
    let (lost, log): (LostLog, RunLog) = Default::default();
    let opts = leased(ttl, Duration::from_secs(2 * 3600));
    let make = |name: &str| {
        let watcher = lease_watcher(&lost, &log, name, 20 * ttl);
        on_faulty(&ns, name, slot, every("every 1d", opts.clone(), watcher))
    };
    let (a, _, ca, a_backend) = make("a");
    let (b, _, cb, _) = make("b");
    let (c, _, cc, _) = make("c");
    cc.step_forward(Duration::from_secs(3600));
    assert_eq!(a.tick_at(ca.now_millis()).await.started().len(), 1);
    let rb = b.tick_at(cb.now_millis()).await;
    assert!(
        matches!(rb.events[0].action, TickAction::HeldElsewhere { .. }),
        "{rb:?}"
    );
    cb.step_forward(Duration::from_secs(3600));
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (s, clock) in [(&b, &cb), (&c, &cc)] {
            let r = s.tick_at(clock.now_millis()).await;
            assert!(
                r.started().is_empty(),
                "{} (clock +1 h) took over a live holder: {r:?}",
                s.instance_id()
            );
        }
    }
    assert!(
        lost.lock().unwrap().is_empty(),
        "a lost its lease: {:?}",
        lost.lock().unwrap()
    );
    // a is cut off for good: once its lease is over (a knows it) a backup takes over.
    a_backend.set(HANG);
    let mut taken = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (s, clock) in [(&b, &cb), (&c, &cc)] {
            if !s.tick_at(clock.now_millis()).await.started().is_empty() {
                taken = true;
            }
        }
        if taken {
            break;
        }
    }
    assert!(
        taken,
        "nobody took over the slot of a holder cut off for good"
    );
    let mut lost = lost.lock().unwrap().clone();
    lost.retain(|(s, _)| *s == slot);
    assert!(
        lost.first().is_some_and(|(_, at)| at.is_some()),
        "a never learned it lost the lease: {lost:?}"
    );
}

/// The soak's survivor: one instance on a slow store (20 ms a call), 20 jobs
/// every second; another instance is stopped while it holds the store's
/// write lock (every txn waits, as on SQLite) for 6.6 s. Once the store
/// answers again the survivor runs every slot still within `max_late`, and
/// every later slot, on time.
#[tokio::test(start_paused = true)]
async fn a_stopped_instance_holding_the_store_does_not_stall_the_survivor() {
    let ns = unique_namespace("stopped");
    let start = T0 - T0 % MIN + MIN;
    let clock = TokioClock::at(start);
    let (freeze, frozen) = tokio::sync::watch::channel(false);
    let backend = Arc::new(FaultyBackend::with(&ns, 20, Some(frozen)));
    let (c, store) = scheduler_on(
        backend,
        clock.clone(),
        "c",
        RunStoreOptions::default().with_history_size(200),
    );
    let log: RunLog = Arc::default();
    let max_late = Duration::from_secs(5);
    let opts = leased(Duration::from_secs(3), max_late);
    for i in 0..20 {
        let job = Job::new(
            format!("soak-{i:02}"),
            Schedule::parse("every 1s", None).unwrap(),
            recorder(&log, "c"),
        )
        .with_options(opts.clone());
        c.add_job(job).unwrap();
    }
    c.start();
    tokio::time::sleep(Duration::from_millis(10_600)).await;
    let stopped_at = clock.now_millis();
    freeze.send_replace(true);
    tokio::time::sleep(Duration::from_millis(6_600)).await;
    freeze.send_replace(false);
    let resumed_at = clock.now_millis();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let end = clock.now_millis();
    c.shutdown().await;
    let mut missing = Vec::new();
    for i in 0..20 {
        let job = format!("soak-{i:02}");
        let ran: BTreeMap<Slot, RunRecord> = store
            .history(&job, 200)
            .await
            .unwrap()
            .into_iter()
            .map(|r| (r.slot, r))
            .collect();
        // Slots still within max_late (with a second to spare) when the store
        // came back, and every slot after, until 2 s before the end.
        let from = (resumed_at - millis(max_late) + SEC).div_ceil(SEC) * SEC;
        let mut slot = from;
        while slot + 2 * SEC < end {
            match ran.get(&slot) {
                Some(r) if r.status == RunStatus::Succeeded => {}
                other => missing.push(format!(
                    "{job} slot +{} ms after the stop: {:?}",
                    slot as i64 - stopped_at as i64,
                    other.map(|r| r.status)
                )),
            }
            slot += SEC;
        }
    }
    assert!(
        missing.is_empty(),
        "{} slot(s) missed after the store came back at +{} ms:\n{}",
        missing.len(),
        resumed_at - stopped_at,
        missing.join("\n")
    );
}

fn millis(d: Duration) -> u64 {
    d.as_millis() as u64
}

// ---------------------------------------------------------------------------
// Retries (JobOptions::with_retry), on paused tokio time: the wall clock
// (TokioClock) and the monotonic one move together, and a backoff or a
// heartbeat sleep advances them without any real wait.
// ---------------------------------------------------------------------------

/// `(attempt seen by the handler, monotonic instant it started)` per run.
type AttemptLog = Arc<Mutex<Vec<(u32, tokio::time::Instant)>>>;

/// A handler that logs each attempt, then fails while `fails(attempt)`
/// says so (with the message `boom <attempt>`).
fn failing(log: &AttemptLog, fails: impl Fn(u32) -> bool + Send + Sync + 'static) -> Handler {
    let (log, fails) = (log.clone(), Arc::new(fails));
    handler(move |ctx: RunContext| {
        let (log, fails) = (log.clone(), fails.clone());
        async move {
            log.lock()
                .unwrap()
                .push((ctx.attempt, tokio::time::Instant::now()));
            if fails(ctx.attempt) {
                return Err(format!("boom {}", ctx.attempt).into());
            }
            Ok(())
        }
    })
}

/// The next hourly slot after [`T0`].
fn hourly_slot() -> Slot {
    T0 - T0 % HOUR + HOUR
}

/// One instance `a` on its own FaultyBackend client of a fresh namespace,
/// at the next hourly slot, running "job" hourly with `opts` and `h`; the
/// run of that slot is started (and left running).
async fn retrying(
    prefix: &str,
    opts: JobOptions,
    h: Handler,
) -> (Scheduler, Arc<dyn SlotStore>, Arc<FaultyBackend>) {
    let ns = unique_namespace(prefix);
    let slot = hourly_slot();
    let (a, store, clock, backend) = on_faulty(&ns, "a", slot, every("every 1h", opts, h));
    let report = a.tick_at(clock.now_millis()).await;
    assert_eq!(report.started(), vec![("job", slot)], "{report:?}");
    (a, store, backend)
}

async fn slot_record(store: &Arc<dyn SlotStore>) -> RunRecord {
    let history = store.history("job", 10).await.unwrap();
    history
        .into_iter()
        .find(|r| r.slot == hourly_slot())
        .expect("the slot is in history")
}

/// A handler that fails twice is run a third time and succeeds: each retry
/// waits its backoff (doubling from 10 s, jittered in [d/2, d]), holds the
/// lease all along (heartbeats every second on a 3 s lease: a backoff of
/// 10-20 s outlives several leases), and history shows 3 attempts.
#[tokio::test(start_paused = true)]
async fn a_failing_handler_is_retried_after_its_backoff_until_it_succeeds() {
    let log: AttemptLog = Arc::default();
    let opts = leased(Duration::from_secs(3), Duration::from_secs(600)).with_retry(
        5,
        Backoff::exponential(Duration::from_secs(10), Duration::from_secs(60)),
    );
    let (a, store, _) = retrying("retry_success", opts, failing(&log, |n| n < 3)).await;
    a.wait_idle().await;
    let runs = log.lock().unwrap().clone();
    assert_eq!(
        runs.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        vec![1, 2, 3],
        "attempts seen by the handler"
    );
    for (i, (lo, hi)) in [(5, 10), (10, 20)].into_iter().enumerate() {
        let waited = runs[i + 1].1 - runs[i].1;
        assert!(
            waited >= Duration::from_secs(lo)
                && waited <= Duration::from_secs(hi) + Duration::from_millis(50),
            "retry {} started {waited:?} after the failure, not within [{lo}s, {hi}s]",
            i + 1
        );
    }
    let record = slot_record(&store).await;
    assert_eq!(
        (
            record.status,
            record.attempts,
            record.takeovers,
            record.message.clone()
        ),
        (RunStatus::Succeeded, 3, 0, None),
        "{record:?}"
    );
    assert!(store.active("job").await.unwrap().is_empty());
    a.shutdown().await;
}

/// Out of attempts: the run finishes failed with the last error, and
/// history shows every attempt it started.
#[tokio::test(start_paused = true)]
async fn exhausted_attempts_finish_failed_with_the_last_error() {
    let log: AttemptLog = Arc::default();
    let opts = leased(Duration::from_secs(3), Duration::from_secs(600))
        .with_retry(3, Backoff::fixed(Duration::from_secs(2)));
    let (a, store, _) = retrying("retry_exhausted", opts, failing(&log, |_| true)).await;
    a.wait_idle().await;
    assert_eq!(log.lock().unwrap().len(), 3, "three attempts in all");
    let record = slot_record(&store).await;
    assert_eq!(
        (record.status, record.attempts, record.message.as_deref()),
        (RunStatus::Failed, 3, Some("boom 3")),
        "{record:?}"
    );
    a.shutdown().await;
}

/// A retry starts only while the slot is still within its lateness bound
/// (slot + max_late, no jitter here): a backoff that always ends past it
/// (waits of 20-40 s, max_late 15 s) means no retry at all; with waits of
/// 5-10 s and max_late 30 s, every attempt starts within the bound.
#[tokio::test(start_paused = true)]
async fn the_lateness_bound_stops_retries() {
    let log: AttemptLog = Arc::default();
    let opts = leased(Duration::from_secs(3), Duration::from_secs(15))
        .with_retry(10, Backoff::fixed(Duration::from_secs(40)));
    let (a, store, _) = retrying("retry_late", opts, failing(&log, |_| true)).await;
    a.wait_idle().await;
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "retried past the lateness bound"
    );
    let record = slot_record(&store).await;
    assert_eq!((record.status, record.attempts), (RunStatus::Failed, 1));
    a.shutdown().await;

    let log: AttemptLog = Arc::default();
    let opts = leased(Duration::from_secs(3), Duration::from_secs(30))
        .with_retry(10, Backoff::fixed(Duration::from_secs(10)));
    let (a, store, _) = retrying("retry_late_some", opts, failing(&log, |_| true)).await;
    let started = tokio::time::Instant::now();
    a.wait_idle().await;
    let runs = log.lock().unwrap().clone();
    assert!(
        (3..10).contains(&runs.len()),
        "{} attempts: 5-10 s waits within 30 s allow 3 to 7",
        runs.len()
    );
    for (n, at) in &runs {
        assert!(
            *at - started <= Duration::from_secs(30),
            "attempt {n} started {:?} after the slot (max_late 30 s)",
            *at - started
        );
    }
    let record = slot_record(&store).await;
    assert_eq!(
        (record.status, record.attempts as usize),
        (RunStatus::Failed, runs.len())
    );
    a.shutdown().await;
}

/// A holder that loses its lease during the backoff (its heartbeats hang
/// for longer than the lease, then the store answers again, and nobody has
/// taken the slot over) does not retry: a backup may be starting.
#[tokio::test(start_paused = true)]
async fn a_lost_lease_stops_retries() {
    let log: AttemptLog = Arc::default();
    let opts = leased(Duration::from_secs(3), Duration::from_secs(600))
        .with_retry(5, Backoff::fixed(Duration::from_secs(20)));
    let (a, store, backend) = retrying("retry_lost", opts, failing(&log, |_| true)).await;
    wait_for_len(&log, 1, Duration::from_secs(1)).await;
    backend.set(HANG);
    tokio::time::sleep(Duration::from_secs(8)).await;
    backend.set(FINE);
    tokio::time::sleep(Duration::from_secs(60)).await;
    a.wait_idle().await;
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "retried after its lease was lost"
    );
    assert_eq!(slot_record(&store).await.attempts, 1);
    a.shutdown().await;
}

/// A holder paused through its backoff (its store calls hang past the
/// lease) is taken over by a backup, whose run is the next attempt; the
/// holder, answered again, finds its attempt refused and never runs again.
#[tokio::test(start_paused = true)]
async fn a_takeover_during_the_backoff_is_the_next_attempt() {
    let ns = unique_namespace("retry_takeover");
    let slot = hourly_slot();
    let max_late = Duration::from_secs(600);
    let opts = leased(Duration::from_secs(3), max_late)
        .with_retry(3, Backoff::fixed(Duration::from_secs(30)));
    let (a_log, b_log): (AttemptLog, AttemptLog) = Default::default();
    let (a, _, ca, a_backend) = on_faulty(
        &ns,
        "a",
        slot,
        every("every 1h", opts.clone(), failing(&a_log, |_| true)),
    );
    let (b, b_store, cb, _) = on_faulty(
        &ns,
        "b",
        slot,
        every("every 1h", opts, failing(&b_log, |_| false)),
    );
    assert_eq!(a.tick_at(ca.now_millis()).await.started().len(), 1);
    wait_for_len(&a_log, 1, Duration::from_secs(1)).await;
    a_backend.set(HANG);
    let mut taken = false;
    while !taken && cb.now_millis() < slot + millis(max_late) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        taken = b.tick_at(cb.now_millis()).await.started().len() == 1;
    }
    assert!(taken, "b never took the slot over");
    b.wait_idle().await;
    a_backend.set(FINE);
    tokio::time::sleep(Duration::from_secs(120)).await;
    a.wait_idle().await;
    assert_eq!(
        a_log.lock().unwrap().len(),
        1,
        "a ran again after the takeover"
    );
    let b_runs: Vec<u32> = b_log.lock().unwrap().iter().map(|(n, _)| *n).collect();
    assert_eq!(b_runs, vec![2], "the takeover is attempt 2");
    let history = b_store.history("job", 10).await.unwrap();
    let record = history.iter().find(|r| r.slot == slot).unwrap();
    assert_eq!(
        (
            record.status,
            record.instance.as_str(),
            record.attempts,
            record.takeovers
        ),
        (RunStatus::Succeeded, "b", 2, 1),
        "{record:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn bad_retry_policies_are_refused_typed() {
    let [a] = instances("retry_refusals", ["a"], T0);
    let h = handler(|_| async { Ok(()) });
    let s = Schedule::parse("every 1s", None).unwrap();
    let second = Duration::from_secs(1);
    for (retry, why) in [
        ((0, Backoff::fixed(second)), "max_attempts"),
        ((3, Backoff::fixed(Duration::ZERO)), "positive"),
        ((3, Backoff::exponential(2 * second, second)), "below"),
    ] {
        let opts = JobOptions::default().with_retry(retry.0, retry.1);
        match a
            .scheduler
            .add_job(Job::new("r", s.clone(), h.clone()).with_options(opts))
        {
            Err(Error::InvalidArgument(message)) => {
                assert!(message.contains(why), "{message}")
            }
            other => panic!("{retry:?} was not refused: {other:?}"),
        }
    }
    assert!(a.scheduler.job_names().is_empty());
}

/// A retry whose recording gets no answer (`Indeterminate`) is not run on a
/// guess: the instance asks the store again (a third of a lease later) and
/// runs the attempt only once the store has accepted it.
#[tokio::test(start_paused = true)]
async fn an_unanswered_attempt_is_asked_again_never_run_on_a_guess() {
    let log: AttemptLog = Arc::default();
    // Heartbeats every 10 s; waits of 1-2 s.
    let opts = leased(Duration::from_secs(30), Duration::from_secs(600))
        .with_retry(3, Backoff::fixed(Duration::from_secs(2)));
    let (a, store, backend) = retrying("retry_unanswered", opts, failing(&log, |n| n < 2)).await;
    wait_for_len(&log, 1, Duration::from_secs(1)).await;
    let failed_at = log.lock().unwrap()[0].1;
    backend.set(INDETERMINATE);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "retried without a recorded attempt"
    );
    backend.set(FINE);
    a.wait_idle().await;
    let runs = log.lock().unwrap().clone();
    assert_eq!(runs.iter().map(|(n, _)| *n).collect::<Vec<_>>(), vec![1, 2]);
    assert!(
        runs[1].1 - failed_at >= Duration::from_secs(5),
        "attempt 2 started {:?} after the failure, before the store answered",
        runs[1].1 - failed_at
    );
    let record = slot_record(&store).await;
    assert_eq!((record.status, record.attempts), (RunStatus::Succeeded, 2));
    a.shutdown().await;
}
