//! Jobs: a name, a schedule, a handler and how to coordinate it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::{Schedule, Slot};

/// How a job is coordinated across instances.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum LockingHint {
    /// No coordination: every instance runs its own copy of every slot and
    /// never touches the store (per-node maintenance such as a local cache GC).
    NodeLocal,
    /// Coordinate through the claim: exactly one instance runs each slot.
    /// When the slot is held elsewhere, or the store is broken, this
    /// instance skips the tick and logs it. Adding such a job to a scheduler
    /// without a store is refused.
    RequireGlobal,
    /// Coordinate when a run store is configured (then exactly like
    /// `RequireGlobal`, including skipping when the store is broken);
    /// without a store, run locally like `NodeLocal`.
    #[default]
    PreferGlobal,
}

impl std::str::FromStr for LockingHint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "node_local" => Ok(LockingHint::NodeLocal),
            "require_global" => Ok(LockingHint::RequireGlobal),
            "prefer_global" => Ok(LockingHint::PreferGlobal),
            other => Err(format!(
                "unknown hint {other:?} (node_local, require_global, prefer_global)"
            )),
        }
    }
}

/// What a handler returns: `Err` marks the run failed with its message.
pub type HandlerResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A boxed, sendable future.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The work of a job: called once per run with its [`RunContext`].
pub type Handler = Arc<dyn Fn(RunContext) -> BoxFuture<HandlerResult> + Send + Sync>;

/// Wrap an async closure as a [`Handler`].
///
/// ```
/// use coord_scheduler::{handler, RunContext};
///
/// let h = handler(|ctx: RunContext| async move {
///     println!("{} slot {} on {}", ctx.job, ctx.slot, ctx.instance);
///     Ok(())
/// });
/// # let _ = h;
/// ```
pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(RunContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = HandlerResult> + Send + 'static,
{
    Arc::new(move |ctx| Box::pin(f(ctx)))
}

/// What a handler learns about its run.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RunContext {
    /// The job.
    pub job: String,
    /// The slot (scheduled instant, UTC ms; for a manual run, when it started).
    pub slot: Slot,
    /// This instance.
    pub instance: String,
    /// Whether `run_now` started it.
    pub manual: bool,
    /// Whether the run is coordinated through the store (false for local runs).
    pub coordinated: bool,
    /// How many times the slot was taken over before this run.
    pub takeovers: u32,
    /// Which attempt of the slot this is: 1 for its first run, +1 per retry
    /// after a failure ([`JobOptions::with_retry`]) and per takeover.
    pub attempt: u32,
    lost: watch::Receiver<bool>,
}

impl RunContext {
    pub(crate) fn new(
        job: String,
        slot: Slot,
        instance: String,
        manual: bool,
        coordinated: bool,
        (takeovers, attempt): (u32, u32),
        lost: watch::Receiver<bool>,
    ) -> Self {
        RunContext {
            job,
            slot,
            instance,
            manual,
            coordinated,
            takeovers,
            attempt,
            lost,
        }
    }

    /// Whether this run's lease is lost: a heartbeat found the slot taken
    /// over, or no heartbeat was confirmed within the lease (counted on the
    /// monotonic clock from when the last confirmed one was sent: the store
    /// is unreachable, failing or hanging). The handler should stop as soon
    /// as it can: another instance may be running the same slot.
    pub fn is_lease_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Resolves when the lease is lost (never, for uncoordinated runs).
    pub async fn lease_lost(&self) {
        let mut lost = self.lost.clone();
        if lost.wait_for(|l| *l).await.is_err() {
            // The run ended without losing its lease.
            std::future::pending::<()>().await;
        }
    }
}

/// How one job runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct JobOptions {
    /// Lease of a coordinated run; heartbeats renew it every third of it
    /// (default 30 s). A backup takes over when it expires unfinished.
    pub lease_ttl: Duration,
    /// Stop the handler after this long and record `TimedOut` (default
    /// none). Counted per attempt; a timed-out attempt is not retried.
    pub timeout: Option<Duration>,
    /// How late a slot may still start; older unclaimed slots are recorded
    /// as skipped (default 60 s). Also the catch-up horizon after a start.
    pub max_late: Duration,
    /// Deterministic per-(job, slot) delay in `[0, jitter]` before claiming,
    /// the same on every instance (spreads jobs sharing a cron time; default 0).
    pub jitter: Duration,
    /// Whether slot N+1 may start while slot N still runs (default false).
    pub allow_overlap: bool,
    /// How to coordinate (default [`LockingHint::PreferGlobal`]).
    pub hint: LockingHint,
    /// Whether and how a failed run of a slot is run again (default `None`:
    /// never; see [`JobOptions::with_retry`]).
    pub retry: Option<Retry>,
}

/// How long to wait before a retry: doubling from `initial` after each
/// failed attempt, capped at `max`, with random jitter ("equal jitter":
/// the wait after attempt `n` is drawn uniformly in `[d/2, d]`, where
/// `d = min(initial × 2^(n−1), max)`), so instances that failed together
/// do not retry together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Backoff {
    /// The wait bound after the first failed attempt (positive).
    pub initial: Duration,
    /// The largest wait bound (at least `initial`).
    pub max: Duration,
}

