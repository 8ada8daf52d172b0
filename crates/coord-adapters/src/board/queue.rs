//! The board as a work queue: the index [`BoardAdapter::claim_next`] reads
//! instead of the board.
//!
//! # The index
//!
//! A task in a queue has at most one **entry** under `<prefix>queue/<queue>/`
//! (an empty value; the key says everything):
//!
//! - `r/<rank>/<since><seq>/<id>` while it is **ready**: not completed, dead
//!   or claimed, every dependency met, its run-at and backoff behind it.
//!   `<rank>` is `i16::MAX - priority` in 4 hex digits (higher priorities
//!   sort first), `<since>` the millisecond it became ready and `<seq>` a
//!   counter of this process (first in, first out within a priority).
//! - `t/<at>/<rank>/<id>` while it **waits for a time**: a run-at or a
//!   backoff ahead (`<at>` = then), or a claim (`<at>` = its lease's end: a
//!   claim that runs out is found here and taken over).
//!
//! The record names its entry (`indexed`), and an entry is written or
//! removed only by a txn that writes the task's record, asserted: the
//! record's version orders every change of the entry, so a late copy of a
//! txn cannot move an entry the record no longer names (the txn asserts a
//! record that has changed since).
//!
//! A dead task (its attempts used up; not a cancelled one) also has a
//! **dead entry** `d/<at>/<id>` (`<at>`: when it died), named by the
//! record's `dead_entry` under the same rule: written by the txn that makes
//! it dead (`finish`), removed by the one that retries,
//! cancels or prunes it. It lets [`BoardAdapter::queue_depth`] count and
//! [`BoardAdapter::dead_tasks`] list a queue's dead tasks without reading
//! the board. Every queued add also registers its queue's name,
//! `<prefix>queues/<queue>` (a blind put of an empty key in its txn), which
//! [`BoardAdapter::queues`] lists: one key per queue name ever used.
//!
//! A task waiting on dependencies has no entry. Adding it marks each
//! unmet dependency as awaited (`<prefix>waiters/<len>:<dep>`); completing
//! an awaited task reads the tasks waiting on it, marks it met in each and
//! gives those that are now ready their entry, in the txn that completes it.
//!
//! # Claiming the next task
//!
//! A client lists the first 128 ready entries, or as many as it aims into
//! (up to 1,024) when it has been losing races (keys only: one store read
//! however long the queue, `Backend::first_keys`), keeps the highest
//! priority present, and reads the records of a window of 8 of them (one
//! snapshot): from the first entry when it has not lost a race lately, from
//! a random one among the first `width` otherwise, `width` doubling with
//! each race lost (up to 1,024) and shrinking with each first try won. It then claims
//! from that window, one txn per claim, until the window is used up or
//! 250 ms old, or an entry of it turns out taken by another client (the
//! rest of it is as stale), and lists again. One worker gets strict priority-then-FIFO
//! order (a task added ahead of its window waits at most 8 of its claims or
//! 250 ms); 32 workers spread over the head instead of all colliding on it.
//! Timed entries are read too when nothing is ready, and at most once a
//! second otherwise: a task whose run-at passed (or whose claim ran out)
//! waits at most that long behind a busy queue's ready tasks.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use coord_backend::{Error, Mutation};

use super::adapter::BoardAdapter;
use super::record::{BackoffRecord, DeadRecord, TaskRecord};
use super::{BoardError, RetryPolicy};
use crate::cas::{whole_millis, Record};

/// How many entries of a queue's head one listing reads (keys only), at
/// least: a client that keeps losing races reads as far as it aims, up to
/// [`MAX_HEAD`].
pub(super) const HEAD: usize = 128;

/// The farthest into the head a client aims (and reads).
const MAX_HEAD: usize = 1024;

/// How many task records one listing reads, from where this client aims
/// in the head: the claims it tries until it lists again.
const WINDOW: usize = 8;

/// How long a client claims from its window before listing again, so a
/// task added ahead of it (a higher priority) waits at most this long, or
/// [`WINDOW`] claims of this client.
const FRESH: Duration = Duration::from_millis(250);

/// How often a busy queue's timed entries are read.
const TIMED_EVERY: Duration = Duration::from_secs(1);

/// Races a claim may lose (each one: an entry another client took first,
/// then a fresh listing) before it gives up. Every race lost is a task
/// another client claimed, so only a queue drained this fast by others
/// ends here.
const ROUNDS: usize = 64;

/// Numbers ready entries of this process, so that tasks made ready in one
/// millisecond keep their order.
static SEQ: AtomicU32 = AtomicU32::new(0);

/// A count of index entries read up to a limit: `count` is exact unless
/// `more`, when the index holds more than the `count` keys read (a lower
/// bound).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BoundedCount {
    /// Entries read (at most the limit asked for).
    pub count: usize,
    /// The listing stopped at the limit: there are more.
    pub more: bool,
}

impl BoundedCount {
    /// The count of a [`Bounded`] listing.
    fn of<T>(listed: &Bounded<T>) -> Self {
        BoundedCount {
            count: listed.items.len(),
            more: listed.more,
        }
    }
}

