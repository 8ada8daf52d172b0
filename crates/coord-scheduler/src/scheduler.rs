//! The scheduler runtime: ticks, claims, runs handlers, heartbeats, finishes.
//!
//! # What one tick does, per job
//!
//! 1. Every slot whose fire time (`slot + jitter(job, slot)`) has come is
//!    **due**. A due slot later than `max_late` (`now > slot + jitter +
//!    max_late`) is **skipped** and, for coordinated jobs, recorded in the
//!    store's history once (a skip record never blocks an instance that is
//!    still on time from claiming the slot). At start an instance looks back
//!    `max_late + jitter`, so slots missed while every instance was down are
//!    **caught up** within that bound.
//! 2. Each remaining due slot is **claimed** (coordinated jobs) or run
//!    locally (`NodeLocal`, or `PreferGlobal` without a store). A won claim
//!    spawns the handler with heartbeats every `lease_ttl / 3`; when it ends
//!    the run is finished by token (or released on shutdown).
//! 3. A lost claim is not retried blindly: a slot held elsewhere is
//!    *followed*: looked at every third of its lease, and taken over only
//!    once the holder's lease stayed unchanged for a full lease on this
//!    instance's **monotonic** clock and the store's clock says it expired
//!    (so a backup takes over a crashed holder's slot, but a wall clock
//!    stepped forward never makes a live holder look dead). A slot blocked
//!    by overlap or by a broken store is retried on the next ticks. Every
//!    pending slot, followed ones included, is dropped once it is late, so
//!    a slot is never claimed after its claim could have been forgotten
//!    (`add_job` keeps `jitter + max_late` below the dedupe window). A retry
//!    after a store error reuses its token, so a claim whose reply was lost
//!    is recognised as ours.
//!
//! # Leases and a slow or unreachable store
//!
//! - A run's lease is known locally, like `LockGuard`'s: it ends one TTL
//!   after the last *confirmed* claim or heartbeat was **sent**, on the
//!   monotonic clock. Heartbeats that fail, or do not answer before the next
//!   one is due, do not extend it; when it ends,
//!   [`RunContext::is_lease_lost`] turns true (a backup may be starting).
//! - Every store call is bounded ([`SchedulerOptions::store_timeout`];
//!   heartbeats by a third of the lease): a store that hangs, e.g. a stopped process holding
//!   SQLite's write lock, costs a failed attempt, not a stalled instance.
//! - Jobs tick a few at a time, lateness is judged again just before each
//!   claim, claims come before skip records (which stop after a poll
//!   interval), and a finished run wakes the loop: after a stall the
//!   instance runs what is still within `max_late` instead of spending the
//!   time writing history.
//!
//! # Clocks
//!
//! The clock only decides *when* an instance looks at a slot, never *which*
//! slot it is (slots are schedule instants), and a slot is claimed per
//! instant, so a wall-clock jump on one instance never runs a slot twice:
//!
//! - **Backwards** (e.g. −1 h): the instance's cursor does not move back, so it
//!   waits until its clock passes the cursor again; a restarted instance that
//!   re-examines old slots finds them done in the store.
//! - **Forwards** (e.g. +1 h): the instance treats the hour it jumped over as
//!   missed: slots within `max_late` of its (wrong) clock are claimed early,
//!   older ones are recorded as skipped for it. Instances with the right time
//!   still claim the recorded-as-skipped slots when they come (skip records do
//!   not block claims) and find the early-claimed ones done. Keep clocks in
//!   sync (NTP): a skewed instance only ever changes *when*, never *how many
//!   times*.
//!
//! Ticks are driven by [`Scheduler::start`] (a loop on the injected
//! [`Clock`]) or by hand with [`Scheduler::tick_at`] (tests).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::mint_token;
use coord_backend::Clock;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::store::validate_job_name;
use crate::{
    jitter_for, ClaimOutcome, ClaimRequest, Error, FinalStatus, Handler, Job, LockingHint,
    ManualRun, RunContext, SkipReason, Slot, SlotStore, Takeover,
};

/// Options of a [`Scheduler`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SchedulerOptions {
    /// This instance's name in history and logs (default: `$HOSTNAME-<random>`).
    pub instance_id: String,
    /// Longest sleep of the tick loop (default 500 ms): how soon a retried
    /// slot is looked at again.
    pub poll_interval: Duration,
    /// Skipped slots recorded one by one per job and tick (default 20); more
    /// are logged as one line (after a long stall or a big clock jump).
    pub max_skips_recorded_per_tick: usize,
    /// Due slots started per job and tick (default 100); the rest wait for
    /// the next tick (and may become late).
    pub max_starts_per_tick: usize,
    /// Longest wait for one store call (default 10 s): a claim, skip record,
    /// finish or release that does not answer by then is treated as failed
    /// (a claim is retried with the same token, so one that landed late is
    /// still recognised as ours). Heartbeats are bounded by a third of the
    /// job's lease. A store that hangs (a stopped
    /// process holding its write lock, a dead connection) must not stall
    /// every job of the instance.
    pub store_timeout: Duration,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "instance".into());
        SchedulerOptions {
            instance_id: format!("{host}-{}", &mint_token()[..8]),
            poll_interval: Duration::from_millis(500),
            max_skips_recorded_per_tick: 20,
            max_starts_per_tick: 100,
            store_timeout: Duration::from_secs(10),
        }
    }
}

