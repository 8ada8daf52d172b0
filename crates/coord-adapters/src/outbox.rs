//! A transactional outbox: record an intent with the caller's own rows, run
//! it at most once, later, on whichever dispatcher takes it.
//!
//! # Contract
//!
//! - [`Outbox::enqueue`] records an intent (a key and a payload) as ONE
//!   board task in one txn. Through a backend bound to the caller's SQL
//!   transaction (`coord_postgres::InTransaction`,
//!   `coord_sqlite::InTransaction`) that txn commits or rolls back with the
//!   caller's rows: a rolled-back intent never existed, a committed one is
//!   there for the dispatchers.
//! - A key is recorded once: enqueuing it again with the same payload is a
//!   no-op (deduplicated), with another payload it is refused
//!   ([`BoardError::AlreadyExists`]), for as long as its task is kept (until
//!   retention prunes it, see `coord_adapters::maintenance`).
//! - [`Dispatcher::dispatch_next`] claims the next ready intent (the board's
//!   `claim_next`: spread over the head of the queue, one winner per task),
//!   runs the handler with the claim's fence, and records what it answered:
//!   - `Ok(result)`: the task is completed with `result` (kept until
//!     retention);
//!   - [`HandlerError::NotApplied`] (nothing happened, e.g. the mail server
//!     was unavailable): the task is failed, retried after its backoff, and
//!     dead once its attempts are used up ([`Outbox::with_retry`]);
//!   - [`HandlerError::Unknown`] (it may have happened): the task becomes
//!     [`TaskState::Uncertain`] and is never run again until
//!     [`Outbox::resolve`] gives a verdict.
//! - **At most once.** Every intent is an at-most-once task
//!   ([`TaskSpec::at_most_once`]): a dispatcher that dies (or pauses past its
//!   lease) mid-run leaves a claim that runs out, and the next dispatcher
//!   that meets it makes it uncertain instead of running it again. So an
//!   intent runs once, or is reported uncertain; never twice without an
//!   operator's verdict. Its side effect gets [`Intent::fence`] to fence a
//!   late write downstream.
//! - Several dispatchers (threads, processes, hosts) may run at once; each
//!   intent is claimed by one.
//!
//! # Round trips
//!
//! An intent costs the caller's transaction one txn (the board's add). A
//! dispatch is the claim (a txn, plus a listing of the queue's head shared
//! by many claims) and the completion (a txn): two txns, where running the
//! handler through the side-effect `Runner` would add its own three
//! (acquire, ownership check, complete). The task record carries the same
//! promise (at most once, uncertain when unknown, a fence per run).
//!
//! # Where it lives
//!
//! On the board, under the default `board/` prefix: the queue
//! `outbox.<name>`, task ids `outbox/<name>/<key>`. So `coordctl board`,
//! the console's task page, the queue metrics and `coordctl gc` (retention)
//! see every outbox as they see any queue.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! use std::sync::Arc;
//! use coord_adapters::outbox::{Dispatched, HandlerError, Outbox};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! let store = Arc::new(SingleProcessMemoryBackend::new("outbox-docs")?);
//! // In a service: `Outbox::new(in_tx.clone(), "mail")` inside the SQL transaction.
//! let outbox = Outbox::new(store, "mail")?;
//! outbox.enqueue("order-42/confirmation", b"to: ada@example.invalid".to_vec()).await?;
//!
//! let dispatcher = outbox.dispatcher("worker-1");
//! let done = dispatcher
//!     .dispatch_next(|intent| async move {
//!         // send the mail, passing intent.fence downstream ...
//!         Ok::<_, HandlerError>(format!("sent {}", intent.key).into_bytes())
//!     })
//!     .await?;
//! assert!(matches!(done, Some(Dispatched::Applied { .. })));
//! // Nothing left to run.
//! assert!(dispatcher.dispatch_next(|_| async { Ok(Vec::new()) }).await?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use coord_backend::{Backend, InvalidInput};

use crate::board::{
    validate_queue, Board, BoardAdapter, BoardError, BoardOptions, ClaimedTask, Failed,
    RetryPolicy, Task, TaskSpec, TaskState,
};
use crate::sideeffect::BoxError;

