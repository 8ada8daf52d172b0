//! A task board (its contract: the board conformance suite).
//!
//! # Contract
//!
//! Tasks have an id, a payload and dependencies (ids of other tasks).
//!
//! - [`Board::add`] / [`Board::seed`] put tasks on the board; adding an id
//!   that exists with the same content is a no-op, with other content it is
//!   [`BoardError::AlreadyExists`].
//! - [`Board::claim`] is one atomic step. It succeeds only when the task is
//!   not completed, not held by a live claim, and **every dependency is
//!   completed**; it mints a fresh random token and a takeover
//!   **fence** strictly greater than every earlier claim of the task.
//!   A claim whose lease expired can be taken over by anyone.
//! - [`Board::renew`] is an ownership check, not a heartbeat: a wrong token
//!   or an expired lease gets [`BoardError::LeaseLost`] and nothing changes.
//! - [`Board::release`] / [`Board::complete`] act only for the token of the
//!   live claim (anything else: [`BoardError::LeaseLost`], nothing changes).
//!   A completed task is never claimable again; completing again with the
//!   same token and result is a no-op (safe to retry).
//! - [`Board::list`] shows every task with its state.
//! - Completed tasks stay until [`BoardAdapter::prune`] removes those
//!   completed longer ago than a retention (off unless called): tasks still
//!   waiting on a removed task stay claimable, and an id added again is a
//!   new task whose fences start above the old ones.
//!
//! # Boundary
//!
//! [`BoardAdapter`] decides over the primitives of any
//! [`coord_backend::Backend`] through the CAS engine, so it is as atomic as
//! that store. A claim reads the task, then (after decoding its dependency
//! list) the dependency records too, and its txn asserts all of them: a
//! dependency that is un-completed or a dependency list that changes between
//! the read and the commit makes the txn fail, and the claim is decided again
//! on the new list. Expiry is judged with the adapter's clock (instances must
//! agree on time within a bound well below the lease TTLs). [`Board::list`]
//! reads each task consistently, but not the whole board at one instant.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use coord_adapters::board::{Board, BoardAdapter, BoardError, TaskSpec};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let board = BoardAdapter::new(Arc::new(SingleProcessMemoryBackend::new("demo")?));
//! board.seed(vec![
//!     TaskSpec::new("fetch", b"https://example.invalid/data".to_vec()),
//!     TaskSpec::new("index", b"".to_vec()).with_deps(["fetch"]),
//! ]).await?;
//!
//! let ttl = Duration::from_secs(60);
//! // `index` waits for `fetch`.
//! assert!(matches!(board.claim("index", "agent-1", ttl).await, Err(BoardError::DependenciesNotMet { .. })));
//! let fetch = board.claim("fetch", "agent-1", ttl).await?;
//! board.complete("fetch", &fetch.token, b"42 rows".to_vec()).await?;
//! let index = board.claim("index", "agent-2", ttl).await?;
//! assert_eq!(index.fence, 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt::Debug;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use coord_backend::{redact::Bytes, InvalidInput};

mod adapter;
pub mod queue;
mod record;
mod typed;

pub use adapter::{BoardAdapter, BoardOptions};
pub use queue::QueueStats;
pub use typed::TypedBoard;

/// What [`Board::queues`], [`Board::queue_depth`] and [`Board::dead_tasks`]
/// answer (see docs/queue.md, "Watching a queue").
pub use queue::{BoundedCount, DeadTask, DeadTasks, QueueDepth, QueueDepths, QueueNames};

