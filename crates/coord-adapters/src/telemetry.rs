//! The metrics the adapters emit, through the `metrics` facade (a no-op
//! until the program installs a recorder; no exporter is forced on anyone).
//!
//! Every name and label is documented in docs/operations.md. Labels take
//! only the fixed values listed here: never a key, a token or a value, so
//! the number of series stays bounded whatever the workload.

/// Counter `coord_cas_attempts_total{store}`: txns the CAS engine sent
/// (first tries, retries after a rejection, and resends that settle a lost
/// answer). `store` is [`coord_backend::Backend::store_name`].
pub const CAS_ATTEMPTS_TOTAL: &str = "coord_cas_attempts_total";

/// Counter `coord_cas_conflicts_total{store}`: CAS engine txns rejected
/// because something the decision read had changed (contention).
pub const CAS_CONFLICTS_TOTAL: &str = "coord_cas_conflicts_total";

/// Counter `coord_lock_acquired_total`: locks granted by `try_lock` (and so by
/// every waiting acquisition), by [`crate::GenericLock`] and by the native
/// locks of `coord-locks-native`.
pub const LOCK_ACQUIRED_TOTAL: &str = "coord_lock_acquired_total";

/// Counter `coord_lock_lost_total{reason}`: a holder learned that its lock
/// is gone. Counted when a `renew` answers [`crate::LockError::Lost`] (reason
/// `expired`, `taken_over`, `not_held`) and when a [`crate::LockGuard`] gives
/// a lock up on its own (reason `expired`: its lease ran out before a renewal
/// answered; `error`: a renewal failed).
pub const LOCK_LOST_TOTAL: &str = "coord_lock_lost_total";

/// Counter `coord_sideeffect_total{outcome}`: calls of
/// [`crate::Runner::execute`] (and `execute_with`, `run`) by how they ended:
/// `applied`, `replayed`, `contended`, `uncertain` (the key was already
/// uncertain: nothing done), `outcome_unknown` (this call made the key
/// uncertain), `lease_lost`, `prepare_failed`, `apply_failed` (retry-safe
/// action, abandoned), `error` (anything else).
pub const SIDEEFFECT_TOTAL: &str = "coord_sideeffect_total";

/// Gauge `coord_sideeffect_uncertain`: side-effect keys whose outcome is
/// unknown and wait for a reconcile. Listing them walks `se/act/`, so no
/// adapter sets it on its own: a process that can afford the walk sets it
/// (`coordctl cron --metrics-addr` and `coordctl serve` do, per scrape).
pub const SIDEEFFECT_UNCERTAIN: &str = "coord_sideeffect_uncertain";

/// Counter `coord_pruned_total{adapter}`: final records removed by a
/// retention pass; `adapter` is `sideeffect` (`SideEffectAdapter::prune`)
/// or `board` (`BoardAdapter::prune`), both run by `coordctl gc`.
pub const PRUNED_TOTAL: &str = "coord_pruned_total";

/// Counter `coord_rwlock_acquired_total{mode}`: read-write lock grants by
/// [`crate::rwlock::GenericRwLock`] (`try_read`/`try_write` and the waiting
/// `read`/`write`), `mode` = `read` or `write`.
pub const RWLOCK_ACQUIRED_TOTAL: &str = "coord_rwlock_acquired_total";

/// Counter `coord_rwlock_lost_total{reason}`: a read-write lock holder's
/// `renew` answered [`crate::LockError::Lost`] (`reason` as for
/// [`LOCK_LOST_TOTAL`]: `expired`, `taken_over`, `not_held`).
pub const RWLOCK_LOST_TOTAL: &str = "coord_rwlock_lost_total";

/// Counter `coord_election_won_total`: campaigns won (a new term) by
/// [`crate::election::GenericElection`].
pub const ELECTION_WON_TOTAL: &str = "coord_election_won_total";

/// Counter `coord_election_lost_total{reason}`: a leader's `renew` or
/// `proclaim` answered [`crate::election::ElectionError::Lost`] (`expired`,
/// `taken_over`, `not_held`).
pub const ELECTION_LOST_TOTAL: &str = "coord_election_lost_total";

/// Gauge `coord_queue_ready{queue}`: ready tasks of a work queue (claimable
/// now). Like every `coord_queue_*` gauge, set by
/// [`crate::board::BoardAdapter::refresh_queue_metrics`] (which a process
/// calls on its own schedule; `coordctl serve` does per scrape), never by the
/// queue's calls themselves. The `queue` label is a queue name: the one
/// label whose values the application chooses, bounded by the queue names
/// it uses (and by the refresh's `max_queues`).
pub const QUEUE_READY: &str = "coord_queue_ready";