/// The default lease of a dispatcher's claim; renewed every third of it
/// while the handler runs.
pub const DEFAULT_TTL: Duration = Duration::from_secs(60);

/// An outbox: where intents are recorded (see the module docs).
#[derive(Clone, Debug)]
pub struct Outbox {
    board: Arc<dyn Board>,
    name: String,
    queue: String,
    retry: RetryPolicy,
}

impl Outbox {
    /// The outbox `name` (non-empty, no `/`) on the board of `backend`
    /// (default [`BoardOptions`]).
    pub fn new(backend: Arc<dyn Backend>, name: &str) -> Result<Outbox, BoardError> {
        Outbox::with_options(backend, name, BoardOptions::default())
    }

    /// [`Outbox::new`] with the board's options (its clock, its CAS options).
    pub fn with_options(
        backend: Arc<dyn Backend>,
        name: &str,
        options: BoardOptions,
    ) -> Result<Outbox, BoardError> {
        Outbox::over(Arc::new(BoardAdapter::with_options(backend, options)), name)
    }

    /// The outbox `name` on any [`Board`].
    pub fn over(board: Arc<dyn Board>, name: &str) -> Result<Outbox, BoardError> {
        let queue = format!("outbox.{name}");
        validate_queue(name)?;
        Ok(Outbox {
            board,
            name: name.to_owned(),
            queue,
            retry: RetryPolicy {
                max_attempts: Some(10),
                initial_backoff: Duration::from_secs(1),
                max_backoff: Duration::from_secs(300),
            },
        })
    }

    /// The retry policy of intents enqueued from now on: how often a
    /// handler answering [`HandlerError::NotApplied`] is tried again
    /// (default: 10 attempts, backoff from 1 s doubling to 5 minutes).
    pub fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// The outbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The board queue its intents wait in: `outbox.<name>`.
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The board task id of `key`: `outbox/<name>/<key>`.
    pub fn task_id(&self, key: &str) -> String {
        format!("outbox/{}/{key}", self.name)
    }

    /// Record the intent `key` with `payload` (one txn; see the module docs
    /// for a key enqueued twice).
    pub async fn enqueue(&self, key: &str, payload: Vec<u8>) -> Result<(), BoardError> {
        validate_key(key)?;
        let spec = TaskSpec::new(self.task_id(key), payload)
            .in_queue(self.queue.clone())
            .with_retry(self.retry)
            .at_most_once();
        self.board.add(spec).await
    }

    /// The task of intent `key` (its state, attempts, last error, result).
    pub async fn status(&self, key: &str) -> Result<Task, BoardError> {
        validate_key(key)?;
        self.board.get(&self.task_id(key)).await
    }

    /// An operator's verdict on an uncertain intent (or one whose attempts
    /// ran out): `NotApplied` runs it again (its attempts from zero);
    /// `Applied` closes it for good (its task cancelled: never run). Any
    /// other state is refused ([`BoardError::Invalid`]) and nothing changes.
    pub async fn resolve(&self, key: &str, verdict: Verdict) -> Result<(), BoardError> {
        let task = self.status(key).await?;
        let id = self.task_id(key);
        match (&task.state, verdict) {
            (TaskState::Uncertain { .. } | TaskState::Dead { .. }, Verdict::NotApplied) => {
                self.board.retry_dead(&id).await
            }
            (TaskState::Uncertain { .. } | TaskState::Dead { .. }, Verdict::Applied) => {
                self.board.cancel(&id).await
            }
            (state, _) => Err(BoardError::Invalid(InvalidInput::Argument(format!(
                "intent {key:?} is not uncertain or dead ({state:?}): nothing to resolve"
            )))),
        }
    }

    /// A dispatcher of this outbox, named `agent` in its claims.
    pub fn dispatcher(&self, agent: &str) -> Dispatcher {
        Dispatcher {
            outbox: self.clone(),
            agent: agent.to_owned(),
            ttl: DEFAULT_TTL,
        }
    }
}

/// An operator's verdict on an intent whose outcome is unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It took effect: never run it.
    Applied,
    /// It did not take effect: run it again.
    NotApplied,
}

