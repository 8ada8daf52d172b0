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
    lost: watch::Receiver<bool>,
}

impl RunContext {
    pub(crate) fn new(
        job: String,
        slot: Slot,
        instance: String,
        manual: bool,
        coordinated: bool,
        takeovers: u32,
        lost: watch::Receiver<bool>,
    ) -> Self {
        RunContext {
            job,
            slot,
            instance,
            manual,
            coordinated,
            takeovers,
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
    /// Stop the handler after this long and record `TimedOut` (default none).
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