/// Gauge `coord_queue_timed{queue}`: tasks waiting for a time (a run-at or
/// a backoff ahead, or a live claim until its lease's end).
pub const QUEUE_TIMED: &str = "coord_queue_timed";

/// Gauge `coord_queue_depth{queue}`: ready + timed, the tasks of the queue
/// not completed, dead or cancelled (those waiting on dependencies aside).
pub const QUEUE_DEPTH: &str = "coord_queue_depth";

/// Gauge `coord_queue_dead{queue}`: dead tasks (attempts used up), waiting
/// for a `retry_dead` or a prune.
pub const QUEUE_DEAD: &str = "coord_queue_dead";

/// Gauge `coord_queue_oldest_ready_seconds{queue}`: how long the task ready
/// longest has been ready (0 when none is).
pub const QUEUE_OLDEST_READY_SECONDS: &str = "coord_queue_oldest_ready_seconds";

/// Gauge `coord_queue_truncated{queue}`: 1 when a listing behind the
/// queue's gauges stopped at its limit (those gauges are lower bounds).
pub const QUEUE_TRUNCATED: &str = "coord_queue_truncated";

/// Gauge `coord_queues_truncated`: 1 when there were more queues than the
/// refresh reads (the others have no gauges).
pub const QUEUES_TRUNCATED: &str = "coord_queues_truncated";

/// Every value of the `mode` label of [`RWLOCK_ACQUIRED_TOTAL`].
pub const RWLOCK_MODES: [&str; 2] = ["read", "write"];

/// Every value of the `reason` label of [`LOCK_LOST_TOTAL`].
pub const LOCK_LOST_REASONS: [&str; 4] = ["expired", "taken_over", "not_held", "error"];

/// Every value of the `outcome` label of [`SIDEEFFECT_TOTAL`].
pub const SIDEEFFECT_OUTCOMES: [&str; 9] = [
    "applied",
    "replayed",
    "contended",
    "uncertain",
    "outcome_unknown",
    "lease_lost",
    "prepare_failed",
    "apply_failed",
    "error",
];

/// Describe every metric of this module to the current recorder (HELP
/// text) and register the lock and side-effect series at 0, so an exporter
/// shows them before the first event. An exporter calls it once after
/// installing its recorder; libraries never need to.
pub fn describe() {
    metrics::describe_counter!(
        CAS_ATTEMPTS_TOTAL,
        "Txns sent by the CAS engine (first tries, retries, resends settling a lost answer)"
    );
    metrics::describe_counter!(
        CAS_CONFLICTS_TOTAL,
        "CAS engine txns rejected because something the decision read had changed"
    );
    metrics::describe_counter!(LOCK_ACQUIRED_TOTAL, "Locks granted");
    metrics::describe_counter!(
        LOCK_LOST_TOTAL,
        "Locks a holder learned it had lost, by reason"
    );
    metrics::describe_counter!(SIDEEFFECT_TOTAL, "Runner::execute calls, by outcome");
    metrics::describe_gauge!(
        SIDEEFFECT_UNCERTAIN,
        "Side-effect keys whose outcome is unknown (waiting for a reconcile)"
    );
    metrics::describe_counter!(
        PRUNED_TOTAL,
        "Final records (completed side-effect keys, completed board tasks) removed by retention, by adapter"
    );
    metrics::describe_counter!(
        RWLOCK_ACQUIRED_TOTAL,
        "Read-write lock grants, by mode (read, write)"
    );
    metrics::describe_counter!(
        RWLOCK_LOST_TOTAL,
        "Read-write lock holders that learned their lock is gone, by reason"
    );
    metrics::describe_counter!(
        ELECTION_WON_TOTAL,
        "Election campaigns won (each a new term)"
    );
    metrics::describe_counter!(
        ELECTION_LOST_TOTAL,
        "Leaders that learned their leadership is over, by reason"
    );
    metrics::describe_gauge!(QUEUE_READY, "Ready tasks of a work queue, by queue");
    metrics::describe_gauge!(
        QUEUE_TIMED,
        "Tasks of a work queue waiting for a run-at, a backoff or a claim's end, by queue"
    );
    metrics::describe_gauge!(QUEUE_DEPTH, "Ready + timed tasks of a work queue, by queue");
    metrics::describe_gauge!(QUEUE_DEAD, "Dead tasks of a work queue, by queue");
    metrics::describe_gauge!(
        QUEUE_OLDEST_READY_SECONDS,
        "Seconds the task ready longest has been ready (0: none), by queue"
    );
    metrics::describe_gauge!(
        QUEUE_TRUNCATED,
        "1 when a listing behind the queue's gauges stopped at its limit (lower bounds)"
    );
    metrics::describe_gauge!(
        QUEUES_TRUNCATED,
        "1 when there were more queues than the last refresh of the queue gauges read"
    );
    for mode in RWLOCK_MODES {
        metrics::counter!(RWLOCK_ACQUIRED_TOTAL, "mode" => mode).increment(0);
    }
    metrics::counter!(ELECTION_WON_TOTAL).increment(0);
    for reason in &LOCK_LOST_REASONS[..3] {
        metrics::counter!(RWLOCK_LOST_TOTAL, "reason" => *reason).increment(0);
        metrics::counter!(ELECTION_LOST_TOTAL, "reason" => *reason).increment(0);
    }
    metrics::counter!(LOCK_ACQUIRED_TOTAL).increment(0);
    for reason in LOCK_LOST_REASONS {
        metrics::counter!(LOCK_LOST_TOTAL, "reason" => reason).increment(0);
    }
    for outcome in SIDEEFFECT_OUTCOMES {
        metrics::counter!(SIDEEFFECT_TOTAL, "outcome" => outcome).increment(0);
    }
}