/// One intent, as a handler gets it.
#[derive(Clone, PartialEq, Eq)]
pub struct Intent {
    /// The key it was enqueued under.
    pub key: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// The claim's fence: higher than every earlier claim of this intent;
    /// pass it downstream to refuse a late write of an earlier run.
    pub fence: u64,
}

impl std::fmt::Debug for Intent {
    // The payload is application data: only its length is shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Intent")
            .field("key", &self.key)
            .field("payload_len", &self.payload.len())
            .field("fence", &self.fence)
            .finish()
    }
}

/// Why a handler did not produce a result.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandlerError {
    /// Nothing took effect (the downstream service refused or could not be
    /// reached before anything was sent): retried after a backoff.
    #[error("not applied: {0}")]
    NotApplied(#[source] BoxError),
    /// It may have taken effect (a timeout after sending, a crash of the
    /// downstream call): the intent becomes uncertain, run again only on
    /// an operator's verdict.
    #[error("outcome unknown: {0}")]
    Unknown(#[source] BoxError),
}

impl HandlerError {
    /// [`HandlerError::NotApplied`] from any error.
    pub fn not_applied(error: impl Into<BoxError>) -> Self {
        HandlerError::NotApplied(error.into())
    }

    /// [`HandlerError::Unknown`] from any error.
    pub fn unknown(error: impl Into<BoxError>) -> Self {
        HandlerError::Unknown(error.into())
    }
}

/// What one dispatch did with the intent it claimed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dispatched {
    /// The handler answered a result; it is recorded.
    Applied {
        /// The intent's key.
        key: String,
    },
    /// The handler said nothing took effect; it runs again from `at`.
    WillRetry {
        /// The intent's key.
        key: String,
        /// When it is claimable again.
        at: SystemTime,
    },
    /// The handler said nothing took effect, and that was its last
    /// attempt: dead until [`Outbox::resolve`].
    GaveUp {
        /// The intent's key.
        key: String,
    },
    /// The handler said its outcome is unknown: uncertain until
    /// [`Outbox::resolve`].
    Uncertain {
        /// The intent's key.
        key: String,
    },
    /// The claim ran out (and another dispatcher may have found it so)
    /// before the answer was recorded: whatever the handler did, the intent
    /// is (or will be) uncertain, resolved by an operator.
    LeaseLost {
        /// The intent's key.
        key: String,
    },
}

/// Takes intents of one outbox and runs them (see the module docs).
#[derive(Clone, Debug)]
pub struct Dispatcher {
    outbox: Outbox,
    agent: String,
    ttl: Duration,
}

impl Dispatcher {
    /// The lease of each claim (default [`DEFAULT_TTL`]), renewed every
    /// third of it while the handler runs. A dispatcher paused longer than
    /// this leaves its intent uncertain.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Claim the next ready intent, run `handler` on it, record its answer;
    /// `None` when no intent is ready. A store error while claiming is
    /// returned (nothing ran); one while recording the answer is returned
    /// too, and the intent's claim then runs out, so the intent becomes
    /// uncertain (never run twice).
    pub async fn dispatch_next<H, Fut>(&self, handler: H) -> Result<Option<Dispatched>, BoardError>
    where
        H: FnOnce(Intent) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, HandlerError>>,
    {
        let claimed = self
            .outbox
            .board
            .claim_next(&self.outbox.queue, &self.agent, self.ttl)
            .await?;
        self.run_if_claimed(claimed, handler).await
    }

    /// [`Dispatcher::dispatch_next`], waiting up to `timeout` for an intent
    /// to be ready (on the store's change notifications, polling without).
    pub async fn dispatch_next_wait<H, Fut>(
        &self,
        timeout: Duration,
        handler: H,
    ) -> Result<Option<Dispatched>, BoardError>
    where
        H: FnOnce(Intent) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, HandlerError>>,
    {
        let claimed = self
            .outbox
            .board
            .claim_next_wait(&self.outbox.queue, &self.agent, self.ttl, timeout)
            .await?;
        self.run_if_claimed(claimed, handler).await
    }

    /// [`Dispatcher::run_claimed`] when a claim was made.
    async fn run_if_claimed<H, Fut>(
        &self,
        claimed: Option<ClaimedTask>,
        handler: H,
    ) -> Result<Option<Dispatched>, BoardError>
    where
        H: FnOnce(Intent) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, HandlerError>>,
    {
        match claimed {
            Some(task) => self.run_claimed(task, handler).await.map(Some),
            None => Ok(None),
        }
    }