impl SchedulerOptions {
    /// Options with this instance id.
    pub fn instance(id: impl Into<String>) -> Self {
        SchedulerOptions {
            instance_id: id.into(),
            ..SchedulerOptions::default()
        }
    }

    /// Set the poll interval.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// Set the longest wait for one store call.
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = timeout;
        self
    }
}

/// What a tick did with one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickAction {
    /// The handler was started (`coordinated = false`: a local run).
    Started {
        /// Whether the slot was taken over from an expired or released holder.
        takeover: bool,
        /// Whether the run is coordinated through the store.
        coordinated: bool,
    },
    /// Another instance holds the slot; it is looked at again (and taken
    /// over once its lease stayed unchanged for a full lease on this
    /// instance's monotonic clock and expired) until it becomes late.
    HeldElsewhere {
        /// The holder.
        holder: Option<String>,
    },
    /// The slot's run is already finished.
    AlreadyDone,
    /// Another slot of the job is running (store-wide); retried until late.
    Overlap {
        /// The blocking slot.
        running_slot: Slot,
    },
    /// Another slot of the job is running on this instance (local runs); retried until late.
    LocalOverlap,
    /// Too late to start: skipped.
    Late {
        /// Why it could not run in time.
        reason: SkipReason,
        /// Whether this instance recorded the skip in the store's history.
        recorded: bool,
    },
    /// Slots before this instant were skipped without being listed one by one.
    LateUnlisted {
        /// Every slot of the job before this instant (and after the previous cursor) was skipped.
        before: Slot,
    },
    /// The store failed: the slot is skipped this tick (and retried until late).
    StoreError {
        /// The error.
        message: String,
    },
}

/// One thing a tick did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickEvent {
    /// The job.
    pub job: String,
    /// The slot.
    pub slot: Slot,
    /// What happened.
    pub action: TickAction,
}

/// Everything one tick did, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickReport {
    /// The tick's time (UTC ms).
    pub now_ms: u64,
    /// What happened, per slot.
    pub events: Vec<TickEvent>,
}

impl TickReport {
    /// The `(job, slot)`s whose handler this tick started.
    pub fn started(&self) -> Vec<(&str, Slot)> {
        self.events
            .iter()
            .filter(|e| matches!(e.action, TickAction::Started { .. }))
            .map(|e| (e.job.as_str(), e.slot))
            .collect()
    }

    /// The events of one job.
    pub fn of<'a>(&'a self, job: &'a str) -> impl Iterator<Item = &'a TickEvent> + 'a {
        self.events.iter().filter(move |e| e.job == job)
    }
}

/// The result of [`Scheduler::run_now`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManualReport {
    /// The run's slot in history (when it started, UTC ms).
    pub slot: Slot,
    /// How it ended.
    pub status: FinalStatus,
    /// Whether it was recorded in the store.
    pub recorded: bool,
}

/// A slot held by another instance, as this one follows it.
#[derive(Clone, Debug)]
struct Follow {
    /// The holder's `lease_until_ms` as last seen in the store.
    lease_until: u64,
    /// When (monotonic) that value was first seen. A takeover is only asked
    /// for once it stayed the same for a full lease: by then the holder,
    /// which counts its lease from when its last confirmed heartbeat was
    /// sent, has stopped considering itself the owner (a wall clock stepped
    /// forward on this instance cannot shorten that).
    seen_since: Instant,
    /// When (monotonic) to look at the slot again.
    look_at: Instant,
}

// No `Debug`: a retry carries its token.
#[derive(Clone)]
enum Pending {
    /// Held elsewhere: followed until taken over, done, or late.
    Following(Follow),
    /// Blocked by a running slot (store-wide).
    Overlap,
    /// Blocked by a local run of another slot.
    LocalOverlap,
    /// The store failed; retry with the same token (it may have won).
    StoreError { token: String },
}

#[derive(Default)]
struct JobState {
    initialized: bool,
    cursor: Option<Slot>,
    pending: BTreeMap<Slot, Pending>,
    local_running: BTreeSet<Slot>,
}

struct JobEntry {
    job: Job,
    coordinated: bool,
    state: Mutex<JobState>,
}