/// A task to put on the board.
#[derive(Clone, PartialEq, Eq)]
pub struct TaskSpec {
    /// The task's id (non-empty, unique on the board).
    pub id: String,
    /// Opaque bytes for the agent that claims it.
    pub payload: Vec<u8>,
    /// Ids of the tasks that must be completed before this one can be
    /// claimed: at most `(max_keys_per_call - 3) / 2` of the store's
    /// `Limits` (19 on etcd, 62 on the other stores), as adding a task reads
    /// each one and writes its reverse-dependency entry in one txn; for a
    /// task in a queue, `(max_keys_per_call - 5) / 3` (12 on etcd, 41
    /// elsewhere), as it also marks each dependency as awaited.
    pub deps: Vec<String>,
    /// The queue [`Board::claim_next`] finds it in (`None`: claimed by id only).
    pub queue: Option<String>,
    /// Within its queue, higher priorities are claimed first (default 0).
    pub priority: i16,
    /// Not claimed before this time (the board's clock).
    pub run_at: Option<SystemTime>,
    /// Failed attempts allowed, and the wait after each one.
    pub retry: RetryPolicy,
    /// Run at most once: a claim whose lease ran out is not taken over,
    /// the task becomes [`TaskState::Uncertain`] instead (see
    /// [`TaskSpec::at_most_once`]).
    pub at_most_once: bool,
}

/// How a task is retried after a failed attempt ([`Board::fail`], or a
/// claim whose lease ran out).
///
/// After the n-th failed attempt the task waits `initial × 2^(n-1)`, at most
/// `max`, of which a random half is jitter (so tasks that failed together do
/// not come back together), then is claimable again; once `max_attempts`
/// attempts have failed it is [`TaskState::Dead`] instead. A lease that ran
/// out is a failed attempt without a wait: the lease already was one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts (claims that failed or ran out) before the task is dead;
    /// `None` (the default): retried for ever.
    pub max_attempts: Option<u32>,
    /// The wait after the first failure (default 1 s).
    pub initial_backoff: Duration,
    /// The longest wait (default 1 hour).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: None,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(3600),
        }
    }
}

impl RetryPolicy {
    /// At most `max_attempts` attempts (at least 1), with the default backoff.
    pub fn attempts(max_attempts: u32) -> Self {
        RetryPolicy {
            max_attempts: Some(max_attempts),
            ..RetryPolicy::default()
        }
    }

    /// The same policy with a backoff from `initial` up to `max`.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }
}

/// What [`Board::fail`] did with the task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failed {
    /// It is claimable again from this time on.
    RetryAt(SystemTime),
    /// It used its last attempt: [`TaskState::Dead`].
    Dead,
}

impl Debug for TaskSpec {
    // The payload is application data: only its length is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSpec")
            .field("id", &self.id)
            .field("payload", &Bytes(&self.payload))
            .field("deps", &self.deps)
            .field("queue", &self.queue)
            .field("priority", &self.priority)
            .field("run_at", &self.run_at)
            .field("retry", &self.retry)
            .finish()
    }
}

impl Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.id)
            .field("payload", &Bytes(&self.payload))
            .field("deps", &self.deps)
            .field("fence", &self.fence)
            .field("state", &self.state)
            .field("queue", &self.queue)
            .field("priority", &self.priority)
            .field("attempts", &self.attempts)
            .field("max_attempts", &self.max_attempts)
            .field("last_error", &self.last_error)
            .field("not_before", &self.not_before)
            .finish()
    }
}

impl Debug for TaskState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TaskState::Open => f.write_str("Open"),
            TaskState::Claimed { agent, expires_at } => f
                .debug_struct("Claimed")
                .field("agent", agent)
                .field("expires_at", expires_at)
                .finish(),
            TaskState::Expired { agent, expired_at } => f
                .debug_struct("Expired")
                .field("agent", agent)
                .field("expired_at", expired_at)
                .finish(),
            TaskState::Completed { agent, result } => f
                .debug_struct("Completed")
                .field("agent", agent)
                .field("result", &Bytes(result))
                .finish(),
            TaskState::Dead { error } => f.debug_struct("Dead").field("error", error).finish(),
            TaskState::Uncertain { error } => {
                f.debug_struct("Uncertain").field("error", error).finish()
            }
            TaskState::Cancelled => f.write_str("Cancelled"),
        }
    }
}