/// At most `limit` items of a listing, and whether it went on past them.
struct Bounded<T> {
    items: Vec<T>,
    more: bool,
}

impl std::fmt::Display for BoundedCount {
    /// `12`, or `1000+` when the listing stopped at its limit.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.count, if self.more { "+" } else { "" })
    }
}

/// One queue's numbers ([`BoardAdapter::queue_depth`]), read from its index
/// keys alone (no record is read), each listing bounded by a limit.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueDepth {
    /// The queue.
    pub queue: String,
    /// Ready tasks: claimable now.
    pub ready: BoundedCount,
    /// Tasks waiting for a time: a run-at or a backoff ahead, or held by a
    /// claim (until its lease's end). Those whose time has passed are
    /// claimable too (a claim that ran out is taken over).
    pub timed: BoundedCount,
    /// Dead tasks (their attempts used up; cancelled ones are not counted):
    /// waiting for [`Board::retry_dead`](super::Board::retry_dead) or a prune.
    pub dead: BoundedCount,
    /// Since when the oldest ready task listed has been ready (the board's
    /// clock); `None` when none is. When `ready.more`, an older one may be
    /// among those not listed: its age is then a lower bound.
    pub oldest_ready_since: Option<SystemTime>,
    /// How long that is, at the time of the read (the board's clock).
    pub oldest_ready_age: Option<Duration>,
}

impl QueueDepth {
    /// Tasks in the queue not yet completed, dead or cancelled, and not
    /// waiting on dependencies: ready + timed (a lower bound when either
    /// is).
    pub fn depth(&self) -> BoundedCount {
        BoundedCount {
            count: self.ready.count + self.timed.count,
            more: self.ready.more || self.timed.more,
        }
    }

    /// Whether any listing stopped at its limit (some numbers are lower bounds).
    pub fn truncated(&self) -> bool {
        self.ready.more || self.timed.more || self.dead.more
    }
}

/// A dead task as [`BoardAdapter::dead_tasks`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadTask {
    /// When it died (the deciding instance's clock).
    pub died_at: SystemTime,
    /// The task (its state [`TaskState::Dead`](super::TaskState::Dead), with
    /// the error of its last attempt).
    pub task: super::Task,
}

/// The first dead tasks of a queue, longest dead first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadTasks {
    /// At most the limit asked for.
    pub tasks: Vec<DeadTask>,
    /// There are more dead tasks than listed.
    pub more: bool,
}

/// Queue names, sorted ([`BoardAdapter::queues`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueNames {
    /// At most the limit asked for.
    pub names: Vec<String>,
    /// There are more queues than listed.
    pub more: bool,
}

/// Every queue's numbers ([`BoardAdapter::refresh_queue_metrics`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueDepths {
    /// One per queue read, by name.
    pub queues: Vec<QueueDepth>,
    /// There were more queues than read.
    pub more: bool,
}

/// The largest `limit` a read of the queue's indexes takes.
pub const MAX_READ_LIMIT: usize = 100_000;

/// `limit` checked: at least 1, at most [`MAX_READ_LIMIT`].
fn check_limit(limit: usize) -> Result<(), BoardError> {
    if limit == 0 || limit > MAX_READ_LIMIT {
        return Err(BoardError::Invalid(coord_backend::InvalidInput::Argument(
            format!("limit must be 1..={MAX_READ_LIMIT}, got {limit}"),
        )));
    }
    Ok(())
}

/// Where a task belongs in its queue's index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Ready,
    At(u64),
}

/// `priority` as a key component: higher priorities sort first.
fn rank(priority: i16) -> u16 {
    (i32::from(i16::MAX) - i32::from(priority)) as u16
}

/// The per-client state of [`BoardAdapter::claim_next`]: how widely it
/// spreads over a queue's head, and when it last read each queue's timed
/// entries.
#[derive(Debug, Default)]
pub(super) struct ClaimSpread {
    width: AtomicUsize,
    timed_read: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Per queue: the window still to try, and when it was listed.
    windows: Mutex<HashMap<String, (Vec<Candidate>, tokio::time::Instant)>>,
    claims: AtomicU64,
    lost: AtomicU64,
}

/// What [`BoardAdapter::claim_next`] did on one client so far (for
/// benchmarks and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Tasks claimed.
    pub claims: u64,
    /// Entries tried and found taken (or changed) by another client first.
    pub lost_races: u64,
}

impl ClaimSpread {
    fn width(&self) -> usize {
        self.width.load(Ordering::Relaxed).max(1)
    }

    fn lost_race(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
        let width = (self.width() * 2).min(MAX_HEAD);
        self.width.store(width, Ordering::Relaxed);
    }

    fn won_first_try(&self) {
        let width = self.width().saturating_sub(1).max(1);
        self.width.store(width, Ordering::Relaxed);
    }

