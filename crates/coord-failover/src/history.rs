//! What the workloads record: every event with monotonic timestamps
//! (microseconds since the round started, [`Micros`]).

use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// Microseconds since the start of a round (monotonic clock).
pub type Micros = u64;

/// A value of a raw register key: `None` while the key is missing, else the
/// unique number the txn that wrote it put there.
pub type Value = Option<u64>;

/// What a raw txn came back with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TxnResult {
    /// Applied (acknowledged write).
    Applied,
    /// Rejected: the asserted version was not current.
    Rejected,
    /// Sent, answer lost (`Indeterminate`, or any error after sending, or
    /// the harness's own timeout): applied or not, nobody knows.
    Unknown,
}

/// One operation on a raw key (a snapshot read, or a conditional txn).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawKind {
    /// A snapshot read that returned `value`.
    Read {
        /// What it read.
        value: Value,
    },
    /// A txn asserting the version at which `expected` was read, putting `new`.
    Cas {
        /// The value read before (whose version the txn asserted).
        expected: Value,
        /// The fresh unique value it put.
        new: u64,
        /// What came back.
        result: TxnResult,
    },
}

/// A raw-primitive operation. Failed reads and txns that failed with
/// `Unavailable` (nothing sent) are not recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawOp {
    /// The register key.
    pub key: String,
    /// Which client ran it.
    pub client: usize,
    /// When it was called.
    pub call: Micros,
    /// When it returned (also for `Unknown` txns: the checker puts their
    /// response at the end of the history anyway).
    pub ret: Micros,
    /// What it was and what it returned.
    pub kind: RawKind,
}

/// One grant (a lock, fair lock or semaphore permit, or a board claim) and
/// how long its holder may have relied on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The key (grants of one key share its fences and its `permits`).
    pub key: String,
    /// How many grants of the key may be live at once (1: a lock, a claim).
    pub permits: u32,
    /// Which holder got it.
    pub holder: usize,
    /// The grant's fencing token.
    pub fence: u64,
    /// When the acquiring call was made.
    pub call: Micros,
    /// When the grant came back.
    pub granted: Micros,
    /// The end of the holder's validity: the send time of the grant or of its
    /// last successful renewal plus the TTL, cut at the release call.
    pub until: Micros,
}

/// A write through the fenced sink that the sink accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SinkWrite {
    /// The sink resource (the lock key).
    pub resource: String,
    /// The fence presented.
    pub fence: u64,
    /// When it was called.
    pub call: Micros,
    /// When it returned.
    pub ret: Micros,
}

/// One application of a side effect (the effect's own in-process log).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Apply {
    /// The action's idempotency key.
    pub action: String,
    /// Which runner applied it.
    pub runner: usize,
    /// The fence of the lease it applied under.
    pub fence: u64,
    /// When.
    pub at: Micros,
}

/// What a once-only effect belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EffectOf {
    /// A board task (its id).
    Task(String),
    /// A scheduler slot (UTC ms).
    Slot(u64),
}

/// An effect acknowledged to `who`: the txn creating the effect's key over
/// "missing" applied (or came back rejected with `who`'s own value: its
/// earlier copy, whose answer was lost, had landed). The key is never
/// deleted, so a second acknowledged creation means the store forgot the
/// first (a late copy of a txn asserting "missing" cannot apply over it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Effect {
    /// Whose effect.
    pub of: EffectOf,
    /// Who applied it (worker or instance, and its fence or takeover count).
    pub who: String,
    /// When it was acknowledged.
    pub at: Micros,
}

/// A completion of a board task acknowledged to a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The task id.
    pub task: String,
    /// Which worker.
    pub worker: usize,
    /// The fence of the claim it completed under.
    pub fence: u64,
    /// When the (first) complete call was made.
    pub call: Micros,
    /// When the acknowledgement came back.
    pub ret: Micros,
}

/// A start of a scheduler handler for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRun {
    /// The slot (UTC ms).
    pub slot: u64,
    /// The instance that ran it.
    pub instance: String,
    /// How many times the slot had been taken over before this run.
    pub takeovers: u32,
    /// When the handler started.
    pub at: Micros,
}

/// A fault the loop injected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultEvent {
    /// What (e.g. `kill etcd leader 127.0.0.1:2382`).
    pub what: String,
    /// When the signal was sent.
    pub at: Micros,
    /// When the topology itself had a new leader or primary (`None`: not
    /// seen): an etcd survivor said it was the leader, `promote-standby`
    /// returned, the Redis Cluster showed 3 primaries again (the replica
    /// took the slots over), the Sentinels named another primary and it
    /// answered as one.
    pub new_leader_at: Option<Micros>,
}

/// Everything one round recorded.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Raw-primitive operations.
    pub raw: Vec<RawOp>,
    /// Lock grants.
    pub grants: Vec<Grant>,
    /// Accepted fenced-sink writes.
    pub sink_writes: Vec<SinkWrite>,
    /// Side-effect applications.
    pub applies: Vec<Apply>,
    /// Acknowledged once-only effects of board tasks and scheduler slots.
    pub effects: Vec<Effect>,
    /// Acknowledged board completions.
    pub completions: Vec<Completion>,
    /// Scheduler handler starts.
    pub slot_runs: Vec<SlotRun>,
    /// Successful operations of any workload, as (call, return): a raw read
    /// or a decided txn, a grant or renewal, an applied or replayed effect,
    /// a board claim or completion, a decided effect txn.
    pub successes: Vec<(Micros, Micros)>,
    /// The faults, in order.
    pub faults: Vec<FaultEvent>,
}

/// A [`History`] shared by the workload tasks, with the round's start instant.
#[derive(Clone, Debug)]
pub struct Recorder {
    start: Instant,
    history: Arc<Mutex<History>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Recorder {
            start: Instant::now(),
            history: Arc::default(),
        }
    }

    /// Now, in microseconds since the start.
    pub fn now(&self) -> Micros {
        self.at(Instant::now())
    }

    /// `instant`, in microseconds since the start (0 before it).
    pub fn at(&self, instant: Instant) -> Micros {
        u64::try_from(instant.saturating_duration_since(self.start).as_micros()).unwrap_or(u64::MAX)
    }

    /// Add to the history.
    pub fn record(&self, f: impl FnOnce(&mut History)) {
        f(&mut self.history.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// A copy of everything recorded so far.
    pub fn snapshot(&self) -> History {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}