struct Inner {
    options: SchedulerOptions,
    /// Woken when a run ends, so a slot blocked by it (no overlap) is
    /// claimed at once instead of on the next poll.
    wake: tokio::sync::Notify,
    clock: Arc<dyn Clock>,
    store: Option<Arc<dyn SlotStore>>,
    jobs: Mutex<BTreeMap<String, Arc<JobEntry>>>,
    tick_lock: tokio::sync::Mutex<()>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    shutdown: watch::Sender<bool>,
    loop_task: Mutex<Option<JoinHandle<()>>>,
}

/// Runs registered jobs, exactly once per `(job, slot)` across every
/// scheduler sharing a store (see the module docs). Cheap to clone.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_backend::{Backend, ManualClock};
/// use coord_memory::SingleProcessMemoryBackend;
/// use coord_scheduler::{handler, Job, JobOptions, RunStore, RunStoreOptions, Schedule, Scheduler, SchedulerOptions, SlotStore};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("doc").unwrap());
/// let clock = Arc::new(ManualClock::at_millis(1_000));
/// let store: Arc<dyn SlotStore> =
///     Arc::new(RunStore::new(backend, clock.clone(), RunStoreOptions::default()).unwrap());
///
/// // Two instances share the store: each slot runs on one of them.
/// let a = Scheduler::new(Some(store.clone()), clock.clone(), SchedulerOptions::instance("a"));
/// let b = Scheduler::new(Some(store.clone()), clock.clone(), SchedulerOptions::instance("b"));
/// for s in [&a, &b] {
///     let job = Job::new("tick", Schedule::parse("every 1s", None).unwrap(), handler(|_| async { Ok(()) }))
///         .with_options(JobOptions::default().max_late(Duration::ZERO)); // no catch-up of slot 1000
///     s.add_job(job).unwrap();
/// }
/// clock.advance(Duration::from_secs(1));
/// let (ra, rb) = tokio::join!(a.tick_at(2_000), b.tick_at(2_000));
/// let runs_of_2000 = [&ra, &rb]
///     .iter()
///     .flat_map(|r| r.started())
///     .filter(|(_, slot)| *slot == 2_000)
///     .count();
/// assert_eq!(runs_of_2000, 1);
/// a.wait_idle().await;
/// b.wait_idle().await;
/// assert_eq!(store.history("tick", 10).await.unwrap()[0].slot, 2_000);
/// # });
/// ```
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

impl fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scheduler")
            .field("instance", &self.inner.options.instance_id)
            .field("store", &self.inner.store)
            .finish_non_exhaustive()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Jobs ticked at once by one instance.
const TICK_CONCURRENCY: usize = 4;

/// `call`, or a store error if it does not answer within `bound`. A call
/// that timed out may still have been applied: it is `Indeterminate`.
async fn bounded<T>(
    bound: Duration,
    what: &str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(bound, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Store(coord_backend::Error::Indeterminate {
            message: format!("{what}: no answer from the run store within {bound:?}"),
            source: None,
        })),
    }
}

async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    if rx.wait_for(|stop| *stop).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Run `handler` in its own task (a panic becomes a failure), bounded by
/// `timeout`, alongside `side` (heartbeats; never completes). `None` = shutdown.
async fn execute(
    handler: &Handler,
    ctx: RunContext,
    timeout: Option<Duration>,
    side: impl Future<Output = ()>,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<FinalStatus> {
    let task = tokio::spawn(handler(ctx));
    let abort = task.abort_handle();
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        joined = task => Some(match joined {
            Ok(Ok(())) => FinalStatus::Succeeded,
            Ok(Err(e)) => FinalStatus::Failed(e.to_string()),
            Err(e) if e.is_panic() => FinalStatus::Failed("handler panicked".into()),
            Err(_) => FinalStatus::Failed("handler cancelled".into()),
        }),
        _ = deadline => {
            abort.abort();
            Some(FinalStatus::TimedOut)
        }
        _ = side => unreachable_side(),
        _ = wait_shutdown(shutdown) => {
            abort.abort();
            None
        }
    }
}

fn unreachable_side() -> Option<FinalStatus> {
    // The side future loops forever; should it ever end, treat as a failure.
    Some(FinalStatus::Failed("heartbeat loop ended".into()))
}

impl Scheduler {
    /// A scheduler over an optional run store (`None`: only `NodeLocal` and
    /// `PreferGlobal` jobs, run locally), reading time from `clock`.
    pub fn new(
        store: Option<Arc<dyn SlotStore>>,
        clock: Arc<dyn Clock>,
        options: SchedulerOptions,
    ) -> Self {
        let (shutdown, _) = watch::channel(false);
        Scheduler {
            inner: Arc::new(Inner {
                options,
                wake: tokio::sync::Notify::new(),
                clock,
                store,
                jobs: Mutex::default(),
                tick_lock: tokio::sync::Mutex::new(()),
                tasks: Mutex::default(),
                shutdown,
                loop_task: Mutex::default(),
            }),
        }
    }