impl TaskSpec {
    /// A task without dependencies.
    pub fn new(id: impl Into<String>, payload: impl Into<Vec<u8>>) -> Self {
        TaskSpec {
            id: id.into(),
            payload: payload.into(),
            deps: Vec::new(),
            queue: None,
            priority: 0,
            run_at: None,
            retry: RetryPolicy::default(),
            at_most_once: false,
        }
    }

    /// The same task, run at most once: a holder whose claim runs out may
    /// have run it, so nobody takes it over; the next claim attempt makes
    /// it [`TaskState::Uncertain`] (as does [`Board::mark_uncertain`]),
    /// which only an operator's verdict ends ([`Board::retry_dead`]: it
    /// did not run; [`Board::cancel`]: leave it). A [`Board::fail`] still
    /// says "it did not take effect", so it is retried as its
    /// [`RetryPolicy`] says. What the side-effect `Runner` promises per
    /// key, on a queued task (the outbox runs on it).
    pub fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// The same task in `queue` (non-empty, no `/`), so
    /// [`Board::claim_next`] finds it once it is ready.
    pub fn in_queue(mut self, queue: impl Into<String>) -> Self {
        self.queue = Some(queue.into());
        self
    }

    /// The same task with `priority` (higher first; default 0).
    pub fn with_priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// The same task, not claimed before `at`.
    pub fn with_run_at(mut self, at: SystemTime) -> Self {
        self.run_at = Some(at);
        self
    }

    /// The same task with `retry` as its retry policy.
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The same task, depending on `deps`.
    pub fn with_deps<I, S>(mut self, deps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.deps = deps.into_iter().map(Into::into).collect();
        self
    }
}

/// A task as the board shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Task {
    /// The task's id.
    pub id: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Ids of the tasks it depends on.
    pub deps: Vec<String>,
    /// The fence of the latest claim (0 = never claimed).
    pub fence: u64,
    /// Its state, judged at the time of the read.
    pub state: TaskState,
    /// Its queue, if any.
    pub queue: Option<String>,
    /// Its priority in its queue.
    pub priority: i16,
    /// Attempts counted so far (claims that failed, ran out, or still run).
    pub attempts: u32,
    /// Attempts allowed before it is dead (`None`: no limit).
    pub max_attempts: Option<u32>,
    /// The error of its last failed attempt.
    pub last_error: Option<String>,
    /// Not claimable before this time (its run-at or a backoff), if that is
    /// still ahead.
    pub not_before: Option<SystemTime>,
}

/// Where a task stands.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskState {
    /// Nobody holds it (never claimed, or released).
    Open,
    /// An agent holds a live claim.
    Claimed {
        /// Who claimed it.
        agent: String,
        /// When the lease runs out unless renewed.
        expires_at: SystemTime,
    },
    /// The last claim's lease ran out: anyone may take the task over.
    Expired {
        /// Who held it.
        agent: String,
        /// When the lease ran out.
        expired_at: SystemTime,
    },
    /// Done for good.
    Completed {
        /// Who completed it.
        agent: String,
        /// The result it was completed with.
        result: Vec<u8>,
    },
    /// Its last allowed attempt failed; [`Board::retry_dead`] brings it back.
    Dead {
        /// The error of that attempt.
        error: Option<String>,
    },
    /// Cancelled ([`Board::cancel`]): never claimed again.
    Cancelled,
    /// An at-most-once task whose last attempt's outcome is unknown (its
    /// claim ran out, or its holder said so with [`Board::mark_uncertain`]):
    /// never claimed again until [`Board::retry_dead`] (it did not run) or
    /// [`Board::cancel`] (leave it).
    Uncertain {
        /// Why its outcome is unknown.
        error: Option<String>,
    },
}

/// A successful claim (or renewal): the credentials for renew / release / complete.
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimedTask {
    /// The task's id.
    pub id: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Its dependencies (all completed at the time of the claim).
    pub deps: Vec<String>,
    /// Who claimed it.
    pub agent: String,
    /// The random token of this claim: a credential, not for logs.
    pub token: String,
    /// The takeover fence: greater than that of every earlier claim of
    /// this task (use it as a fencing token downstream).
    pub fence: u64,
    /// When the lease runs out unless renewed.
    pub expires_at: SystemTime,
}