    /// The rest of `queue`'s window and when it was listed, if it is fresh.
    fn take_window(&self, queue: &str) -> Option<(Vec<Candidate>, tokio::time::Instant)> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let (window, at) = windows.remove(queue)?;
        (at.elapsed() < FRESH && !window.is_empty()).then_some((window, at))
    }

    fn keep_window(&self, queue: &str, window: Vec<Candidate>, at: tokio::time::Instant) {
        if window.is_empty() {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows.insert(queue.to_owned(), (window, at));
    }

    /// Whether the timed entries of `queue` are due a read (and if so, note it).
    fn timed_due(&self, queue: &str, ready_empty: bool) -> bool {
        let now = tokio::time::Instant::now();
        let mut read = self.timed_read.lock().unwrap_or_else(|e| e.into_inner());
        let due = ready_empty
            || read
                .get(queue)
                .is_none_or(|at| now.duration_since(*at) >= TIMED_EVERY);
        if due {
            read.insert(queue.to_owned(), now);
        }
        due
    }
}

/// An entry worth a claim attempt.
#[derive(Debug)]
struct Candidate {
    /// Sorts the head: priority, then since when it is claimable.
    order: (u16, u64, u32),
    key: String,
    id: String,
}

/// The wait after the `attempts`-th failed attempt (at least 1): the
/// policy's doubling backoff, of which a random half is jitter.
pub(super) fn backoff_ms(backoff: BackoffRecord, attempts: u32) -> u64 {
    let doublings = attempts.saturating_sub(1).min(62);
    let full = backoff
        .initial_ms
        .saturating_mul(1u64 << doublings)
        .min(backoff.max_ms);
    let half = full / 2;
    half + (crate::jitter::unit() * (full - half) as f64) as u64
}

impl From<RetryPolicy> for BackoffRecord {
    fn from(policy: RetryPolicy) -> Self {
        BackoffRecord {
            initial_ms: whole_millis(policy.initial_backoff),
            max_ms: whole_millis(policy.max_backoff),
        }
    }
}

impl BoardAdapter {
    /// What `claim_next` did on this client so far.
    pub fn queue_stats(&self) -> QueueStats {
        QueueStats {
            claims: self.spread.claims.load(Ordering::Relaxed),
            lost_races: self.spread.lost.load(Ordering::Relaxed),
        }
    }

    /// The first `limit` keys under `prefix` (one store listing of
    /// `limit + 1`: the one past them says the listing went on).
    async fn bounded_keys(&self, prefix: &str, limit: usize) -> Result<Bounded<String>, Error> {
        let mut items = self
            .space
            .engine()
            .backend()
            .first_keys(prefix, limit + 1)
            .await?;
        let more = items.len() > limit;
        items.truncate(limit);
        Ok(Bounded { items, more })
    }

    /// The queue names ever used by a queued add (sorted), the first
    /// `limit` (1 to [`MAX_READ_LIMIT`]). One listing of
    /// `<prefix>queues/`: an add of a queued task registers its queue's name
    /// in its own txn (a blind put of an empty key), and nothing removes
    /// it, so the registry holds one key per queue name an application
    /// ever used (tasks added before the registry existed register their
    /// queue when one more task of it is added).
    pub async fn queues(&self, limit: usize) -> Result<QueueNames, BoardError> {
        check_limit(limit)?;
        let prefix = self.queues_prefix();
        let keys = self.bounded_keys(&prefix, limit).await?;
        let names = keys
            .items
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        Ok(QueueNames {
            names,
            more: keys.more,
        })
    }

    /// Read the numbers of the first `max_queues` queues ([`Self::queues`],
    /// then [`Self::queue_depth`] of each with `limit`) and set the
    /// `coord_queue_*` gauges of [`crate::telemetry`] (docs/operations.md)
    /// through the `metrics` facade: for a process exporting metrics, on its
    /// own schedule (each call costs `1 + 3 × queues` bounded listings and
    /// reads no record). The gauges are set only once every read succeeded:
    /// a store error leaves the previous values and is returned.
    pub async fn refresh_queue_metrics(
        &self,
        max_queues: usize,
        limit: usize,
    ) -> Result<QueueDepths, BoardError> {
        let names = self.queues(max_queues).await?;
        let mut queues = Vec::with_capacity(names.names.len());
        for queue in &names.names {
            queues.push(self.queue_depth(queue, limit).await?);
        }
        for depth in &queues {
            crate::telemetry::queue_depth(depth);
        }
        crate::telemetry::queues_truncated(names.more);
        Ok(QueueDepths {
            queues,
            more: names.more,
        })
    }