    /// Dispatch until `stop` completes: each intent as
    /// [`Dispatcher::dispatch_next_wait`] does, waiting up to a second at a
    /// time; a store error is logged and retried after a pause (a
    /// dispatcher outlives an outage). `on_dispatch` sees every outcome.
    ///
    /// `stop` is honoured between dispatches only, never in the middle of
    /// one: a dispatch cut short would leave its claim (perhaps already
    /// committed) to run out, and its intent uncertain. So stopping takes
    /// up to a second of waiting plus the handler that is running.
    pub async fn run<H, Fut>(
        &self,
        handler: H,
        mut on_dispatch: impl FnMut(&Dispatched),
        stop: impl Future<Output = ()>,
    ) where
        H: Fn(Intent) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, HandlerError>>,
    {
        tokio::pin!(stop);
        let mut pause = Duration::from_millis(100);
        loop {
            // Between dispatches: stop now if asked, without waiting.
            tokio::select! {
                biased;
                () = &mut stop => return,
                () = std::future::ready(()) => {}
            }
            let step = self
                .dispatch_next_wait(Duration::from_secs(1), &handler)
                .await;
            match step {
                Ok(Some(done)) => {
                    pause = Duration::from_millis(100);
                    on_dispatch(&done);
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, outbox = %self.outbox.name, "outbox dispatch failed; retrying");
                    tokio::select! {
                        biased;
                        () = &mut stop => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Run `handler` on the claimed `task` (renewing its lease meanwhile)
    /// and record the answer.
    async fn run_claimed<H, Fut>(
        &self,
        task: ClaimedTask,
        handler: H,
    ) -> Result<Dispatched, BoardError>
    where
        H: FnOnce(Intent) -> Fut,
        Fut: Future<Output = Result<Vec<u8>, HandlerError>>,
    {
        let board = &self.outbox.board;
        let prefix = format!("outbox/{}/", self.outbox.name);
        let key = task.id.strip_prefix(&prefix).unwrap_or(&task.id).to_owned();
        let intent = Intent {
            key: key.clone(),
            payload: task.payload.clone(),
            fence: task.fence,
        };
        let answer = {
            let run = handler(intent);
            tokio::pin!(run);
            let every = (self.ttl / 3).max(Duration::from_millis(1));
            loop {
                tokio::select! {
                    biased;
                    answer = &mut run => break answer,
                    () = tokio::time::sleep(every) => {
                        // A lost lease is found when the answer is recorded;
                        // the handler cannot be stopped half way anyway.
                        if let Err(error) = board.renew(&task.id, &task.token, self.ttl).await {
                            tracing::debug!(%error, key = %key, "outbox: renewing a claim failed");
                        }
                    }
                }
            }
        };
        let recorded = match answer {
            Ok(result) => board
                .complete(&task.id, &task.token, result)
                .await
                .map(|()| Dispatched::Applied { key: key.clone() }),
            Err(HandlerError::NotApplied(error)) => board
                .fail(&task.id, &task.token, &error.to_string())
                .await
                .map(|failed| match failed {
                    Failed::RetryAt(at) => Dispatched::WillRetry {
                        key: key.clone(),
                        at,
                    },
                    Failed::Dead => Dispatched::GaveUp { key: key.clone() },
                }),
            Err(HandlerError::Unknown(error)) => board
                .mark_uncertain(&task.id, &task.token, &error.to_string())
                .await
                .map(|()| Dispatched::Uncertain { key: key.clone() }),
        };
        match recorded {
            Err(BoardError::LeaseLost { .. }) => Ok(Dispatched::LeaseLost { key }),
            other => other,
        }
    }
}

/// An intent's key: non-empty, no NUL.
fn validate_key(key: &str) -> Result<(), BoardError> {
    if key.is_empty() {
        return Err(BoardError::Invalid(InvalidInput::EmptyKey));
    }
    if key.contains('\0') {
        return Err(BoardError::Invalid(InvalidInput::NulByte(key.to_owned())));
    }
    Ok(())
}