impl Debug for ClaimedTask {
    // The token is a credential: keep it out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimedTask")
            .field("id", &self.id)
            .field("agent", &self.agent)
            .field("fence", &self.fence)
            .field("expires_at", &self.expires_at)
            .field("deps", &self.deps)
            .field("payload_len", &self.payload.len())
            .finish_non_exhaustive()
    }
}

/// Errors of [`Board`] operations. Every refusal leaves the board unchanged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BoardError {
    /// No task with this id.
    #[error("task {id:?} not found")]
    NotFound {
        /// The task id.
        id: String,
    },
    /// A task with this id exists with another payload or other dependencies.
    #[error("task {id:?} already exists with different content")]
    AlreadyExists {
        /// The task id.
        id: String,
    },
    /// Some dependencies are not completed (or do not exist yet).
    #[error("task {id:?} waits for {pending:?}")]
    DependenciesNotMet {
        /// The task id.
        id: String,
        /// The dependencies that are not completed.
        pending: Vec<String>,
    },
    /// Another claim is live.
    #[error("task {id:?} is claimed by {agent:?}")]
    AlreadyClaimed {
        /// The task id.
        id: String,
        /// Who holds it.
        agent: String,
        /// When that lease runs out unless renewed.
        expires_at: SystemTime,
    },
    /// The token does not hold a live claim (wrong token, expired, taken
    /// over, released): stop working on the task.
    #[error("lease on task {id:?} lost")]
    LeaseLost {
        /// The task id.
        id: String,
    },
    /// The task is completed.
    #[error("task {id:?} is completed")]
    Completed {
        /// The task id.
        id: String,
    },
    /// The task is dead or cancelled.
    #[error("task {id:?} is dead or cancelled")]
    Dead {
        /// The task id.
        id: String,
    },
    /// The task waits for its run-at time or a retry backoff.
    #[error("task {id:?} is not ready before {at:?}")]
    NotReady {
        /// The task id.
        id: String,
        /// When it becomes claimable.
        at: SystemTime,
    },
    /// A typed payload or result does not encode as JSON, or the stored
    /// bytes are not the JSON of the type asked for (see [`TypedBoard`]).
    #[error("task {id:?}: {reason}")]
    Payload {
        /// The task id.
        id: String,
        /// What did not encode or decode, and why.
        reason: String,
    },
    /// This board implementation does not offer the call.
    #[error("this board does not support {what}")]
    Unsupported {
        /// The call.
        what: &'static str,
    },
    /// The call was refused before touching the store (empty id or agent,
    /// TTL under one millisecond, a task depending on itself, ...).
    #[error("invalid board input: {0}")]
    Invalid(InvalidInput),
    /// The store failed (unreachable, indeterminate, malformed record, too
    /// much contention).
    #[error("board store error: {0}")]
    Store(#[source] coord_backend::Error),
}

crate::wake::store_errors!(BoardError);

/// A board claim as a [`ClaimGuard`] holds it: the claim, its TTL, and when
/// the claiming request was sent (the lease counts from then).
#[derive(Clone, Debug)]
pub struct HeldClaim {
    /// The claim (its token renews and releases it).
    pub task: ClaimedTask,
    /// The TTL each renewal extends the lease by.
    pub ttl: Duration,
    /// When the claiming request was sent (local monotonic time).
    pub requested: tokio::time::Instant,
}