    /// `queue`'s ready, timed and dead counts and its oldest ready task's
    /// age, from its index keys alone: three listings of at most
    /// `limit + 1` keys each (`limit`: 1 to [`MAX_READ_LIMIT`]), never a
    /// record. The listings are not one snapshot: a task moving between
    /// them meanwhile may be counted twice or not at all.
    pub async fn queue_depth(&self, queue: &str, limit: usize) -> Result<QueueDepth, BoardError> {
        super::validate_queue(queue)?;
        check_limit(limit)?;
        let ready_prefix = self.ready_prefix(queue);
        let ready = self.bounded_keys(&ready_prefix, limit).await?;
        let timed = self.bounded_keys(&self.timed_prefix(queue), limit).await?;
        let dead = self.bounded_keys(&self.dead_prefix(queue), limit).await?;
        // `r/<rank>/<since><seq>/<id>`: the oldest is the least `since`
        // over every rank.
        let oldest = ready
            .items
            .iter()
            .filter_map(|key| {
                let rest = key.strip_prefix(&ready_prefix)?;
                let (_rank, rest) = rest.split_once('/')?;
                u64::from_str_radix(rest.get(..12)?, 16).ok()
            })
            .min();
        let now = self.space.now_millis();
        Ok(QueueDepth {
            queue: queue.to_owned(),
            ready: BoundedCount::of(&ready),
            timed: BoundedCount::of(&timed),
            dead: BoundedCount::of(&dead),
            oldest_ready_since: oldest.map(crate::cas::record::time_at),
            oldest_ready_age: oldest.map(|since| Duration::from_millis(now.saturating_sub(since))),
        })
    }

    /// The first `limit` (1 to [`MAX_READ_LIMIT`]) dead tasks of `queue`,
    /// longest dead first, with their last errors: one listing of the
    /// queue's dead index, then their records, as many per snapshot as the
    /// store takes. A task retried (or pruned) between the listing and the
    /// read is left out.
    pub async fn dead_tasks(&self, queue: &str, limit: usize) -> Result<DeadTasks, BoardError> {
        super::validate_queue(queue)?;
        check_limit(limit)?;
        let prefix = self.dead_prefix(queue);
        let keys = self.bounded_keys(&prefix, limit).await?;
        let more = keys.more;
        let listed: Vec<(String, String, u64)> = keys
            .items
            .into_iter()
            .filter_map(|key| {
                let (at, id) = key.strip_prefix(&prefix)?.split_once('/')?;
                let at = u64::from_str_radix(at, 16).ok()?;
                let id = id.to_owned();
                Some((key, id, at))
            })
            .collect();
        let mut tasks = Vec::with_capacity(listed.len());
        for chunk in listed.chunks(self.space.keys_per_call().max(1)) {
            let keys: Vec<String> = chunk.iter().map(|(_, id, _)| self.task_key(id)).collect();
            let entries = self.space.engine().snapshot(&keys).await?;
            let now = self.space.now_millis();
            for ((entry_key, id, at), entry) in chunk.iter().zip(entries) {
                let Some(bytes) = entry.value.as_deref() else {
                    continue;
                };
                let record = TaskRecord::decode(&entry.key, id, bytes)?;
                // Only a record that still names this entry is dead here.
                if record.dead_entry.as_deref() == Some(entry_key.as_str()) {
                    tasks.push(DeadTask {
                        died_at: crate::cas::record::time_at(*at),
                        task: record.to_task(now),
                    });
                }
            }
        }
        Ok(DeadTasks { tasks, more })
    }

    fn queue_prefix(&self, queue: &str) -> String {
        format!("{}queue/{queue}/", self.space.prefix())
    }

    fn ready_prefix(&self, queue: &str) -> String {
        format!("{}r/", self.queue_prefix(queue))
    }

    fn timed_prefix(&self, queue: &str) -> String {
        format!("{}t/", self.queue_prefix(queue))
    }

    fn dead_prefix(&self, queue: &str) -> String {
        format!("{}d/", self.queue_prefix(queue))
    }

    /// Where queue names are registered: `<prefix>queues/<queue>`, one
    /// empty key per queue name ever used (see [`BoardAdapter::queues`]).
    fn queues_prefix(&self) -> String {
        format!("{}queues/", self.space.prefix())
    }

    /// The write registering `queue`'s name (a blind put of an empty value:
    /// any number of adds may write it, in any order), once per txn
    /// through `written`.
    pub(super) fn register_queue(
        &self,
        queue: Option<&str>,
        written: &mut BTreeSet<String>,
    ) -> Option<Mutation> {
        let key = format!("{}{}", self.queues_prefix(), queue?);
        written
            .insert(key.clone())
            .then(|| Mutation::put(key, Vec::new()))
    }

    /// Point `record`'s dead entry where the record now belongs: under
    /// `d/<at>/<id>` of its queue while it is dead (not cancelled), nowhere
    /// otherwise. As [`Self::reindex`]: the writes go with the record's own
    /// write, which the txn asserts, and the record names the entry, so a
    /// late copy of a txn cannot move an entry the record no longer names.
    pub(super) fn redead(&self, record: &mut TaskRecord) -> Vec<Mutation> {
        let wanted = match (&record.queue, &record.dead, &record.done) {
            (Some(queue), Some(dead), None) if !dead.cancelled => Some(format!(
                "{}{:012x}/{}",
                self.dead_prefix(queue),
                dead.at_ms,
                record.id
            )),
            _ => None,
        };
        if wanted == record.dead_entry {
            return Vec::new();
        }
        let mut writes = Vec::new();
        if let Some(old) = record.dead_entry.take() {
            writes.push(Mutation::delete(old));
        }
        if let Some(entry) = wanted {
            writes.push(Mutation::put(entry.as_str(), Vec::new()));
            record.dead_entry = Some(entry);
        }
        writes
    }