impl Backoff {
    /// Doubling from `initial`, capped at `max`. Checked by
    /// [`crate::Scheduler::add_job`]: `initial` must be positive and `max`
    /// at least `initial`.
    pub const fn exponential(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// The same bound after every attempt (still jittered in `[d/2, d]`).
    pub const fn fixed(delay: Duration) -> Self {
        Backoff {
            initial: delay,
            max: delay,
        }
    }

    /// The range the wait after failed attempt `attempt` (1 = the first
    /// run) is drawn from: `[d/2, d]`, `d = min(initial × 2^(attempt−1), max)`.
    pub fn bounds(&self, attempt: u32) -> (Duration, Duration) {
        let doublings = attempt.saturating_sub(1).min(31);
        let d = self
            .initial
            .checked_mul(1u32 << doublings)
            .unwrap_or(self.max)
            .min(self.max);
        (d / 2, d)
    }

    /// A wait after failed attempt `attempt`, drawn in [`Backoff::bounds`]
    /// (through `coord_adapters::jitter`, so a seeded simulation replays it).
    pub fn delay(&self, attempt: u32) -> Duration {
        let (lo, hi) = self.bounds(attempt);
        coord_adapters::jitter::uniform(lo, hi)
    }
}

/// A job's retry policy: see [`JobOptions::with_retry`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retry {
    /// The most attempts a slot may start, takeovers included (at least 1).
    pub max_attempts: u32,
    /// The wait between a failed attempt and the next.
    pub backoff: Backoff,
}

impl Retry {
    /// What is wrong with the policy, if anything.
    pub(crate) fn check(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("max_attempts must be at least 1 (1 = no retry)".into());
        }
        if self.backoff.initial.is_zero() {
            return Err("the retry backoff must be positive".into());
        }
        if self.backoff.max < self.backoff.initial {
            return Err(format!(
                "the retry backoff's max ({:?}) is below its initial wait ({:?})",
                self.backoff.max, self.backoff.initial
            ));
        }
        Ok(())
    }
}

impl JobOptions {
    /// Run a slot whose handler failed (returned `Err` or panicked; a
    /// timeout is not retried) again, up to `max_attempts` attempts in all,
    /// waiting `backoff` between them, **only while the retry still starts
    /// within the slot's lateness bound**: a retry starts only if the
    /// instance's clock, both when the wait is chosen (now + wait) and after
    /// it, is at most `slot + jitter(job, slot) + max_late`, the bound a
    /// claim of the slot obeys. Otherwise the run finishes failed with the
    /// last error; history shows how many attempts it started.
    ///
    /// For a coordinated job the instance keeps the slot's lease through the
    /// wait (heartbeats go on), records each retry in the store conditional
    /// on its token ([`crate::SlotStore::record_attempt`]) before running it,
    /// and stops retrying once its lease is lost. A takeover also starts the
    /// next attempt: a holder that stopped (crashed, paused past its lease,
    /// shut down) during attempt `n` is taken over as attempt `n + 1`, and
    /// once `max_attempts` were started the takeover finishes the run failed
    /// instead of running it again. So `max_attempts = 1` means one start
    /// and no takeover either; without a retry policy (the default) a slot
    /// is taken over however often its holders stop, as before.
    ///
    /// Refused by [`crate::Scheduler::add_job`] (typed
    /// [`crate::Error::InvalidArgument`]) when `max_attempts` is 0 or the
    /// backoff is zero or its max is below its initial wait.
    ///
    /// ```
    /// use std::time::Duration;
    /// use coord_scheduler::{Backoff, JobOptions};
    ///
    /// // Up to 3 attempts, waiting ~10 s then ~20 s (jittered, at most 1 min),
    /// // while the slot is at most 5 minutes late.
    /// let options = JobOptions::default()
    ///     .with_max_late(Duration::from_secs(300))
    ///     .with_retry(3, Backoff::exponential(Duration::from_secs(10), Duration::from_secs(60)));
    /// assert_eq!(options.retry.unwrap().max_attempts, 3);
    /// ```
    pub fn with_retry(mut self, max_attempts: u32, backoff: Backoff) -> Self {
        self.retry = Some(Retry {
            max_attempts,
            backoff,
        });
        self
    }
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            lease_ttl: Duration::from_secs(30),
            timeout: None,
            max_late: Duration::from_secs(60),
            jitter: Duration::ZERO,
            allow_overlap: false,
            hint: LockingHint::PreferGlobal,
            retry: None,
        }
    }
}

coord_backend::setters! {
    JobOptions {
        /// Set the lease TTL.
        with_lease_ttl(ttl: Duration) => lease_ttl = ttl;
        /// Set the timeout.
        with_timeout(timeout: Option<Duration>) => timeout = timeout;
        /// Set the maximum lateness.
        with_max_late(max_late: Duration) => max_late = max_late;
        /// Set the jitter bound.
        with_jitter(jitter: Duration) => jitter = jitter;
        /// Allow overlapping runs.
        with_allow_overlap(allow: bool) => allow_overlap = allow;
        /// Set the locking hint.
        with_hint(hint: LockingHint) => hint = hint;
    }
}

/// A job to register with [`crate::Scheduler::add_job`].
#[derive(Clone)]
pub struct Job {
    pub(crate) name: String,
    pub(crate) schedule: Schedule,
    pub(crate) handler: Handler,
    pub(crate) options: JobOptions,
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job with default [`JobOptions`].
    pub fn new(name: impl Into<String>, schedule: Schedule, handler: Handler) -> Self {
        Job {
            name: name.into(),
            schedule,
            handler,
            options: JobOptions::default(),
        }
    }

    /// Replace the options.
    pub fn with_options(mut self, options: JobOptions) -> Self {
        self.options = options;
        self
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The job's schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// The job's options.
    pub fn options(&self) -> &JobOptions {
        &self.options
    }
}