/// A held task claim that renews itself in the background (the
/// [`Guard`](crate::guard::Guard) of a [`Board`]; see [`crate::guard`]).
/// Its [`fence`](crate::guard::Guard::fence) is the claim's takeover fence.
/// [`ClaimGuard::complete`] completes the task; dropping or releasing the
/// guard gives it back.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::board::{Board, BoardAdapter, ClaimGuard, TaskSpec};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let board: Arc<dyn Board> = Arc::new(BoardAdapter::new(Arc::new(SingleProcessMemoryBackend::new("demo")?)));
/// board.add(TaskSpec::new("fetch", b"url".to_vec())).await?;
/// let claim = ClaimGuard::claim(&board, "fetch", "agent-1", Duration::from_secs(60)).await?;
/// claim.complete(b"42 rows".to_vec()).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub type ClaimGuard = crate::guard::Guard<dyn Board>;

#[async_trait]
impl<'a> crate::guard::Renew for dyn Board + 'a {
    type Held = HeldClaim;
    type Error = BoardError;

    async fn renew_grant(&self, held: &HeldClaim) -> Result<(), BoardError> {
        self.renew(&held.task.id, &held.task.token, held.ttl)
            .await
            .map(|_| ())
    }

    async fn release_grant(&self, held: HeldClaim) -> Result<(), BoardError> {
        self.release(&held.task.id, &held.task.token).await
    }

    fn lease(held: &HeldClaim) -> crate::guard::Lease<'_> {
        crate::guard::Lease {
            key: &held.task.id,
            fence: held.task.fence,
            ttl: held.ttl,
            requested: held.requested,
        }
    }

    fn expired(held: &HeldClaim) -> BoardError {
        BoardError::LeaseLost {
            id: held.task.id.clone(),
        }
    }
}

impl crate::guard::Guard<dyn Board> {
    /// Claim task `id` for `agent` (see [`Board::claim`]) and guard the claim.
    pub async fn claim(
        board: &std::sync::Arc<dyn Board>,
        id: &str,
        agent: &str,
        ttl: Duration,
    ) -> Result<Self, BoardError> {
        let requested = tokio::time::Instant::now();
        let task = board.claim(id, agent, ttl).await?;
        Ok(Self::new(
            board.clone(),
            HeldClaim {
                task,
                ttl,
                requested,
            },
            crate::guard::GuardOptions::default(),
        ))
    }

    /// The guarded claim.
    pub fn task(&self) -> &ClaimedTask {
        &self.held().task
    }

    /// Stop renewing, then complete the task with `result` (see
    /// [`Board::complete`]). `LeaseLost` when the claim was lost meanwhile.
    pub async fn complete(self, result: Vec<u8>) -> Result<(), BoardError> {
        let (board, held) = self.into_parts().await;
        board
            .complete(&held.task.id, &held.task.token, result)
            .await
    }
}

/// A task board. Object safe: use `Arc<dyn Board>`. See the [module docs](self)
/// for the contract (checked by `coord_conformance::board`).
#[async_trait]
pub trait Board: Send + Sync + Debug {
    /// Put a task on the board (no-op if it exists with the same content).
    async fn add(&self, task: TaskSpec) -> Result<(), BoardError>;

    /// Put several tasks on the board, one after another.
    async fn seed(&self, tasks: Vec<TaskSpec>) -> Result<(), BoardError> {
        for task in tasks {
            self.add(task).await?;
        }
        Ok(())
    }

    /// Claim `id` for `agent` for `ttl`, atomically, if every dependency is completed.
    async fn claim(&self, id: &str, agent: &str, ttl: Duration) -> Result<ClaimedTask, BoardError>;

    /// Extend the lease of the claim holding `token` to `ttl` from now.
    async fn renew(&self, id: &str, token: &str, ttl: Duration) -> Result<ClaimedTask, BoardError>;

    /// Give the task back (it becomes claimable; its fence stays).
    async fn release(&self, id: &str, token: &str) -> Result<(), BoardError>;

    /// Mark the task completed with `result`.
    async fn complete(&self, id: &str, token: &str, result: Vec<u8>) -> Result<(), BoardError>;

    /// One task.
    async fn get(&self, id: &str) -> Result<Task, BoardError>;

    /// Every task on the board, sorted by id.
    async fn list(&self) -> Result<Vec<Task>, BoardError>;