    /// This instance's id.
    pub fn instance_id(&self) -> &str {
        &self.inner.options.instance_id
    }

    /// The run store, if one is configured.
    pub fn store(&self) -> Option<&Arc<dyn SlotStore>> {
        self.inner.store.as_ref()
    }

    /// Register a job. Refused with a typed error when its name is invalid
    /// or taken, its lease is zero, it requires a store that is missing
    /// ([`Error::NoStore`]), or the store forgets claims too soon for it
    /// ([`Error::DedupeWindowTooShort`]: `jitter + max_late`, and the lease
    /// TTL, must each be below the store's dedupe window).
    pub fn add_job(&self, job: Job) -> Result<(), Error> {
        if *self.inner.shutdown.borrow() {
            return Err(Error::ShutDown);
        }
        validate_job_name(&job.name)?;
        let options = &job.options;
        if options.lease_ttl.is_zero() {
            return Err(Error::InvalidArgument(format!(
                "job {:?}: lease_ttl must be positive",
                job.name
            )));
        }
        if options.timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::InvalidArgument(format!(
                "job {:?}: timeout must be positive",
                job.name
            )));
        }
        let coordinated = match (options.hint, &self.inner.store) {
            (LockingHint::NodeLocal, _) => false,
            (LockingHint::RequireGlobal, None) => return Err(Error::NoStore(job.name.clone())),
            (_, Some(_)) => true,
            (_, None) => false,
        };
        if let (true, Some(window)) = (
            coordinated,
            self.inner.store.as_ref().and_then(|s| s.dedupe_window()),
        ) {
            let needed = options.jitter.saturating_add(options.max_late);
            if needed >= window {
                return Err(Error::DedupeWindowTooShort {
                    job: job.name.clone(),
                    needed,
                    reason: "jitter + max_late",
                    window,
                });
            }
            if options.lease_ttl >= window {
                return Err(Error::DedupeWindowTooShort {
                    job: job.name.clone(),
                    needed: options.lease_ttl,
                    reason: "lease_ttl: a backup follows a run until a lease after it ends",
                    window,
                });
            }
        }
        let mut jobs = self.inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if jobs.contains_key(&job.name) {
            return Err(Error::DuplicateJob(job.name.clone()));
        }
        jobs.insert(
            job.name.clone(),
            Arc::new(JobEntry {
                job,
                coordinated,
                state: Mutex::default(),
            }),
        );
        Ok(())
    }

    /// Names of the registered jobs.
    pub fn job_names(&self) -> Vec<String> {
        let jobs = self.inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.keys().cloned().collect()
    }

    /// One tick at the clock's current time.
    pub async fn tick(&self) -> TickReport {
        self.tick_at(self.inner.clock.now_millis()).await
    }

    /// One tick as if the time were `now_ms` (UTC ms): start due slots,
    /// record late ones, retry pending ones. Jobs are ticked a few at a time
    /// (a slow store call of one job never delays another's claims), and
    /// lateness is judged again just before each claim with `now_ms`
    /// advanced by the monotonic time the tick has taken. Handlers run in
    /// spawned tasks; [`Scheduler::wait_idle`] waits for them. Ticks never
    /// overlap.
    pub async fn tick_at(&self, now_ms: u64) -> TickReport {
        let mut report = TickReport {
            now_ms,
            events: Vec::new(),
        };
        let _serial = self.inner.tick_lock.lock().await;
        if *self.inner.shutdown.borrow() {
            return report;
        }
        let started = Instant::now();
        let jobs: Vec<Arc<JobEntry>> = {
            let jobs = self.inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.values().cloned().collect()
        };
        // A few jobs at a time: enough that one slow call does not hold up
        // the others, few enough not to flood a single-writer store (SQLite).
        let slots = Arc::new(tokio::sync::Semaphore::new(TICK_CONCURRENCY));
        let ticks: Vec<JoinHandle<Vec<TickEvent>>> = jobs
            .into_iter()
            .map(|entry| {
                let me = self.clone();
                let slots = slots.clone();
                tokio::spawn(async move {
                    let _turn = slots.acquire_owned().await;
                    me.tick_job(&entry, now_ms, started).await
                })
            })
            .collect();
        for tick in ticks {
            match tick.await {
                Ok(events) => report.events.extend(events),
                Err(error) => tracing::error!(%error, "a job's tick failed"),
            }
        }
        report
    }

    async fn tick_job(&self, entry: &Arc<JobEntry>, now: u64, started: Instant) -> Vec<TickEvent> {
        let job = &entry.job;
        let name = job.name.as_str();
        let opts = &job.options;
        let ttl = opts.lease_ttl;
        let max_late = millis(opts.max_late);
        let look_back = max_late.saturating_add(millis(opts.jitter));
        let jitter = |slot: Slot| jitter_for(name, slot, opts.jitter);
        let late_at =
            |slot: Slot, at: u64| at > slot.saturating_add(jitter(slot)).saturating_add(max_late);
        let is_late = |slot: Slot| late_at(slot, now);
        // The tick's time, advanced by the monotonic time spent since it
        // began: a tick that waited on the store (or a process that was
        // paused) must not claim a slot that became late meanwhile.
        let fresh_now = || now.saturating_add(millis(started.elapsed()));
        let follow_every = (ttl / 3).max(Duration::from_millis(1));
        let store_timeout = self.inner.options.store_timeout;
        let mut events = Vec::new();
        let mut event = |slot, action: TickAction| {
            match &action {
                TickAction::Started { takeover: true, .. } => crate::telemetry::run("takeover"),
                TickAction::Started { .. } => crate::telemetry::run("ran"),
                TickAction::Late {
                    reason: SkipReason::Overlap,
                    ..
                } => crate::telemetry::run("skipped_overlap"),
                TickAction::Late { .. } | TickAction::LateUnlisted { .. } => {
                    crate::telemetry::run("skipped_late")
                }
                _ => {}
            }
            events.push(TickEvent {
                job: name.to_owned(),
                slot,
                action,
            })
        };

        // 1. Decide what to look at, under the state lock (no await here).
        let mut attempts: Vec<(Slot, Option<String>)> = Vec::new();
        let mut lates: Vec<(Slot, SkipReason)> = Vec::new();
        {
            let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
            if !st.initialized {
                st.initialized = true;
                st.cursor = job.schedule.next_at_or_after(now.saturating_sub(look_back));
            }
            let mono = Instant::now();
            let pending: Vec<(Slot, Pending)> =
                st.pending.iter().map(|(s, p)| (*s, p.clone())).collect();
            for (slot, p) in pending {
                if is_late(slot) {
                    // Followed slots too: a slot is never claimed past its
                    // lateness bound, which add_job keeps below the store's
                    // dedupe window, so never after its claim could be forgotten.
                    st.pending.remove(&slot);
                    let reason = match p {
                        Pending::Overlap | Pending::LocalOverlap => SkipReason::Overlap,
                        _ => SkipReason::Late,
                    };
                    lates.push((slot, reason));
                    continue;
                }
                match p {
                    Pending::Following(f) if mono < f.look_at => {}
                    Pending::Following(_) | Pending::Overlap | Pending::LocalOverlap => {
                        attempts.push((slot, None))
                    }
                    Pending::StoreError { token } => attempts.push((slot, Some(token))),
                }
            }
            let mut started = 0usize;
            while let Some(slot) = st.cursor {
                if slot.saturating_add(jitter(slot)) > now
                    || started >= self.inner.options.max_starts_per_tick
                {
                    break;
                }
                if is_late(slot) {
                    if lates.len() >= self.inner.options.max_skips_recorded_per_tick {
                        let boundary = now.saturating_sub(look_back);
                        let next = job.schedule.next_at_or_after(boundary);
                        if next.is_some_and(|n| n > slot) || next.is_none() {
                            tracing::warn!(job = name, before = boundary, "skipped every slot before this instant (too late; not listed one by one)");
                            event(boundary, TickAction::LateUnlisted { before: boundary });
                            st.cursor = next;
                            continue;
                        }
                    }
                    lates.push((slot, SkipReason::Late));
                } else if !st.pending.contains_key(&slot) {
                    attempts.push((slot, None));
                    started += 1;
                }
                st.cursor = job.schedule.next_after(slot);
            }
        }
        attempts.sort_by_key(|(slot, _)| *slot);
        attempts.dedup_by_key(|(slot, _)| *slot);

        // 2. Runs, before recording skips: claims are what is late-sensitive.
        // Attempts are in slot order: once a slot is blocked by a
        // running slot (no overlap), every later fresh slot of this job is
        // blocked too, so it waits without a store write; only the oldest
        // blocked slot asks the store each tick (a backlog must not multiply
        // the store load). Retries carrying a token still ask: they may have won.
        let mut blocked_by: Option<Slot> = None;
        for (slot, token) in attempts {
            if late_at(slot, fresh_now()) {
                let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                let reason = match st.pending.remove(&slot) {
                    Some(Pending::Overlap | Pending::LocalOverlap) => SkipReason::Overlap,
                    _ => SkipReason::Late,
                };
                lates.push((slot, reason));
                continue;
            }
            if let (Some(running_slot), None, true) = (blocked_by, &token, entry.coordinated) {
                let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                if !matches!(st.pending.get(&slot), Some(Pending::Following(_))) {
                    st.pending.insert(slot, Pending::Overlap);
                    drop(st);
                    event(slot, TickAction::Overlap { running_slot });
                    continue;
                }
            }
            if !entry.coordinated {
                let blocked = {
                    let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                    if !opts.allow_overlap && st.local_running.iter().any(|s| *s != slot) {
                        st.pending.insert(slot, Pending::LocalOverlap);
                        true
                    } else {
                        st.pending.remove(&slot);
                        st.local_running.insert(slot);
                        false
                    }
                };
                if blocked {
                    event(slot, TickAction::LocalOverlap);
                    continue;
                }
                self.spawn_run(entry.clone(), slot, None, 0, Instant::now());
                event(
                    slot,
                    TickAction::Started {
                        takeover: false,
                        coordinated: false,
                    },
                );
                continue;
            }
            let Some(store) = self.inner.store.clone() else {
                continue;
            };
            // Another instance's unreleased run is only taken over once this
            // instance saw its lease unchanged for a full lease on its own
            // monotonic clock (and the store's clock says it expired).
            let takeover = {
                let st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                match st.pending.get(&slot) {
                    Some(Pending::Following(f)) if f.seen_since.elapsed() >= ttl => {
                        Takeover::IfUnchanged(f.lease_until)
                    }
                    _ => Takeover::Never,
                }
            };
            let token = token.unwrap_or_else(mint_token);
            let request = ClaimRequest::new(
                name,
                slot,
                token.clone(),
                self.inner.options.instance_id.clone(),
                ttl,
            )
            .allow_overlap(opts.allow_overlap)
            .takeover(takeover);
            // The lease counts from when the claim was sent, not answered.
            let sent = Instant::now();
            // Bounded by store_timeout only: on a saturated store, cancelling
            // and retrying sooner would only add load (the abandoned call
            // still runs); an answer that comes after the lease is retried.
            let claim = bounded(store_timeout, "claim", store.claim(&request)).await;
            let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
            match claim {
                Ok(claim) if claim.won && sent.elapsed() >= ttl => {
                    // Won, but the answer came after the lease (counted from
                    // sending) ran out: claim again with the same token,
                    // which renews the lease if nobody took it meanwhile.
                    st.pending.insert(slot, Pending::StoreError { token });
                    tracing::warn!(
                        job = name,
                        slot,
                        "claim answered after its lease ran out: retrying"
                    );
                    event(
                        slot,
                        TickAction::StoreError {
                            message: "claim answered after its lease ran out".into(),
                        },
                    );
                }
                Ok(claim) if claim.won => {
                    st.pending.remove(&slot);
                    st.local_running.insert(slot);
                    drop(st);
                    self.spawn_run(entry.clone(), slot, Some(token), claim.takeovers, sent);
                    event(
                        slot,
                        TickAction::Started {
                            takeover: claim.outcome == ClaimOutcome::TakenOver,
                            coordinated: true,
                        },
                    );
                }
                Ok(claim) => match claim.outcome {
                    ClaimOutcome::Overlap { running_slot } => {
                        blocked_by = Some(running_slot);
                        // A followed slot keeps what it saw of its holder's
                        // lease: forgetting it here would restart the full
                        // lease of observation a takeover needs, and a dead
                        // holder's slot would go late behind the next slots.
                        if !matches!(st.pending.get(&slot), Some(Pending::Following(_))) {
                            st.pending.insert(slot, Pending::Overlap);
                        }
                        tracing::info!(
                            job = name,
                            slot,
                            running_slot,
                            "slot blocked by a running slot (no overlap)"
                        );
                        event(slot, TickAction::Overlap { running_slot });
                    }
                    ClaimOutcome::Running => {
                        let lease_until = claim.lease_until_ms.unwrap_or(0);
                        let seen = Instant::now();
                        let seen_since = match st.pending.get(&slot) {
                            Some(Pending::Following(f)) if f.lease_until == lease_until => {
                                f.seen_since
                            }
                            _ => seen,
                        };
                        // Look again every third of a lease (to see the
                        // holder's heartbeats move it) and when it has been
                        // unchanged for a full lease.
                        let look_at = (seen + follow_every)
                            .min(seen_since + ttl)
                            .max(seen + Duration::from_millis(1));
                        st.pending.insert(
                            slot,
                            Pending::Following(Follow {
                                lease_until,
                                seen_since,
                                look_at,
                            }),
                        );
                        tracing::debug!(job = name, slot, holder = ?claim.holder, "slot held elsewhere: following it");
                        event(
                            slot,
                            TickAction::HeldElsewhere {
                                holder: claim.holder,
                            },
                        );
                    }
                    // Done, and any outcome this version does not know.
                    _ => {
                        st.pending.remove(&slot);
                        event(slot, TickAction::AlreadyDone);
                    }
                },
                Err(error) => {
                    st.pending.insert(slot, Pending::StoreError { token });
                    tracing::warn!(job = name, slot, %error, "run store failed: skipping this tick");
                    event(
                        slot,
                        TickAction::StoreError {
                            message: error.to_string(),
                        },
                    );
                }
            }
        }

        // 3. Skips. Recording them is history only: once the tick has taken
        // a poll interval, the rest are logged, not written, so a backlog of
        // late slots never delays the next tick's claims.
        let budget = self.inner.options.poll_interval;
        let mut unrecorded = 0usize;
        for (slot, reason) in lates {
            let recorded = match (&self.inner.store, entry.coordinated) {
                (Some(_), true) if started.elapsed() >= budget => {
                    unrecorded += 1;
                    false
                }
                (Some(store), true) => {
                    match bounded(
                        store_timeout,
                        "record a skip",
                        store.record_skip(name, slot, &self.inner.options.instance_id, reason),
                    )
                    .await
                    {
                        Ok(recorded) => recorded,
                        Err(error) => {
                            tracing::warn!(job = name, slot, %error, "could not record a skipped slot");
                            false
                        }
                    }
                }
                _ => false,
            };
            tracing::info!(job = name, slot, ?reason, "slot skipped: too late to start");
            event(slot, TickAction::Late { reason, recorded });
        }
        if unrecorded > 0 {
            tracing::warn!(
                job = name,
                unrecorded,
                "skipped slots not recorded in history (the tick ran out of time)"
            );
        }
        events
    }

    /// Run the handler of a won slot (`token`: coordinated; its claim was
    /// sent at `claim_sent`) with heartbeats, then finish or release it.
    fn spawn_run(
        &self,
        entry: Arc<JobEntry>,
        slot: Slot,
        token: Option<String>,
        takeovers: u32,
        claim_sent: Instant,
    ) {
        let inner = self.inner.clone();
        let handle = tokio::spawn(async move {
            let job = &entry.job;
            let name = job.name.clone();
            let (lost_tx, lost_rx) = watch::channel(false);
            let ctx = RunContext::new(
                name.clone(),
                slot,
                inner.options.instance_id.clone(),
                false,
                token.is_some(),
                takeovers,
                lost_rx,
            );
            let mut shutdown = inner.shutdown.subscribe();
            let store = inner.store.clone().filter(|_| token.is_some());
            let ttl = job.options.lease_ttl;
            let heartbeats = async {
                let (Some(store), Some(token)) = (&store, &token) else {
                    return std::future::pending::<()>().await;
                };
                // The lease as this instance knows it, like LockGuard's
                // (crates/coord-adapters/src/lock/guard.rs): it runs out one
                // TTL after the last *confirmed* claim or heartbeat was
                // SENT, on the monotonic clock (a wall-clock step cannot
                // extend it). A backup takes over only after seeing the lease
                // unchanged for a full TTL on its own monotonic clock, so it
                // never starts before this deadline has passed here.
                let every = (ttl / 3).max(Duration::from_millis(10));
                let mut deadline = claim_sent + ttl;
                let mut next = claim_sent + every;
                let lost = |why: &str| {
                    tracing::warn!(job = %name, slot, "lease lost: {why}");
                    lost_tx.send_replace(true);
                };
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(deadline) => break,
                        _ = tokio::time::sleep_until(next) => {}
                    }
                    let sent = Instant::now();
                    next = sent + every;
                    // A heartbeat that does not answer before the next one
                    // is due (or the lease ends) counts as failed.
                    let answer = tokio::time::timeout_at(
                        next.min(deadline),
                        store.heartbeat(&name, slot, token, ttl),
                    )
                    .await;
                    match answer {
                        Ok(Ok(_)) => deadline = deadline.max(sent + ttl),
                        Ok(Err(error)) if error.is_not_owner() => {
                            lost("another instance took the slot over");
                            return std::future::pending::<()>().await;
                        }
                        Ok(Err(error)) => {
                            tracing::warn!(job = %name, slot, %error, "heartbeat failed; retrying");
                        }
                        Err(_) => {
                            tracing::warn!(job = %name, slot, "heartbeat did not answer in time; retrying");
                        }
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                lost("no heartbeat confirmed within the lease (store unreachable or slow)");
                std::future::pending::<()>().await
            };
            let status = execute(
                &job.handler,
                ctx,
                job.options.timeout,
                heartbeats,
                &mut shutdown,
            )
            .await;
            {
                let mut st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
                st.local_running.remove(&slot);
            }
            if let Some(FinalStatus::Failed(_) | FinalStatus::TimedOut) = &status {
                crate::telemetry::run("failed");
            }
            let (Some(store), Some(token)) = (store, token) else {
                tracing::info!(job = %name, slot, ?status, "local run ended");
                return;
            };
            let bound = inner.options.store_timeout;
            match status {
                Some(status) => {
                    let finish = store.finish(&name, slot, &token, status.clone());
                    if let Err(error) = bounded(bound, "finish", finish).await {
                        tracing::warn!(job = %name, slot, %error, "could not record the end of the run");
                    }
                    // The next slot of the job may be waiting for this one.
                    inner.wake.notify_one();
                    if store.dedupe_window().is_some() {
                        if let Err(error) = bounded(bound, "prune", store.prune(&name)).await {
                            tracing::warn!(job = %name, %error, "could not forget old claims");
                        }
                    }
                }
                None => {
                    let release = store.release(&name, slot, &token);
                    if let Err(error) = bounded(bound, "release", release).await {
                        tracing::warn!(job = %name, slot, %error, "could not release the lease on shutdown");
                    }
                }
            }
        });
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.retain(|t| !t.is_finished());
        tasks.push(handle);
    }

    /// Run `job` now, outside its schedule, and wait for it. Manual runs are
    /// never deduplicated nor overlap-checked; coordinated jobs record them
    /// in the store's history (a store that fails to record refuses the run).
    pub async fn run_now(&self, job: &str) -> Result<ManualReport, Error> {
        if *self.inner.shutdown.borrow() {
            return Err(Error::ShutDown);
        }
        let entry = {
            let jobs = self.inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
            jobs.get(job)
                .cloned()
                .ok_or_else(|| Error::UnknownJob(job.to_owned()))?
        };
        let now = self.inner.clock.now_millis();
        let token = mint_token();
        let store = self.inner.store.clone().filter(|_| entry.coordinated);
        if let Some(store) = &store {
            let run = ManualRun::new(
                job,
                now,
                token.clone(),
                self.inner.options.instance_id.clone(),
            );
            store.record_manual(&run).await?;
        }
        let (_lost_tx, lost_rx) = watch::channel(false);
        let ctx = RunContext::new(
            job.to_owned(),
            now,
            self.inner.options.instance_id.clone(),
            true,
            store.is_some(),
            0,
            lost_rx,
        );
        let mut shutdown = self.inner.shutdown.subscribe();
        let status = execute(
            &entry.job.handler,
            ctx,
            entry.job.options.timeout,
            std::future::pending::<()>(),
            &mut shutdown,
        )
        .await
        .unwrap_or_else(|| FinalStatus::Failed("interrupted by shutdown".into()));
        if let Some(store) = &store {
            store.finish(job, now, &token, status.clone()).await?;
        }
        Ok(ManualReport {
            slot: now,
            status,
            recorded: store.is_some(),
        })
    }

    /// Start the tick loop on the current tokio runtime (idempotent).
    pub fn start(&self) {
        let mut slot = self
            .inner
            .loop_task
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if slot.is_some() || *self.inner.shutdown.borrow() {
            return;
        }
        let me = self.clone();
        *slot = Some(tokio::spawn(async move {
            let mut shutdown = me.inner.shutdown.subscribe();
            loop {
                if *shutdown.borrow() {
                    break;
                }
                let now = me.inner.clock.now_millis();
                me.tick_at(now).await;
                let wait = me.next_wake(now);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = me.inner.wake.notified() => {}
                    _ = wait_shutdown(&mut shutdown) => break,
                }
            }
        }));
    }

    /// How long the loop may sleep after a tick at `now`.
    fn next_wake(&self, now: u64) -> Duration {
        let poll = self
            .inner
            .options
            .poll_interval
            .max(Duration::from_millis(1));
        let jobs = self.inner.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut wait = poll;
        for entry in jobs.values() {
            let st = entry.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = st.cursor {
                let fire = slot.saturating_add(jitter_for(
                    &entry.job.name,
                    slot,
                    entry.job.options.jitter,
                ));
                wait = wait.min(Duration::from_millis(fire.saturating_sub(now)));
            }
        }
        wait.max(Duration::from_millis(1))
    }

    /// Wait until every handler started so far has ended (and its run was
    /// finished or released in the store).
    pub async fn wait_idle(&self) {
        loop {
            let handles: Vec<JoinHandle<()>> = {
                let mut tasks = self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
                std::mem::take(&mut *tasks)
            };
            if handles.is_empty() {
                return;
            }
            for handle in handles {
                let _ = handle.await;
            }
        }
    }

    /// Stop ticking, stop running handlers and release their leases so a
    /// backup takes their slots over at once; returns when all is released.
    pub async fn shutdown(&self) {
        self.inner.shutdown.send_replace(true);
        let looping = self
            .inner
            .loop_task
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(handle) = looping {
            let _ = handle.await;
        }
        self.wait_idle().await;
    }
}
