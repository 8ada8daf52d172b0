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
//! # Retries
//!
//! A job with [`JobOptions::with_retry`](crate::JobOptions::with_retry)
//! runs a failed handler (`Err` or a panic; not a timeout, not a manual
//! run) again, in the same spawned run that holds the slot's lease:
//!
//! 1. Attempt `n` failed with attempts left (`n < max_attempts`) and the
//!    lease not lost: draw the wait `w` from the backoff. If
//!    `now + w > slot + jitter(job, slot) + max_late` (this instance's
//!    clock; the bound a claim of the slot obeys), stop.
//! 2. Wait `w`; heartbeats go on renewing the lease. Shutdown releases the
//!    run (a backup takes it over as attempt `n + 1`); a lost lease stops.
//! 3. Judge the bound again with the clock after the wait, then record
//!    attempt `n + 1` by token in the store. Refused as not the owner: stop
//!    without recording anything (another instance owns the run). No
//!    answer (unavailable, timed out, `Indeterminate`): ask the same
//!    question again every third of a lease, never run unrecorded, until the
//!    lease is lost or the bound passes.
//! 4. Run attempt `n + 1` ([`RunContext::attempt`](crate::RunContext::attempt)).
//!
//! Stopping finishes the run failed with the last error; history shows
//! the attempts it started. A takeover is the next attempt (the claim
//! carries `max_attempts`; past it the store finishes the run failed).
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
//!
//! # Layout
//!
//! The runtime state and the public methods are here; one job's tick is in
//! `tick`, one run of a handler (heartbeats, finish, release) in `run`,
//! [`SchedulerOptions`] in `options` and what ticks report in `report`.

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

use crate::validate_job_name;
use crate::{
    jitter_for, Error, FinalStatus, Job, LockingHint, ManualRun, RunContext, RunError, Slot,
    SlotStore,
};

mod options;
mod report;
mod run;
mod tick;

pub use options::SchedulerOptions;
pub use report::{ManualReport, TickAction, TickEvent, TickReport};

use run::execute;
use tick::Pending;

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
/// let clock = Arc::new(ManualClock::at_millis(120_000));
/// let store: Arc<dyn SlotStore> =
///     Arc::new(RunStore::new(backend, clock.clone(), RunStoreOptions::default()).unwrap());
///
/// // Two instances share the store: each slot runs on one of them.
/// let a = Scheduler::new(Some(store.clone()), clock.clone(), SchedulerOptions::instance("a"));
/// let b = Scheduler::new(Some(store.clone()), clock.clone(), SchedulerOptions::instance("b"));
/// for s in [&a, &b] {
///     // max_late 30 s: the slot of 60 s is not caught up, the slot of
///     // 120 s may start up to 30 s late.
///     let job = Job::new("tick", Schedule::parse("every 1m", None).unwrap(), handler(|_| async { Ok(()) }))
///         .with_options(JobOptions::default().with_max_late(Duration::from_secs(30)));
///     s.add_job(job).unwrap();
/// }
/// let (ra, rb) = tokio::join!(a.tick_at(120_000), b.tick_at(120_000));
/// let runs_of_120s = [&ra, &rb]
///     .iter()
///     .flat_map(|r| r.started())
///     .filter(|(_, slot)| *slot == 120_000)
///     .count();
/// assert_eq!(runs_of_120s, 1);
/// a.wait_idle().await;
/// b.wait_idle().await;
/// assert_eq!(store.history("tick", 10).await.unwrap()[0].slot, 120_000);
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
    call: impl Future<Output = Result<T, RunError>>,
) -> Result<T, RunError> {
    match tokio::time::timeout(bound, call).await {
        Ok(result) => result,
        Err(_) => Err(RunError::Store(coord_backend::Error::Indeterminate {
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
    /// or taken, its lease is zero, its retry policy is out of range, it requires a store that is missing
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
        if let Some(retry) = &options.retry {
            retry.check().map_err(|reason| {
                Error::InvalidArgument(format!("job {:?}: {reason}", job.name))
            })?;
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

    /// Run `job` now, outside its schedule, and wait for it. Manual runs are
    /// never deduplicated nor overlap-checked nor retried; coordinated jobs record them
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
            (0, 1),
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
                // Biased (shutdown first): no random pick between branches
                // ready at once, so a seeded simulation replays exactly.
                tokio::select! {
                    biased;
                    _ = wait_shutdown(&mut shutdown) => break,
                    _ = me.inner.wake.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
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