    /// Put several tasks on the board in one atomic step: all of them or
    /// none (see [`BoardAdapter::add_many`] for how many fit).
    async fn add_many(&self, tasks: Vec<TaskSpec>) -> Result<(), BoardError> {
        let _ = tasks;
        Err(BoardError::Unsupported { what: "add_many" })
    }

    /// Claim the next ready task of `queue` for `agent` for `ttl`: the
    /// highest priority first, the longest ready first within a priority
    /// (see [`BoardAdapter::claim_next`]); `None` when none is ready.
    async fn claim_next(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
    ) -> Result<Option<ClaimedTask>, BoardError> {
        let _ = (queue, agent, ttl);
        Err(BoardError::Unsupported { what: "claim_next" })
    }

    /// [`Board::claim_next`], waiting up to `timeout` for a task to become
    /// ready. The default polls; [`BoardAdapter`] sleeps on the store's
    /// change notifications (polling without them).
    async fn claim_next_wait(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Option<ClaimedTask>, BoardError> {
        let deadline = crate::wake::later(tokio::time::Instant::now(), timeout);
        loop {
            if let Some(task) = self.claim_next(queue, agent, ttl).await? {
                return Ok(Some(task));
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            tokio::time::sleep_until(deadline.min(now + Duration::from_millis(200))).await;
        }
    }

    /// The attempt of the claim holding `token` failed with `error`: the
    /// task is retried after its backoff, or is dead if that was its last
    /// attempt (see [`RetryPolicy`]).
    async fn fail(&self, id: &str, token: &str, error: &str) -> Result<Failed, BoardError> {
        let _ = (id, token, error);
        Err(BoardError::Unsupported { what: "fail" })
    }

    /// The holder of `token` does not know whether its attempt took effect
    /// (`error` says why): the task becomes [`TaskState::Uncertain`], never
    /// claimed again until an operator's verdict (see
    /// [`TaskSpec::at_most_once`]).
    async fn mark_uncertain(&self, id: &str, token: &str, error: &str) -> Result<(), BoardError> {
        let _ = (id, token, error);
        Err(BoardError::Unsupported {
            what: "mark_uncertain",
        })
    }

    /// Cancel a task that is not completed: never claimed again. A live
    /// claim's holder finds its lease lost.
    async fn cancel(&self, id: &str) -> Result<(), BoardError> {
        let _ = id;
        Err(BoardError::Unsupported { what: "cancel" })
    }

    /// Make a dead (or uncertain) task claimable again, its attempts
    /// counted from zero.
    async fn retry_dead(&self, id: &str) -> Result<(), BoardError> {
        let _ = id;
        Err(BoardError::Unsupported { what: "retry_dead" })
    }

    /// The names of the queues tasks were added to, sorted, the first
    /// `limit` (see [`BoardAdapter::queues`]).
    async fn queues(&self, limit: usize) -> Result<QueueNames, BoardError> {
        let _ = limit;
        Err(BoardError::Unsupported { what: "queues" })
    }

    /// `queue`'s ready, timed and dead counts and the age of its oldest
    /// ready task, each listing bounded by `limit` (see
    /// [`BoardAdapter::queue_depth`]).
    async fn queue_depth(&self, queue: &str, limit: usize) -> Result<QueueDepth, BoardError> {
        let _ = (queue, limit);
        Err(BoardError::Unsupported {
            what: "queue_depth",
        })
    }

    /// The first `limit` dead tasks of `queue`, longest dead first, with
    /// their errors (see [`BoardAdapter::dead_tasks`]).
    async fn dead_tasks(&self, queue: &str, limit: usize) -> Result<DeadTasks, BoardError> {
        let _ = (queue, limit);
        Err(BoardError::Unsupported { what: "dead_tasks" })
    }
}

/// Checks every board implementation should run first.
pub fn validate_task_id(id: &str) -> Result<(), BoardError> {
    if id.is_empty() {
        return Err(BoardError::Invalid(InvalidInput::EmptyKey));
    }
    if id.contains('\0') {
        return Err(BoardError::Invalid(InvalidInput::NulByte(id.to_owned())));
    }
    Ok(())
}

/// Checks of a claim's agent and TTL every board implementation should run first.
pub fn validate_claim(id: &str, agent: &str, ttl: Duration) -> Result<(), BoardError> {
    validate_task_id(id)?;
    if agent.is_empty() {
        return Err(BoardError::Invalid(InvalidInput::Argument(
            "empty agent name".into(),
        )));
    }
    validate_ttl(ttl)
}

fn validate_ttl(ttl: Duration) -> Result<(), BoardError> {
    if ttl < Duration::from_millis(1) {
        return Err(BoardError::Invalid(InvalidInput::Argument(format!(
            "lease ttl must be at least 1 ms, got {ttl:?}"
        ))));
    }
    Ok(())
}

/// A queue name: non-empty, no `/` (it is a key component), no NUL.
pub fn validate_queue(queue: &str) -> Result<(), BoardError> {
    if queue.is_empty() || queue.contains('/') || queue.contains('\0') {
        return Err(BoardError::Invalid(InvalidInput::Argument(format!(
            "queue name {queue:?} must be non-empty, without '/' or NUL"
        ))));
    }
    Ok(())
}

fn validate_spec(spec: &TaskSpec) -> Result<(), BoardError> {
    validate_task_id(&spec.id)?;
    if let Some(queue) = &spec.queue {
        validate_queue(queue)?;
    }
    if spec.retry.max_attempts == Some(0) {
        return Err(BoardError::Invalid(InvalidInput::Argument(
            "max_attempts must be at least 1".into(),
        )));
    }
    if spec.retry.initial_backoff > spec.retry.max_backoff {
        return Err(BoardError::Invalid(InvalidInput::Argument(format!(
            "initial backoff {:?} above the max backoff {:?}",
            spec.retry.initial_backoff, spec.retry.max_backoff
        ))));
    }
    for dep in &spec.deps {
        validate_task_id(dep)?;
        if dep == &spec.id {
            return Err(BoardError::Invalid(InvalidInput::Argument(format!(
                "task {:?} depends on itself",
                spec.id
            ))));
        }
    }
    Ok(())
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn debug_shows_no_payload_result_or_token() {
        let spec = TaskSpec::new("t1", b"SECRET-payload".to_vec());
        let task = Task {
            id: "t1".into(),
            payload: b"SECRET-payload".to_vec(),
            deps: Vec::new(),
            fence: 2,
            state: TaskState::Completed {
                agent: "a".into(),
                result: b"SECRET-result".to_vec(),
            },
            queue: None,
            priority: 0,
            attempts: 1,
            max_attempts: None,
            last_error: None,
            not_before: None,
        };
        let claimed = ClaimedTask {
            id: "t1".into(),
            payload: b"SECRET-payload".to_vec(),
            deps: Vec::new(),
            agent: "a".into(),
            token: "SECRET-token".into(),
            fence: 2,
            expires_at: SystemTime::UNIX_EPOCH,
        };
        for shown in [
            format!("{spec:?}"),
            format!("{task:?}"),
            format!("{claimed:?}"),
        ] {
            assert!(!shown.contains("SECRET"), "{shown}");
        }
    }
}

#[cfg(test)]
mod error_tests {
    use super::BoardError;
    use crate::lock::LockError;

    #[test]
    fn store_errors_keep_their_source() {
        let store =
            || coord_backend::Error::unavailable("store down", std::io::Error::other("refused"));
        let lock = LockError::from(store());
        let board = BoardError::from(store());
        for error in [&lock as &dyn std::error::Error, &board] {
            let source = error.source().expect("the store error is the source");
            assert!(source.to_string().contains("store down"), "{source}");
            assert!(
                source.source().is_some(),
                "the I/O error underneath is kept"
            );
        }
    }
}