    /// The marker saying some task waits on `dep` (written by the adds of
    /// queued tasks; read by the completion of `dep`).
    pub(super) fn waiters_key(&self, dep: &str) -> String {
        format!("{}waiters/{}:{dep}", self.space.prefix(), dep.len())
    }

    /// Where `record` belongs in its queue's index at `now`.
    fn slot(record: &TaskRecord, now: u64) -> Option<Slot> {
        record.queue.as_ref()?;
        if record.done.is_some() || record.dead.is_some() || record.unmet().next().is_some() {
            return None;
        }
        if let Some(claim) = &record.claim {
            return Some(Slot::At(claim.lease.expires_ms));
        }
        match record.not_before_ms {
            Some(at) if at > now => Some(Slot::At(at)),
            _ => Some(Slot::Ready),
        }
    }

    /// Point `record`'s index entry where the record now belongs: the
    /// writes (outside the view: see the module docs for why they need no
    /// assert) that remove its old entry and create its new one. An entry
    /// already in the right place stays, so a ready task keeps its turn.
    pub(super) fn reindex(&self, record: &mut TaskRecord, now: u64) -> Vec<Mutation> {
        let wanted = Self::slot(record, now);
        let queue = record.queue.clone().unwrap_or_default();
        let rank = rank(record.priority);
        let ready_here = format!("{}{rank:04x}/", self.ready_prefix(&queue));
        let timed = |at: u64| {
            format!(
                "{}{at:012x}/{rank:04x}/{}",
                self.timed_prefix(&queue),
                record.id
            )
        };
        let fits = match (wanted, record.indexed.as_deref()) {
            (None, None) => true,
            (Some(Slot::Ready), Some(entry)) => entry.starts_with(&ready_here),
            (Some(Slot::At(at)), Some(entry)) => entry == timed(at),
            _ => false,
        };
        if fits {
            return Vec::new();
        }
        let mut writes = Vec::new();
        if let Some(old) = record.indexed.take() {
            writes.push(Mutation::delete(old));
        }
        if let Some(slot) = wanted {
            let entry = match slot {
                Slot::Ready => {
                    let seq = SEQ.fetch_add(1, Ordering::Relaxed) & 0xff_ffff;
                    format!("{ready_here}{now:012x}{seq:06x}/{}", record.id)
                }
                Slot::At(at) => timed(at),
            };
            writes.push(Mutation::put(entry.as_str(), Vec::new()));
            record.indexed = Some(entry);
        }
        writes
    }

    /// The first entries of `queue` a claim may try at `now`, best first.
    async fn candidates(&self, queue: &str, now: u64) -> Result<Vec<Candidate>, Error> {
        let backend = self.space.engine().backend();
        let ready_prefix = self.ready_prefix(queue);
        let head = self.spread.width().clamp(HEAD, MAX_HEAD);
        let ready = backend.first_keys(&ready_prefix, head).await?;
        let mut found: Vec<Candidate> = ready
            .into_iter()
            .filter_map(|key| {
                let rest = key.strip_prefix(&ready_prefix)?;
                let (rank, rest) = rest.split_once('/')?;
                let (since, id) = rest.split_once('/')?;
                let order = (
                    u16::from_str_radix(rank, 16).ok()?,
                    u64::from_str_radix(since.get(..12)?, 16).ok()?,
                    u32::from_str_radix(since.get(12..)?, 16).ok()?,
                );
                let id = id.to_owned();
                Some(Candidate { order, key, id })
            })
            .collect();
        if self.spread.timed_due(queue, found.is_empty()) {
            let timed_prefix = self.timed_prefix(queue);
            for key in backend.first_keys(&timed_prefix, HEAD).await? {
                let parsed = key.strip_prefix(&timed_prefix).and_then(|rest| {
                    let (at, rest) = rest.split_once('/')?;
                    let (rank, id) = rest.split_once('/')?;
                    let at = u64::from_str_radix(at, 16).ok()?;
                    Some((at, u16::from_str_radix(rank, 16).ok()?, id.to_owned()))
                });
                match parsed {
                    // Sorted by time: the rest is not due either.
                    Some((at, _, _)) if at > now => break,
                    Some((at, rank, id)) => found.push(Candidate {
                        order: (rank, at, 0),
                        key,
                        id,
                    }),
                    None => {}
                }
            }
        }
        found.sort_by_key(|c| c.order);
        Ok(found)
    }