/// Export the CAS series of `store` at 0 before the first txn (a rate over
/// them then starts from 0).
pub(crate) fn register_cas(store: &'static str) {
    metrics::counter!(CAS_ATTEMPTS_TOTAL, "store" => store).increment(0);
    metrics::counter!(CAS_CONFLICTS_TOTAL, "store" => store).increment(0);
}

pub(crate) fn cas_attempt(store: &'static str) {
    metrics::counter!(CAS_ATTEMPTS_TOTAL, "store" => store).increment(1);
}

pub(crate) fn cas_conflict(store: &'static str) {
    metrics::counter!(CAS_CONFLICTS_TOTAL, "store" => store).increment(1);
}

/// Count a granted lock in [`LOCK_ACQUIRED_TOTAL`]; for [`crate::Lock`]
/// implementations outside this crate.
pub fn lock_acquired() {
    metrics::counter!(LOCK_ACQUIRED_TOTAL).increment(1);
}

/// Count a lost lock in [`LOCK_LOST_TOTAL`] with `reason` (one of
/// [`LOCK_LOST_REASONS`]).
pub(crate) fn lock_lost(reason: &'static str) {
    metrics::counter!(LOCK_LOST_TOTAL, "reason" => reason).increment(1);
}

pub(crate) fn rwlock_acquired(mode: &'static str) {
    metrics::counter!(RWLOCK_ACQUIRED_TOTAL, "mode" => mode).increment(1);
}

pub(crate) fn rwlock_lost(reason: &'static str) {
    metrics::counter!(RWLOCK_LOST_TOTAL, "reason" => reason).increment(1);
}

pub(crate) fn election_won() {
    metrics::counter!(ELECTION_WON_TOTAL).increment(1);
}

pub(crate) fn election_lost(reason: &'static str) {
    metrics::counter!(ELECTION_LOST_TOTAL, "reason" => reason).increment(1);
}

pub(crate) fn sideeffect(outcome: &'static str) {
    metrics::counter!(SIDEEFFECT_TOTAL, "outcome" => outcome).increment(1);
}

/// Set the `coord_queue_*` gauges of one queue from `depth`.
pub(crate) fn queue_depth(depth: &crate::board::QueueDepth) {
    let queue = depth.queue.clone();
    let count = |c: crate::board::BoundedCount| c.count as f64;
    metrics::gauge!(QUEUE_READY, "queue" => queue.clone()).set(count(depth.ready));
    metrics::gauge!(QUEUE_TIMED, "queue" => queue.clone()).set(count(depth.timed));
    metrics::gauge!(QUEUE_DEPTH, "queue" => queue.clone()).set(count(depth.depth()));
    metrics::gauge!(QUEUE_DEAD, "queue" => queue.clone()).set(count(depth.dead));
    let oldest = depth.oldest_ready_age.unwrap_or_default().as_secs_f64();
    metrics::gauge!(QUEUE_OLDEST_READY_SECONDS, "queue" => queue.clone()).set(oldest);
    metrics::gauge!(QUEUE_TRUNCATED, "queue" => queue).set(f64::from(u8::from(depth.truncated())));
}

/// Set `coord_queues_truncated`.
pub(crate) fn queues_truncated(more: bool) {
    metrics::gauge!(QUEUES_TRUNCATED).set(f64::from(u8::from(more)));
}

pub(crate) fn pruned(adapter: &'static str, removed: u64) {
    metrics::counter!(PRUNED_TOTAL, "adapter" => adapter).increment(removed);
}