    /// Claim the next ready task of `queue` for `agent` for `ttl`, in one
    /// decision over that task (see the [module docs](self) for which one):
    /// `None` when the queue has no ready task.
    ///
    /// Taking over a claim whose lease ran out counts that claim as a
    /// failed attempt; if it was the task's last, the task is dead instead
    /// and the next one is tried.
    pub async fn claim_next(
        &self,
        queue: &str,
        agent: &str,
        ttl: Duration,
    ) -> Result<Option<super::ClaimedTask>, BoardError> {
        super::validate_queue(queue)?;
        // Any id will do: the checks are of the agent and the TTL.
        super::validate_claim("-", agent, ttl)?;
        for _ in 0..ROUNDS {
            let (mut window, listed_at, listed) = match self.spread.take_window(queue) {
                Some((window, at)) => (window, at, false),
                None => {
                    let window = self.list_window(queue).await?;
                    (window, tokio::time::Instant::now(), true)
                }
            };
            if window.is_empty() {
                return Ok(None);
            }
            let candidate = window.remove(0);
            let claimed = self
                .claim_entry(&candidate.id, &candidate.key, agent, ttl)
                .await?;
            if let Some(task) = claimed {
                self.spread.claims.fetch_add(1, Ordering::Relaxed);
                if listed {
                    self.spread.won_first_try();
                }
                // The window keeps the time it was listed: it ages out after
                // FRESH however many of its entries are left.
                self.spread.keep_window(queue, window, listed_at);
                return Ok(Some(task));
            }
            // Taken by another client since the listing: the rest of this
            // window is as old, and likely taken too. Aim again, further.
            self.spread.lost_race();
        }
        Err(BoardError::Store(Error::ConflictRetriesExhausted {
            attempts: ROUNDS as u32,
        }))
    }

    /// List `queue`'s head and read the records of a window of it, from
    /// where this client aims (see the [module docs](self)): the entries to
    /// try, in order, their records in the engine's memory (so each claim
    /// is one txn).
    async fn list_window(&self, queue: &str) -> Result<Vec<Candidate>, BoardError> {
        let now = self.space.now_millis();
        let mut found = self.candidates(queue, now).await?;
        let Some(best) = found.first() else {
            return Ok(Vec::new());
        };
        // The head's priority first; within it, spread as contention says.
        let tier = found
            .iter()
            .take_while(|c| c.order.0 == best.order.0)
            .count();
        let width = self.spread.width().min(tier);
        let start = if width > 1 {
            ((crate::jitter::unit() * width as f64) as usize).min(width - 1)
        } else {
            0
        };
        found.truncate(tier);
        found.rotate_left(start);
        found.truncate(WINDOW);
        let keys: Vec<String> = found.iter().map(|c| self.task_key(&c.id)).collect();
        self.space.engine().snapshot(&keys).await?;
        Ok(found)
    }

    /// Claim task `id` if `entry` still is its index entry and it is
    /// claimable: `None` when another client got there first (or it changed).
    async fn claim_entry(
        &self,
        id: &str,
        entry: &str,
        agent: &str,
        ttl: Duration,
    ) -> Result<Option<super::ClaimedTask>, BoardError> {
        let key = self.task_key(id);
        let now = self.space.now_millis();
        let expires_ms = now.saturating_add(whole_millis(ttl));
        let token = crate::mint_token();
        let answer = self
            .space
            .engine()
            .decide::<Option<super::ClaimedTask>, BoardError, _>(
                std::slice::from_ref(&key),
                |view| {
                    let Some(record) = self.read(view, id)? else {
                        return Ok(crate::cas::Decision::Return(None));
                    };
                    let claimable = record.indexed.as_deref() == Some(entry)
                        && Self::slot(&record, now).is_some()
                        && record.live_claim(now).is_none()
                        && record.not_before_ms.is_none_or(|at| at <= now);
                    if !claimable {
                        return Ok(crate::cas::Decision::Return(None));
                    }
                    self.take(view, &key, record, agent, &token, expires_ms, now)
                },
            )
            .await;
        if let Ok(Some(claimed)) = &answer {
            tracing::Span::current().record("fence", claimed.fence);
        }
        answer
    }

    /// The decision of a claim of a claimable `record` (read under `key`):
    /// a claim that ran out is a failed attempt, and makes the task dead
    /// (answer `None`) when it was the last; otherwise the task is claimed,
    /// one more attempt counted, its entry moved to the new lease's end.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn take(
        &self,
        view: &crate::cas::View,
        key: &str,
        mut record: TaskRecord,
        agent: &str,
        token: &str,
        expires_ms: u64,
        now: u64,
    ) -> Result<crate::cas::Decision<Option<super::ClaimedTask>>, BoardError> {
        if let Some(expired) = record.claim.take() {
            if record.at_most_once {
                // Its holder may have run it: never again without a verdict.
                record.last_error = Some(format!(
                    "outcome unknown: the claim of {:?} ran out before it completed or failed",
                    expired.agent
                ));
                return self
                    .finish(view, key, record, now, super::record::Death::Uncertain)
                    .map(|d| d.map(|()| None));
            }
            record.last_error = Some(format!("the lease of {:?} ran out", expired.agent));
            if record
                .max_attempts
                .is_some_and(|max| record.attempts >= max)
            {
                return self.bury(view, key, record, now).map(|d| d.map(|()| None));
            }
        }
        // A first claim takes the record's version: a record added again
        // after a prune has a version above every version (so every fence)
        // its earlier life had.
        let fence = if record.fence == 0 {
            view.version(key).0.max(1)
        } else {
            record.fence + 1
        };
        let claim = super::record::ClaimRecord {
            agent: agent.to_owned(),
            lease: crate::cas::LeaseRecord::new(token.to_owned(), expires_ms),
        };
        let mut granted = TaskRecord {
            fence,
            attempts: record.attempts.saturating_add(1),
            claim: Some(claim.clone()),
            nonce: crate::cas::Nonce::default(),
            ..record
        };
        let entry = self.reindex(&mut granted, now);
        Ok(crate::cas::Decision::CommitWithUnasserted {
            mutations: vec![granted.put(key)],
            unasserted: entry,
            then: Some(granted.claimed_task(claim)),
        })
    }

    /// Make `record` dead (its attempts used up) at `now`: the decision,
    /// once the view holds the retention cursor (asked for first).
    fn bury(
        &self,
        view: &crate::cas::View,
        key: &str,
        record: TaskRecord,
        now: u64,
    ) -> Result<crate::cas::Decision<()>, BoardError> {
        self.finish(view, key, record, now, super::record::Death::OutOfAttempts)
    }

    /// `record` stopped for good at `now` (`death` says why), indexed for
    /// retention like a completion.
    pub(super) fn finish(
        &self,
        view: &crate::cas::View,
        key: &str,
        record: TaskRecord,
        now: u64,
        death: super::record::Death,
    ) -> Result<crate::cas::Decision<()>, BoardError> {
        use super::record::Death;
        let index = self.done_index();
        if !view.contains(&index.cursor()) {
            return Ok(crate::cas::Decision::Expand(vec![index.cursor()]));
        }
        let mut dead = TaskRecord {
            claim: None,
            dead: Some(DeadRecord {
                at_ms: now,
                cancelled: death == Death::Cancelled,
                uncertain: death == Death::Uncertain,
            }),
            nonce: crate::cas::Nonce::default(),
            ..record
        };
        let mut unasserted = self.reindex(&mut dead, now);
        unasserted.extend(self.redead(&mut dead));
        let (cursor, entry) = index.final_writes(view, now, &dead.id);
        unasserted.push(entry);
        let mut mutations = vec![dead.put(key)];
        mutations.extend(cursor);
        Ok(crate::cas::Decision::CommitWithUnasserted {
            mutations,
            unasserted,
            then: (),
        })
    }

    /// The tasks whose reverse-dependency entries name `dep`.
    pub(super) async fn dependents_of(&self, dep: &str) -> Result<Vec<String>, Error> {
        let prefix = self.dependents_prefix(dep);
        let keys = self.space.engine().backend().keys(&prefix).await?;
        Ok(keys
            .into_iter()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect())
    }

    /// In the view: mark `dep` (completed, or removed) met in each of
    /// `dependents` still waiting on it, index those now ready, and drop
    /// their reverse-dependency entries. Returns (writes of viewed keys,
    /// writes of other keys).
    pub(super) fn mark_met(
        &self,
        view: &crate::cas::View,
        dep: &str,
        dependents: &[String],
        now: u64,
    ) -> Result<(Vec<Mutation>, Vec<Mutation>), Error> {
        let mut mutations = Vec::new();
        let mut unasserted = Vec::new();
        for dependent in dependents {
            if let Some(mut record) = self.read(view, dependent)? {
                let waits = record.done.is_none()
                    && record.deps.iter().any(|d| d == dep)
                    && !record.met.iter().any(|d| d == dep);
                if waits {
                    record.met.push(dep.to_owned());
                    unasserted.extend(self.reindex(&mut record, now));
                    record.nonce = crate::cas::Nonce::default();
                    mutations.push(record.put(self.task_key(dependent)));
                }
            }
            unasserted.push(Mutation::delete(self.dependent_key(dep, dependent)));
        }
        Ok((mutations, unasserted))
    }

    /// How many dependents one completion marks in its own txn; the rest
    /// follow in txns of their own (see [`Self::mark_met_later`]).
    pub(super) fn dependents_per_txn(&self, used: usize) -> usize {
        // Each: its record (read and written), its reverse-dependency entry,
        // its new index entry.
        (self.space.keys_per_call().saturating_sub(used) / 3).max(1)
    }

    /// Mark completed `dep` met in `dependents`, as many per txn as fit:
    /// the dependents a completion had no room for. Each txn asserts `dep`'s
    /// record, so it runs only while `dep` is still completed.
    pub(super) async fn mark_met_later(
        &self,
        dep: &str,
        dependents: &[String],
    ) -> Result<(), Error> {
        let dep_key = self.task_key(dep);
        for batch in dependents.chunks(self.dependents_per_txn(1)) {
            let mut keys = vec![dep_key.clone()];
            keys.extend(batch.iter().map(|d| self.task_key(d)));
            let now = self.space.now_millis();
            self.space
                .engine()
                .decide(&keys, |view| -> Result<crate::cas::Decision<()>, Error> {
                    match self.read(view, dep)? {
                        Some(record) if record.done.is_some() => {}
                        _ => return Ok(crate::cas::Decision::Return(())),
                    }
                    let (mutations, unasserted) = self.mark_met(view, dep, batch, now)?;
                    if mutations.is_empty() {
                        return Ok(crate::cas::Decision::Return(()));
                    }
                    Ok(crate::cas::Decision::CommitWithUnasserted {
                        mutations,
                        unasserted,
                        then: (),
                    })
                })
                .await?;
        }
        Ok(())
    }

    /// A queued task waits on each of `unmet`: the writes that say so, in
    /// a view holding their records (and the keys written, deduped across
    /// one txn through `written`). An existing dependency's record is
    /// rewritten with `awaited` set (always rewritten: its completion lists
    /// the waiting tasks at one version of the record and asserts that
    /// version, so a task added after the listing changes it); a missing
    /// one gets its marker, which its own add reads.
    pub(super) fn await_deps(
        &self,
        view: &crate::cas::View,
        queued: bool,
        unmet: &[String],
        written: &mut BTreeSet<String>,
    ) -> Result<(Vec<Mutation>, Vec<Mutation>), Error> {
        let mut viewed = Vec::new();
        let mut marked = Vec::new();
        if !queued {
            return Ok((viewed, marked));
        }
        for dep in unmet {
            let key = self.task_key(dep);
            match self.read(view, dep)? {
                Some(mut record) => {
                    if written.insert(key.clone()) {
                        record.awaited = true;
                        viewed.push(record.put(key));
                    }
                }
                None => {
                    let marker = self.waiters_key(dep);
                    if written.insert(marker.clone()) {
                        marked.push(Mutation::put(marker, Vec::new()));
                    }
                }
            }
        }
        Ok((viewed, marked))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_priorities_rank_first() {
        assert!(rank(5) < rank(0));
        assert!(rank(0) < rank(-5));
        assert_eq!(rank(i16::MAX), 0);
        assert_eq!(rank(i16::MIN), u16::MAX);
    }

    #[test]
    fn backoff_doubles_within_its_bounds() {
        let policy = BackoffRecord {
            initial_ms: 1_000,
            max_ms: 10_000,
        };
        for attempts in 1..70 {
            let full = (1_000u64 << (attempts - 1).min(20)).min(10_000);
            let wait = backoff_ms(policy, attempts);
            assert!(wait >= full / 2 && wait <= full, "{attempts}: {wait}");
        }
    }

    /// A window ages from its listing, not from its last use: a worker
    /// that claims slowly still sees a task added ahead of its window
    /// within FRESH (on tokio's paused clock: no real waiting).
    #[tokio::test(start_paused = true)]
    async fn a_window_ages_from_its_listing() {
        use std::sync::Arc;

        use super::super::{Board, TaskSpec};

        let backend = Arc::new(coord_memory::SingleProcessMemoryBackend::new("w").unwrap());
        let board = BoardAdapter::new(backend);
        let ttl = Duration::from_secs(600);
        let low: Vec<TaskSpec> = (0..10)
            .map(|i| TaskSpec::new(format!("low-{i}"), Vec::new()).in_queue("q"))
            .collect();
        board.add_many(low).await.unwrap();
        let first = board.claim_next("q", "w", ttl).await.unwrap().unwrap();
        assert_eq!(first.id, "low-0");
        tokio::time::sleep(FRESH * 3 / 5).await;
        // From the window listed a moment ago.
        let second = board.claim_next("q", "w", ttl).await.unwrap().unwrap();
        assert_eq!(second.id, "low-1");
        board
            .add(
                TaskSpec::new("urgent", Vec::new())
                    .in_queue("q")
                    .with_priority(10),
            )
            .await
            .unwrap();
        // FRESH has passed since the listing (not since the last claim).
        tokio::time::sleep(FRESH * 3 / 5).await;
        let third = board.claim_next("q", "w", ttl).await.unwrap().unwrap();
        assert_eq!(third.id, "urgent");
    }

    /// A race lost on one entry of a window drops the rest of it (listed
    /// at the same moment, so as stale): one lost race, then a fresh
    /// listing, not one per stale entry.
    #[tokio::test]
    async fn a_lost_race_drops_the_window() {
        use std::sync::Arc;

        use super::super::{Board, TaskSpec};

        let backend = Arc::new(coord_memory::SingleProcessMemoryBackend::new("l").unwrap());
        let slow = BoardAdapter::new(backend.clone());
        let fast = BoardAdapter::new(backend);
        let ttl = Duration::from_secs(600);
        let tasks: Vec<TaskSpec> = (0..10)
            .map(|i| TaskSpec::new(format!("t-{i}"), Vec::new()).in_queue("q"))
            .collect();
        slow.add_many(tasks).await.unwrap();
        // `slow` lists t-0..t-7 and claims t-0; `fast` then takes t-1..t-3.
        assert_eq!(
            slow.claim_next("q", "slow", ttl).await.unwrap().unwrap().id,
            "t-0"
        );
        for i in 1..=3 {
            fast.claim(&format!("t-{i}"), "fast", ttl).await.unwrap();
        }
        // t-1 is lost; the fresh listing starts at t-4, and `slow` aims at
        // one of its first two entries (its width doubled with the loss).
        let next = slow.claim_next("q", "slow", ttl).await.unwrap().unwrap();
        assert!(["t-4", "t-5"].contains(&next.id.as_str()), "{}", next.id);
        assert_eq!(slow.queue_stats().lost_races, 1);
    }
}
