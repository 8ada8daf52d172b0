//! [`FairLock`]: a lock handed over in request order (FIFO tickets), like
//! etcd's `concurrency.Mutex` and Curator's `InterProcessMutex`, decided
//! over the three primitives of any backend.
//!
//! # Records (per key, under the prefix, `fairlock/` by default)
//!
//! - `<prefix><key>/m`, the lock record: the fence, the holder's lease, and
//!   `served` (every ticket numbered up to it has left the line). Written by
//!   grants, renewals and releases only.
//! - `<prefix><key>/n`, the line record: the ticket counter and the waiters
//!   in order, each with its token, the lease it asks for and its ticket's
//!   lease as of joining. Written by waiters joining or leaving early (and
//!   by a release now and then, to prune served waiters).
//! - `<prefix><key>/q/<seq>` (20 digits), one waiter's ticket: its lease,
//!   written by the waiter's renewals (from a third of the TTL on), and the
//!   key its watch listens to.
//!
//! **Joining** takes the next number from the line record in one asserted
//! txn. It never asserts the lock record unless it can take the lock at
//! once (nobody holds it, nobody live waits), so a holder that releases and
//! retakes the lock in a loop cannot starve the waiters joining: they only
//! race each other, and retry without pausing (each retry carries the
//! values the rejection returned).
//!
//! **Releasing hands over**: the release's txn gives the lock to the first
//! live waiter of the line (the next fence, the lease that waiter asked
//! for), marks it served and removes its ticket key, which wakes exactly
//! that waiter (it watched its ticket key before joining); the waiter only
//! reads to learn it holds the lock. Dead waiters ahead of it (their lease
//! ran out: the waiter died, or paused past its lease) are skipped in the
//! same txn. When the holder dies instead, the first live waiter takes the
//! lock once the holder's lease has run out, in a txn asserting both records.
//!
//! A waiter that gives up (timeout, error) leaves the line, or hands the
//! lock on if it was handed the lock meanwhile; one that is cancelled or
//! dies blocks the line until its lease runs out, never longer (the lock
//! may be handed to it just before: then until the lease of that grant
//! runs out). Ticket keys are deleted when their waiter leaves; like every
//! deleted key they leave a store tombstone (see docs/shapes.md on
//! tombstones). The lock record stays, to keep the fence.
//!
//! The holder's lease lives in the lock record, exactly as in
//! [`super::GenericLock`]: renew and release are one txn each, and the fence
//! (per key, strictly increasing, allocated in the grant's txn) survives
//! release. [`Lock::try_lock`] takes the lock only when it is free **and** no
//! live waiter is in line: it never jumps the queue.
//!
//! A store without change notifications (or a lost notification) costs
//! latency only: waiters also poll, at the longest pause of [`WaitOptions`]
//! when a watch is live, with its growing backoff otherwise.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use coord_backend::{Backend, Clock, Error, Mutation, SystemClock};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{validate_lock_input, Lock, LockError, LockHandle, LostReason, WaitOptions};
use crate::cas::{CasEngine, CasOptions, CasStats, Decision, View};
use crate::wake::Wake;
use crate::{mint_token, telemetry};

/// How many tickets ahead one decision reads at most. More dead tickets
/// than this ahead are removed in batches first (so one txn never names
/// more keys than a store accepts).
const LOOKAHEAD: usize = 16;

/// Options of a [`FairLock`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FairLockOptions {
    /// Where expiry is read from (holder leases and ticket leases).
    pub clock: Arc<dyn Clock>,
    /// Prefix of the records in the backend's namespace (default `fairlock/`).
    pub key_prefix: String,
    /// Tuning of the CAS loop.
    pub cas: CasOptions,
}

impl Default for FairLockOptions {
    fn default() -> Self {
        FairLockOptions {
            clock: Arc::new(SystemClock),
            key_prefix: "fairlock/".to_owned(),
            cas: CasOptions::default(),
        }
    }
}

impl FairLockOptions {
    /// Judge expiry with `clock` (tests inject a `ManualClock`).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Keep the records under another prefix.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Tune the CAS loop.
    pub fn with_cas(mut self, cas: CasOptions) -> Self {
        self.cas = cas;
        self
    }
}

/// A fair (FIFO) [`Lock`] over any [`Backend`] (see the [module docs](self)).
///
/// Use [`LockExt::lock`](super::LockExt::lock) (or [`Lock::wait_lock`]) to
/// wait in line; [`Lock::try_lock`] only succeeds when nobody waits.
/// [`super::LockGuard`] works with it like with any `Lock`.
#[derive(Clone, Debug)]
pub struct FairLock {
    engine: CasEngine,
    clock: Arc<dyn Clock>,
    prefix: String,
}

/// The lock record, `<prefix><key>/m`: the fence, the holder, and how far
/// the line has been served. Written by grants, renewals and releases,
/// never by a waiter taking its place in line.
#[derive(Serialize, Deserialize, Default)]
struct LockState {
    /// The fence of the latest grant (0 = never granted).
    fence: u64,
    /// The current holder, if any (its lease may have expired).
    holder: Option<Holder>,
    /// Every ticket numbered up to this one has left the line (granted, or
    /// skipped as dead): a grant moves the line on without writing it.
    served: u64,
    /// Fresh per write (see the CAS engine on indeterminate txns).
    nonce: String,
}

/// The line record, `<prefix><key>/n`: the ticket counter and the waiters.
/// Written by waiters joining (and leaving early), rarely by a holder: so
/// a waiter joining the line only races other waiters joining it, never a
/// holder's quick release and retake (which would starve it).
#[derive(Serialize, Deserialize, Default)]
struct LineState {
    /// The number the next ticket gets (numbers are never reused).
    next_seq: u64,
    /// The waiters, in order; those numbered up to the lock record's
    /// `served` have left (pruned by the next write that knows it).
    queue: Vec<Waiter>,
    /// Fresh per write.
    nonce: String,
}

/// One waiter in line: what a releaser needs to hand it the lock.
#[derive(Serialize, Deserialize, Clone)]
struct Waiter {
    seq: u64,
    token: String,
    /// The lease the waiter asked for: the length of its grant.
    ttl_ms: u64,
    /// Its ticket's lease when it was taken. Until then the waiter is live
    /// without reading its ticket: a ticket's lease only grows while the
    /// ticket exists, and a removed ticket leaves the line in the same txn.
    expires_ms: u64,
}

#[derive(Serialize, Deserialize)]
struct Holder {
    token: String,
    expires_ms: u64,
}

/// One waiter's ticket, `<prefix><key>/q/<seq>`.
#[derive(Serialize, Deserialize)]
struct TicketRecord {
    token: String,
    expires_ms: u64,
    nonce: String,
}

impl std::fmt::Debug for LockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockState")
            .field("fence", &self.fence)
            .field("held", &self.holder.is_some())
            .field("served", &self.served)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for LineState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LineState")
            .field("next_seq", &self.next_seq)
            .field(
                "queue",
                &self.queue.iter().map(|w| w.seq).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// A ticket this client holds while it waits.
struct Ticket {
    seq: u64,
    token: String,
    /// When to renew the ticket's lease (local monotonic time).
    renew_at: Instant,
}

/// What a decision found at the head of the line.
enum Head {
    /// `queue[index]` is the first live waiter; `dead` are the ones ahead of it.
    Live { index: usize, dead: Vec<u64> },
    /// No live waiter among the first [`LOOKAHEAD`]: `dead` were judged
    /// dead; `complete`: that was the whole line.
    NoneLive { dead: Vec<u64>, complete: bool },
}

/// What one step of a waiter found.
enum Attempt {
    Granted(LockHandle),
    /// Wait for a wake-up; `Some(ms)`: the holder's lease ends then.
    Wait(Option<u64>),
    /// The lock is free and this waiter may be first in line: decide.
    Try,
    /// Dead tickets ahead were removed; decide again at once.
    Cleaned,
    /// This waiter's ticket is gone (it was judged dead): take a new one.
    Requeue,
}

/// What a waiter does next.
enum Next {
    /// Read the lock and line records.
    Look,
    /// Decide in a txn (the lock looked free with this waiter first).
    Try,
    /// Sleep until a wake-up, the fallback poll, or the holder's lease end.
    Wait(Option<u64>),
}

/// What joining the line gave.
enum Joined {
    /// Nobody held the lock and nobody live waited: it is granted at once.
    Granted(LockHandle),
    /// In line, and what to do first.
    Queued(Ticket, Next),
    /// Dead waiters were removed from the line: decide again.
    Cleaned,
}

/// What the store holds for one fair lock (see [`FairLock::status`]). Never
/// carries a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FairLockStatus {
    /// The key.
    pub key: String,
    /// The fence of the latest grant.
    pub fence: u64,
    /// When the holder's lease ends; `None` when nobody holds the lock.
    pub expires_at: Option<SystemTime>,
    /// Whether a holder's lease is unexpired now, by the lock's clock.
    pub live: bool,
    /// The waiters' tickets, in queue order.
    pub waiting: Vec<TicketStatus>,
}

/// One ticket in a [`FairLockStatus`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TicketStatus {
    /// The ticket's number (strictly increasing per key).
    pub seq: u64,
    /// When the waiter's lease ends: by its ticket, or by the line until its first renewal.
    pub expires_at: Option<SystemTime>,
    /// Whether the ticket's lease is unexpired now.
    pub live: bool,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    serde_json::to_vec(record).expect("a fair lock record always serializes")
}

fn parse<T: serde::de::DeserializeOwned + Default>(
    key: &str,
    bytes: Option<&[u8]>,
) -> Result<T, Error> {
    match bytes {
        None => Ok(T::default()),
        Some(bytes) => serde_json::from_slice(bytes)
            .map_err(|e| Error::malformed(key, format!("not a fair lock record: {e}"))),
    }
}

/// The waiters still in line: those after `served`.
fn waiting(line: &LineState, served: u64) -> &[Waiter] {
    let first = line.queue.partition_point(|w| w.seq <= served);
    &line.queue[first..]
}

/// The line to write: served waiters pruned, the waiters `gone` removed.
fn without(line: &LineState, served: u64, gone: &[u64]) -> LineState {
    LineState {
        next_seq: line.next_seq,
        queue: waiting(line, served)
            .iter()
            .filter(|w| !gone.contains(&w.seq))
            .cloned()
            .collect(),
        nonce: mint_token(),
    }
}

/// The lock state after a grant to `holder` (the next fence), the line
/// served up to `served`.
fn granted(state: &LockState, holder: Holder, served: u64) -> LockState {
    LockState {
        fence: state.fence + 1,
        holder: Some(holder),
        served: state.served.max(served),
        nonce: mint_token(),
    }
}

/// The lock state with the line served up to `served`, the holder unchanged.
fn skipped(state: &LockState, served: u64) -> LockState {
    LockState {
        fence: state.fence,
        holder: state.holder.as_ref().map(|h| Holder {
            token: h.token.clone(),
            expires_ms: h.expires_ms,
        }),
        served: state.served.max(served),
        nonce: mint_token(),
    }
}

/// How many served waiters the line may keep before a release prunes them.
const STALE_LIMIT: usize = LOOKAHEAD;

fn handle_at(key: &str, token: &str, fence: u64, ttl: Duration, expires_ms: u64) -> LockHandle {
    LockHandle::new(
        key,
        token,
        fence,
        ttl,
        UNIX_EPOCH + Duration::from_millis(expires_ms),
    )
}

/// Who asks for the lock, and when (one per call, fixed across the
/// engine's retries).
#[derive(Clone, Copy)]
struct Newcomer<'a> {
    token: &'a str,
    ttl: Duration,
    /// The lock's clock when the call began.
    now: u64,
    /// When the call began (local monotonic time): the lease counts from then.
    sent: Instant,
}

/// The records one decision writes: the lock state and the line when they
/// change, and the tickets of waiters that left the line.
struct Writes<'a> {
    state: Option<LockState>,
    line: Option<LineState>,
    gone: &'a [u64],
}

impl FairLock {
    /// A fair lock over `backend` with default options (system clock, prefix `fairlock/`).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, FairLockOptions::default())
    }

    /// A fair lock over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: FairLockOptions) -> Self {
        FairLock {
            engine: CasEngine::with_options(backend, options.cas),
            clock: options.clock,
            prefix: options.key_prefix,
        }
    }

    /// Store calls made so far (for tests and benchmarks).
    pub fn stats(&self) -> CasStats {
        self.engine.stats()
    }

    /// The prefix of this lock's records (`fairlock/` by default).
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    fn state_key(&self, key: &str) -> String {
        format!("{}{key}/m", self.prefix)
    }

    fn line_key(&self, key: &str) -> String {
        format!("{}{key}/n", self.prefix)
    }

    fn ticket_key(&self, key: &str, seq: u64) -> String {
        // 20 digits: every u64, and the ticket keys sort in queue order.
        format!("{}{key}/q/{seq:020}", self.prefix)
    }

    fn watch_prefix(&self, key: &str) -> String {
        format!("{}{key}/", self.prefix)
    }

    fn both_keys(&self, key: &str) -> [String; 2] {
        [self.state_key(key), self.line_key(key)]
    }

    /// The lock state and the line as `view` holds them.
    fn decode(&self, view: &View, key: &str) -> Result<(LockState, LineState), Error> {
        let (state_key, line_key) = (self.state_key(key), self.line_key(key));
        Ok((
            parse(&state_key, view.value(&state_key))?,
            parse(&line_key, view.value(&line_key))?,
        ))
    }

    fn decode_ticket(view: &View, key: &str) -> Result<Option<TicketRecord>, Error> {
        view.value(key)
            .map(|bytes| {
                serde_json::from_slice(bytes)
                    .map_err(|e| Error::malformed(key, format!("not a fair lock ticket: {e}")))
            })
            .transpose()
    }

    fn lost(handle: &LockHandle, reason: LostReason) -> LockError {
        LockError::Lost {
            key: handle.key().to_owned(),
            reason,
        }
    }

    fn why_not_held(handle: &LockHandle, state: &LockState, now: u64) -> Option<LostReason> {
        match &state.holder {
            Some(h) if h.token == handle.token() => {
                (h.expires_ms <= now).then_some(LostReason::Expired)
            }
            _ if state.fence > handle.fence() => Some(LostReason::TakenOver),
            _ => Some(LostReason::NotHeld),
        }
    }

    /// Judge the head of `queue`: a waiter is live by the lease recorded in
    /// the line, else by its ticket (read through the view).
    /// `Err(keys)`: read these tickets first.
    fn head(
        &self,
        view: &View,
        key: &str,
        queue: &[Waiter],
        now: u64,
    ) -> Result<Result<Head, Vec<String>>, Error> {
        let first = &queue[..queue.len().min(LOOKAHEAD)];
        let unread: Vec<String> = first
            .iter()
            .take_while(|w| w.expires_ms <= now)
            .map(|w| self.ticket_key(key, w.seq))
            .filter(|k| !view.contains(k))
            .collect();
        if !unread.is_empty() {
            return Ok(Err(unread));
        }
        let mut dead = Vec::new();
        for (index, w) in first.iter().enumerate() {
            if w.expires_ms > now {
                return Ok(Ok(Head::Live { index, dead }));
            }
            match Self::decode_ticket(view, &self.ticket_key(key, w.seq))? {
                Some(t) if t.token == w.token && t.expires_ms > now => {
                    return Ok(Ok(Head::Live { index, dead }))
                }
                _ => dead.push(w.seq),
            }
        }
        Ok(Ok(Head::NoneLive {
            dead,
            complete: queue.len() <= LOOKAHEAD,
        }))
    }

    /// One txn writing `writes`. Tickets of waiters that left the line are
    /// removed asserted when the view read them, unasserted otherwise (a
    /// live waiter handed the lock: it asserts the lock and line records
    /// before each renewal of its ticket, so it never brings a removed
    /// ticket back). The removal is what wakes a waiter handed the lock.
    fn write<T>(&self, view: &View, key: &str, writes: Writes<'_>, then: T) -> Decision<T> {
        let mut mutations = Vec::new();
        let mut unasserted = Vec::new();
        if let Some(state) = &writes.state {
            mutations.push(Mutation::put(self.state_key(key), encode(state)));
        }
        if let Some(line) = &writes.line {
            mutations.push(Mutation::put(self.line_key(key), encode(line)));
        }
        for &seq in writes.gone {
            let ticket = self.ticket_key(key, seq);
            if view.contains(&ticket) {
                mutations.push(Mutation::delete(ticket));
            } else {
                unasserted.push(Mutation::delete(ticket));
            }
        }
        Decision::CommitWithUnasserted {
            mutations,
            unasserted,
            then,
        }
    }

    /// Skip the dead waiters `dead` (a prefix of the line): the lock record
    /// marks them served and their tickets go.
    fn skip_dead<T>(
        &self,
        view: &View,
        key: &str,
        state: &LockState,
        dead: &[u64],
        then: T,
    ) -> Decision<T> {
        let served = dead.last().copied().unwrap_or(0);
        let writes = Writes {
            state: Some(skipped(state, served)),
            line: None,
            gone: dead,
        };
        self.write(view, key, writes, then)
    }

    /// The line to write along with a lock state that serves it up to
    /// `served`, when enough served waiters piled up in it (else `None`:
    /// the line is left alone, so as not to race the waiters joining it).
    fn prune(line: &LineState, served: u64) -> Option<LineState> {
        let stale = line.queue.partition_point(|w| w.seq <= served);
        (stale > STALE_LIMIT).then(|| without(line, served, &[]))
    }

    /// Grant the lock to `newcomer` when nobody holds it and nobody live
    /// waits: `Ok(decision)`; `Err(end)`: it must wait in line (`end`: when
    /// the holder's lease ends, if someone holds it).
    fn grant_if_free<T>(
        &self,
        view: &View,
        key: &str,
        (state, line): (&LockState, &LineState),
        newcomer: &Newcomer<'_>,
        answer: impl FnOnce(Option<LockHandle>) -> T,
    ) -> Result<Result<Decision<T>, Option<u64>>, Error> {
        let Newcomer {
            token,
            ttl,
            now,
            sent,
        } = *newcomer;
        if let Some(h) = state.holder.as_ref().filter(|h| h.expires_ms > now) {
            return Ok(Err(Some(h.expires_ms)));
        }
        let dead = match self.head(view, key, waiting(line, state.served), now)? {
            Err(unread) => return Ok(Ok(Decision::Expand(unread))),
            // A live waiter is in line: never jump the queue.
            Ok(Head::Live { .. }) => return Ok(Err(None)),
            Ok(Head::NoneLive {
                dead,
                complete: false,
            }) => return Ok(Ok(self.skip_dead(view, key, state, &dead, answer(None)))),
            Ok(Head::NoneLive { dead, .. }) => dead,
        };
        let expires_ms = now.saturating_add(millis(ttl));
        let served = dead.last().copied().unwrap_or(0);
        let state = granted(
            state,
            Holder {
                token: token.to_owned(),
                expires_ms,
            },
            served,
        );
        let handle = handle_at(key, token, state.fence, ttl, expires_ms).requested_at(sent);
        let writes = Writes {
            line: Self::prune(line, state.served),
            state: Some(state),
            gone: &dead,
        };
        Ok(Ok(self.write(view, key, writes, answer(Some(handle)))))
    }

    /// The holder leaves (release, or a waiter that gave up just after the
    /// lock was handed to it): the lock goes to the first live waiter, with
    /// the next fence and the lease that waiter asked for; dead waiters ahead
    /// of it leave the line. Nobody live waiting: the lock is free.
    fn hand_over(
        &self,
        view: &View,
        key: &str,
        state: &LockState,
        line: &LineState,
        now: u64,
    ) -> Result<Decision<()>, Error> {
        let queue = waiting(line, state.served);
        Ok(match self.head(view, key, queue, now)? {
            Err(unread) => Decision::Expand(unread),
            Ok(Head::Live { index, mut dead }) => {
                let next = &queue[index];
                let holder = Holder {
                    token: next.token.clone(),
                    expires_ms: now.saturating_add(next.ttl_ms),
                };
                dead.push(next.seq);
                let state = granted(state, holder, next.seq);
                let writes = Writes {
                    line: Self::prune(line, state.served),
                    state: Some(state),
                    gone: &dead,
                };
                self.write(view, key, writes, ())
            }
            Ok(Head::NoneLive { dead, .. }) => {
                let state = LockState {
                    fence: state.fence,
                    holder: None,
                    served: state.served.max(dead.last().copied().unwrap_or(0)),
                    nonce: mint_token(),
                };
                let writes = Writes {
                    line: Self::prune(line, state.served),
                    state: Some(state),
                    gone: &dead,
                };
                self.write(view, key, writes, ())
            }
        })
    }

    /// The handle of a grant this waiter learns by reading the lock record
    /// (handed over by a releaser): its lease is counted back from the end
    /// the record gives, so it never outlasts the store's. `None`: the end
    /// cannot be expressed in local time (then the lease simply runs out).
    fn handed(
        key: &str,
        holder: &Holder,
        fence: u64,
        ttl: Duration,
        now: u64,
        sent: Instant,
    ) -> Option<LockHandle> {
        let left = Duration::from_millis(holder.expires_ms.saturating_sub(now)).min(ttl);
        let requested = sent.checked_sub(ttl - left)?;
        Some(handle_at(key, &holder.token, fence, ttl, holder.expires_ms).requested_at(requested))
    }

    /// What the records say to the waiter holding `ticket`.
    fn judge(
        key: &str,
        (state, line): (&LockState, &LineState),
        ticket: &Ticket,
        ttl: Duration,
        now: u64,
        sent: Instant,
    ) -> Attempt {
        if let Some(h) = state.holder.as_ref().filter(|h| h.token == ticket.token) {
            if h.expires_ms <= now {
                // Handed over and run out before this waiter looked.
                return Attempt::Requeue;
            }
            return match Self::handed(key, h, state.fence, ttl, now, sent) {
                Some(handle) => Attempt::Granted(handle),
                None => Attempt::Wait(Some(h.expires_ms)),
            };
        }
        let queue = waiting(line, state.served);
        let Some(me) = queue.iter().position(|w| w.seq == ticket.seq) else {
            // Served (skipped as dead) or removed: a number never comes back.
            return Attempt::Requeue;
        };
        if let Some(h) = state.holder.as_ref().filter(|h| h.expires_ms > now) {
            return Attempt::Wait(Some(h.expires_ms));
        }
        // Free (the holder's lease ran out, or a release found nobody live
        // among the first waiters): try when nobody ahead is surely live.
        if queue[..me].iter().any(|w| w.expires_ms > now) {
            Attempt::Wait(None)
        } else {
            Attempt::Try
        }
    }

    /// The ticket number this client most likely gets next (what its cache
    /// last saw of the line): watched before joining the line.
    fn predicted_seq(&self, key: &str) -> u64 {
        let line_key = self.line_key(key);
        self.engine
            .cached(&line_key)
            .and_then(|entry| parse::<LineState>(&line_key, entry.value.as_deref()).ok())
            .map_or(1, |line| line.next_seq.max(1))
    }

    /// `line` with a new waiter at its end. Its ticket record is only
    /// written by its first renewal: until then the lease in the line says
    /// it is live, and a record written now would wake its own watch.
    fn joined(
        line: &LineState,
        token: &str,
        ttl: Duration,
        expires_ms: u64,
        sent: Instant,
    ) -> (LineState, Ticket) {
        let seq = line.next_seq.max(1);
        let mut queue = line.queue.clone();
        queue.push(Waiter {
            seq,
            token: token.to_owned(),
            ttl_ms: millis(ttl),
            expires_ms,
        });
        (
            LineState {
                next_seq: seq + 1,
                queue,
                nonce: mint_token(),
            },
            Ticket {
                seq,
                token: token.to_owned(),
                renew_at: sent + ttl / 3,
            },
        )
    }

    /// Join the line in one decision over both records: the lock itself
    /// when it is free and nobody live waits, else a ticket. Two rejected
    /// txns (the holder's writes raced it) and it gives up, so that the
    /// caller joins through the line record alone.
    async fn join_fast(&self, key: &str, ttl: Duration) -> Result<Joined, LockError> {
        let keys = self.both_keys(key);
        let token = mint_token();
        let sent = Instant::now();
        let now = self.clock.now_millis();
        let expires_ms = now.saturating_add(millis(ttl));
        let newcomer = Newcomer {
            token: &token,
            ttl,
            now,
            sent,
        };
        self.engine
            .with_retries(2, Duration::ZERO)
            .decide::<Result<Joined, LockError>, LockError, _>(&keys, |view| {
                let (state, line) = match self.decode(view, key) {
                    Ok(records) => records,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                let grant = self.grant_if_free(view, key, (&state, &line), &newcomer, |handle| {
                    Ok(handle.map_or(Joined::Cleaned, Joined::Granted))
                });
                let held = match grant {
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                    Ok(Ok(decision)) => return Ok(decision),
                    Ok(Err(held)) => held,
                };
                let line = without(&line, state.served, &[]);
                let (line, ticket) = Self::joined(&line, &token, ttl, expires_ms, sent);
                let writes = Writes {
                    state: None,
                    line: Some(line),
                    gone: &[],
                };
                Ok(self.write(
                    view,
                    key,
                    writes,
                    Ok(Joined::Queued(ticket, Next::Wait(held))),
                ))
            })
            .await?
    }

    /// Join the line through the line record alone (it never collides with
    /// the holder's writes, only with other waiters joining); then read the
    /// lock, which may have been freed meanwhile.
    async fn join_slow(&self, key: &str, ttl: Duration) -> Result<Ticket, LockError> {
        let line_key = self.line_key(key);
        let token = mint_token();
        let sent = Instant::now();
        let expires_ms = self.clock.now_millis().saturating_add(millis(ttl));
        // No pause between tries: the holder's rejoin (fresh cache, one
        // round trip) would win every race against a waiter that pauses.
        self.engine
            .with_retries(self.engine.options().max_attempts, Duration::ZERO)
            .decide::<Result<Ticket, LockError>, LockError, _>(
                std::slice::from_ref(&line_key),
                |view| {
                    let line: LineState = match parse(&line_key, view.value(&line_key)) {
                        Ok(line) => line,
                        Err(e) => return Ok(Decision::Return(Err(e.into()))),
                    };
                    let (line, ticket) = Self::joined(&line, &token, ttl, expires_ms, sent);
                    let writes = Writes {
                        state: None,
                        line: Some(line),
                        gone: &[],
                    };
                    Ok(self.write(view, key, writes, Ok(ticket)))
                },
            )
            .await?
    }

    /// Join the line: the fast way, else the slow one; every txn rejected
    /// on the slow way (other waiters joining; none applied) is retried
    /// after a pause until the deadline, then [`LockError::Timeout`].
    async fn join(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        started: Instant,
    ) -> Result<Joined, LockError> {
        match self.join_fast(key, ttl).await {
            Err(LockError::Store(Error::ConflictRetriesExhausted { .. })) => {}
            other => return other,
        }
        let deadline = wait.deadline_from(started);
        let mut refusals = 0u32;
        loop {
            match self.join_slow(key, ttl).await {
                Err(LockError::Store(Error::ConflictRetriesExhausted { .. })) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(LockError::Timeout {
                            key: key.to_owned(),
                            waited: now - started,
                        });
                    }
                    refusals += 1;
                    tokio::time::sleep_until((now + wait.pause(refusals)).min(deadline)).await;
                }
                other => return other.map(|ticket| Joined::Queued(ticket, Next::Look)),
            }
        }
    }

    /// Watch, then join the line. The watch is on the ticket the cache
    /// predicts, set up before joining so that a hand-over right after it
    /// wakes this waiter; a wrong guess costs one more watch and one read.
    async fn join_line(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        started: Instant,
    ) -> Result<Result<LockHandle, (Ticket, Wake, Next)>, LockError> {
        let backend = self.engine.backend().as_ref();
        loop {
            let predicted = self.predicted_seq(key);
            let wake = Wake::watch(backend, &self.ticket_key(key, predicted)).await;
            match self.join(key, ttl, wait, started).await? {
                Joined::Granted(handle) => return Ok(Ok(handle)),
                Joined::Cleaned => continue,
                Joined::Queued(ticket, next) if ticket.seq == predicted => {
                    return Ok(Err((ticket, wake, next)))
                }
                Joined::Queued(ticket, _) => {
                    drop(wake);
                    let wake = Wake::watch(backend, &self.ticket_key(key, ticket.seq)).await;
                    return Ok(Err((ticket, wake, Next::Look)));
                }
            }
        }
    }

    /// Read both records and judge them for the waiter holding `ticket`: a
    /// read, never a txn, so waiters do not collide with the writers.
    async fn look(&self, key: &str, ticket: &Ticket, ttl: Duration) -> Result<Attempt, LockError> {
        let keys = self.both_keys(key);
        let sent = Instant::now();
        let now = self.clock.now_millis();
        let entries = self.engine.snapshot(&keys).await?;
        let value = |k: &str| {
            entries
                .iter()
                .find(|e| e.key == k)
                .and_then(|e| e.value.as_deref())
        };
        let state: LockState = parse(&keys[0], value(&keys[0]))?;
        let line: LineState = parse(&keys[1], value(&keys[1]))?;
        Ok(Self::judge(key, (&state, &line), ticket, ttl, now, sent))
    }

    /// The decision of a waiter that found the lock free: take it when it is
    /// the first live waiter (removing the dead ones ahead).
    async fn attempt(
        &self,
        key: &str,
        ticket: &Ticket,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        let keys = self.both_keys(key);
        let sent = Instant::now();
        let now = self.clock.now_millis();
        self.engine
            .decide::<Result<Attempt, LockError>, LockError, _>(&keys, |view| {
                let (state, line) = match self.decode(view, key) {
                    Ok(records) => records,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                match Self::judge(key, (&state, &line), ticket, ttl, now, sent) {
                    Attempt::Try => {}
                    other => return Ok(Decision::Return(Ok(other))),
                }
                let queue = waiting(&line, state.served);
                let head = match self.head(view, key, queue, now) {
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                    Ok(Err(unread)) => return Ok(Decision::Expand(unread)),
                    Ok(Ok(head)) => head,
                };
                Ok(match head {
                    Head::Live { index, mut dead } if queue[index].seq == ticket.seq => {
                        let expires_ms = now.saturating_add(millis(ttl));
                        let state = granted(
                            &state,
                            Holder {
                                token: ticket.token.clone(),
                                expires_ms,
                            },
                            ticket.seq,
                        );
                        let handle = handle_at(key, &ticket.token, state.fence, ttl, expires_ms)
                            .requested_at(sent);
                        dead.push(ticket.seq);
                        let writes = Writes {
                            line: Self::prune(&line, state.served),
                            state: Some(state),
                            gone: &dead,
                        };
                        self.write(view, key, writes, Ok(Attempt::Granted(handle)))
                    }
                    Head::Live { dead, .. } | Head::NoneLive { dead, .. } if !dead.is_empty() => {
                        self.skip_dead(view, key, &state, &dead, Ok(Attempt::Cleaned))
                    }
                    // Someone live is ahead (it takes the lock), or this
                    // waiter is beyond the first waiters: wait and look again.
                    _ => Decision::Return(Ok(Attempt::Wait(None))),
                })
            })
            .await?
    }

    /// Extend the lease of a waiting ticket (writing its record). Asserts
    /// the lock and line records too, so a ticket removed by a hand-over or
    /// as dead never comes back. `Ok(false)`: this waiter is no longer
    /// waiting (the lock was handed to it, or it left the line): look.
    async fn renew_ticket(
        &self,
        key: &str,
        ticket: &mut Ticket,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let my_key = self.ticket_key(key, ticket.seq);
        let [state_key, line_key] = self.both_keys(key);
        let keys = [state_key, line_key, my_key.clone()];
        let sent = Instant::now();
        let now = self.clock.now_millis();
        let expires_ms = now.saturating_add(millis(ttl));
        let renewed = self
            .engine
            .with_retries(self.engine.options().max_attempts, Duration::ZERO)
            .decide::<Result<bool, LockError>, LockError, _>(&keys, |view| {
                let (state, line) = match self.decode(view, key) {
                    Ok(records) => records,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                match Self::judge(key, (&state, &line), ticket, ttl, now, sent) {
                    Attempt::Granted(_) | Attempt::Requeue => {
                        return Ok(Decision::Return(Ok(false)))
                    }
                    _ => {}
                }
                let current = match Self::decode_ticket(view, &my_key) {
                    Ok(current) => current.map_or(0, |t| t.expires_ms),
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                Ok(Decision::Commit {
                    mutations: vec![Mutation::put(
                        my_key.clone(),
                        encode(&TicketRecord {
                            token: ticket.token.clone(),
                            expires_ms: expires_ms.max(current),
                            nonce: mint_token(),
                        }),
                    )],
                    then: Ok(true),
                })
            })
            .await??;
        ticket.renew_at = sent + ttl / 3;
        Ok(renewed)
    }

    /// Leave the line: remove the ticket if it is still there; if the lock
    /// was handed to this waiter meanwhile, hand it on.
    async fn abandon(&self, key: &str, ticket: &Ticket) -> Result<(), LockError> {
        let keys = self.both_keys(key);
        let now = self.clock.now_millis();
        self.engine
            .decide::<Result<(), LockError>, LockError, _>(&keys, |view| {
                let (state, line) = match self.decode(view, key) {
                    Ok(records) => records,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if state
                    .holder
                    .as_ref()
                    .is_some_and(|h| h.token == ticket.token)
                {
                    return Ok(self.hand_over(view, key, &state, &line, now)?.map_ok());
                }
                if !waiting(&line, state.served)
                    .iter()
                    .any(|w| w.seq == ticket.seq)
                {
                    return Ok(Decision::Return(Ok(())));
                }
                let gone = [ticket.seq];
                let writes = Writes {
                    state: None,
                    line: Some(without(&line, state.served, &gone)),
                    gone: &gone,
                };
                Ok(self.write(view, key, writes, Ok(())))
            })
            .await?
    }

    /// What the store holds for `key`: the holder's lease and the line, by
    /// two reads (the lock and line records, then the tickets): for
    /// inspection only, never a basis for a decision. `Ok(None)`: never used.
    pub async fn status(&self, key: &str) -> Result<Option<FairLockStatus>, LockError> {
        validate_lock_input(key, Duration::from_millis(1))?;
        let keys = self.both_keys(key);
        let entries = self.engine.snapshot(&keys).await?;
        if entries.iter().all(|e| e.value.is_none()) {
            return Ok(None);
        }
        let value = |k: &str| {
            entries
                .iter()
                .find(|e| e.key == k)
                .and_then(|e| e.value.as_deref())
        };
        let state: LockState = parse(&keys[0], value(&keys[0]))?;
        let line: LineState = parse(&keys[1], value(&keys[1]))?;
        let now = self.clock.now_millis();
        let mut tickets_status = Vec::new();
        let limit = self.engine.backend().limits().max_keys_per_call.max(1);
        for chunk in waiting(&line, state.served).chunks(limit) {
            let keys: Vec<String> = chunk.iter().map(|w| self.ticket_key(key, w.seq)).collect();
            let tickets = self.engine.snapshot(&keys).await?;
            for (w, entry) in chunk.iter().zip(tickets) {
                let ticket: Option<TicketRecord> = entry
                    .value
                    .as_deref()
                    .map(serde_json::from_slice)
                    .transpose()
                    .map_err(|e| {
                        Error::malformed(&entry.key, format!("not a fair lock ticket: {e}"))
                    })?;
                // The lease in the line until the first renewal writes the ticket.
                let expires_ms = ticket
                    .filter(|t| t.token == w.token)
                    .map_or(w.expires_ms, |t| t.expires_ms.max(w.expires_ms));
                tickets_status.push(TicketStatus {
                    seq: w.seq,
                    expires_at: Some(UNIX_EPOCH + Duration::from_millis(expires_ms)),
                    live: expires_ms > now,
                });
            }
        }
        Ok(Some(FairLockStatus {
            key: key.to_owned(),
            fence: state.fence,
            expires_at: state
                .holder
                .as_ref()
                .map(|h| UNIX_EPOCH + Duration::from_millis(h.expires_ms)),
            live: state.holder.as_ref().is_some_and(|h| h.expires_ms > now),
            waiting: tickets_status,
        }))
    }

    /// The local instant at which `expires_ms` (by the lock's clock) passes.
    fn instant_of(&self, expires_ms: u64) -> Instant {
        let left = expires_ms.saturating_sub(self.clock.now_millis());
        Instant::now() + Duration::from_millis(left.saturating_add(1))
    }

    #[allow(clippy::too_many_arguments)]
    async fn wait_in_line(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        ticket: &mut Ticket,
        started: Instant,
        wake: &mut Wake,
        mut next: Next,
    ) -> Result<LockHandle, LockError> {
        let deadline = wait.deadline_from(started);
        let mut refusals = 0u32;
        loop {
            let attempt = match next {
                Next::Look => self.look(key, ticket, ttl).await?,
                Next::Try => match self.attempt(key, ticket, ttl).await {
                    // Every txn was rejected (none applied): contention with
                    // other waiters, not a failure; wait and look again.
                    Err(LockError::Store(Error::ConflictRetriesExhausted { .. })) => {
                        Attempt::Wait(None)
                    }
                    other => other?,
                },
                Next::Wait(held) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(LockError::Timeout {
                            key: key.to_owned(),
                            waited: now - started,
                        });
                    }
                    if now >= ticket.renew_at && !self.renew_ticket(key, ticket, ttl).await? {
                        next = Next::Look;
                        continue;
                    }
                    // With a live watch the releaser wakes this waiter: the
                    // poll only covers lost notifications, at the longest
                    // pause. Without one, poll with the growing backoff.
                    let poll = if wake.is_watching() {
                        wait.pause(u32::MAX)
                    } else {
                        refusals += 1;
                        wait.pause(refusals)
                    };
                    let mut until = (now + poll).min(deadline).min(ticket.renew_at);
                    if let Some(expires_ms) = held {
                        until = until.min(self.instant_of(expires_ms));
                    }
                    wake.until(until).await;
                    next = Next::Look;
                    continue;
                }
            };
            next = match attempt {
                Attempt::Granted(handle) => return Ok(handle),
                Attempt::Wait(held) => Next::Wait(held),
                Attempt::Try | Attempt::Cleaned => Next::Try,
                Attempt::Requeue => match self.join_line(key, ttl, wait, started).await? {
                    Ok(handle) => return Ok(handle),
                    Err((fresh, watch, next)) => {
                        *ticket = fresh;
                        *wake = watch;
                        next
                    }
                },
            };
        }
    }
}

impl Decision<()> {
    /// The same decision answering `Ok(())` (for a caller whose answer is a `Result`).
    fn map_ok<E>(self) -> Decision<Result<(), E>> {
        match self {
            Decision::Return(()) => Decision::Return(Ok(())),
            Decision::Commit { mutations, then } => Decision::Commit {
                mutations,
                then: Ok(then),
            },
            Decision::CommitWithUnasserted {
                mutations,
                unasserted,
                then,
            } => Decision::CommitWithUnasserted {
                mutations,
                unasserted,
                then: Ok(then),
            },
            Decision::Expand(keys) => Decision::Expand(keys),
        }
    }
}

#[async_trait]
impl Lock for FairLock {
    #[tracing::instrument(name = "lock.try_lock", skip_all, fields(
        key = %key, store = self.engine.backend().store_name(), fence = tracing::field::Empty,
    ))]
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        validate_lock_input(key, ttl)?;
        let keys = self.both_keys(key);
        let sent = Instant::now();
        let now = self.clock.now_millis();
        let token = mint_token();
        let newcomer = Newcomer {
            token: &token,
            ttl,
            now,
            sent,
        };
        loop {
            let answer = self
                .engine
                .decide::<Result<Option<Option<LockHandle>>, LockError>, LockError, _>(
                    &keys,
                    |view| {
                        let (state, line) = match self.decode(view, key) {
                            Ok(records) => records,
                            Err(e) => return Ok(Decision::Return(Err(e.into()))),
                        };
                        let answer = |handle: Option<LockHandle>| Ok(handle.map(Some));
                        match self.grant_if_free(view, key, (&state, &line), &newcomer, answer) {
                            Err(e) => Ok(Decision::Return(Err(e.into()))),
                            Ok(Ok(decision)) => Ok(decision),
                            Ok(Err(_)) => Ok(Decision::Return(Ok(Some(None)))),
                        }
                    },
                )
                .await??;
            // `None`: dead tickets were removed in a batch; decide again.
            if let Some(answer) = answer {
                if let Some(handle) = &answer {
                    tracing::Span::current().record("fence", handle.fence());
                    telemetry::lock_acquired();
                }
                return Ok(answer);
            }
        }
    }

    #[tracing::instrument(name = "lock.renew", skip_all, fields(
        key = %handle.key(), store = self.engine.backend().store_name(), fence = handle.fence(),
    ))]
    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        validate_lock_input(handle.key(), handle.ttl())?;
        let state_key = self.state_key(handle.key());
        let now = self.clock.now_millis();
        let keys = [state_key.clone()];
        let renewed = self
            .engine
            .decide::<Result<(), LockError>, LockError, _>(&keys, |view| {
                let state: LockState = match parse(&state_key, view.value(&state_key)) {
                    Ok(state) => state,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if let Some(reason) = Self::why_not_held(handle, &state, now) {
                    return Ok(Decision::Return(Err(Self::lost(handle, reason))));
                }
                let current = state.holder.as_ref().map_or(0, |h| h.expires_ms);
                let renewed = LockState {
                    fence: state.fence,
                    served: state.served,
                    holder: Some(Holder {
                        token: handle.token().to_owned(),
                        // A clock stepping back must not shorten a granted lease.
                        expires_ms: now.saturating_add(millis(handle.ttl())).max(current),
                    }),
                    nonce: mint_token(),
                };
                Ok(Decision::Commit {
                    mutations: vec![Mutation::put(state_key.clone(), encode(&renewed))],
                    then: Ok(()),
                })
            })
            .await?;
        if let Err(error) = &renewed {
            telemetry::lock_lost_if(error);
        }
        renewed
    }

    /// Release, handing the lock to the first live waiter in the same txn
    /// (the next fence, the lease it asked for): the waiter is woken by the
    /// removal of its ticket and only reads to learn it holds the lock.
    #[tracing::instrument(name = "lock.release", skip_all, fields(
        key = %handle.key(), store = self.engine.backend().store_name(), fence = handle.fence(),
    ))]
    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        validate_lock_input(handle.key(), handle.ttl())?;
        let keys = self.both_keys(handle.key());
        let now = self.clock.now_millis();
        self.engine
            .decide::<Result<(), LockError>, LockError, _>(&keys, |view| {
                let (state, line) = match self.decode(view, handle.key()) {
                    Ok(records) => records,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if let Some(reason) = Self::why_not_held(&handle, &state, now) {
                    return Ok(Decision::Return(Err(Self::lost(&handle, reason))));
                }
                // The lock record stays: its fence must survive.
                Ok(self
                    .hand_over(view, handle.key(), &state, &line, now)?
                    .map_ok())
            })
            .await?
    }

    async fn watch_key(&self, key: &str) -> Wake {
        Wake::watch(self.engine.backend().as_ref(), &self.watch_prefix(key)).await
    }

    /// Wait in line: watch the ticket, take it, then sleep until the holder
    /// hands the lock over (its txn removes the ticket, which wakes this
    /// waiter), the holder's lease runs out, or the fallback poll; renew
    /// the ticket every third of `ttl`. On timeout or error the ticket is
    /// removed (if that fails too, it expires within `ttl`).
    #[tracing::instrument(name = "lock.wait", skip_all, fields(
        key = %key, store = self.engine.backend().store_name(),
    ))]
    async fn wait_lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<LockHandle, LockError> {
        validate_lock_input(key, ttl)?;
        let started = Instant::now();
        let (mut ticket, mut wake, next) = match self.join_line(key, ttl, wait, started).await? {
            Ok(handle) => {
                telemetry::lock_acquired();
                return Ok(handle);
            }
            Err(queued) => queued,
        };
        match self
            .wait_in_line(key, ttl, wait, &mut ticket, started, &mut wake, next)
            .await
        {
            Ok(handle) => {
                telemetry::lock_acquired();
                Ok(handle)
            }
            Err(error) => {
                if let Err(cleanup) = self.abandon(key, &ticket).await {
                    tracing::debug!(%cleanup, "could not remove a ticket: it expires by itself");
                }
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::LockExt;
    use coord_backend::ManualClock;
    use coord_memory::SingleProcessMemoryBackend;

    fn fair(backend: &Arc<dyn Backend>, clock: &Arc<ManualClock>) -> FairLock {
        FairLock::with_options(
            backend.clone(),
            FairLockOptions::default().with_clock(clock.clone()),
        )
    }

    #[tokio::test]
    async fn try_lock_and_release_keep_the_fence_and_leave_no_tickets() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("fl").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000));
        let lock = fair(&backend, &clock);
        let ttl = Duration::from_secs(10);
        let h = lock.try_lock("k", ttl).await.unwrap().unwrap();
        assert_eq!(h.fence(), 1);
        assert!(lock.try_lock("k", ttl).await.unwrap().is_none());
        lock.release(h).await.unwrap();
        let h = lock.lock("k", ttl, Duration::from_secs(1)).await.unwrap();
        assert_eq!(h.fence(), 2);
        lock.release(h).await.unwrap();
        assert_eq!(
            backend.keys("fairlock/k/q/").await.unwrap(),
            Vec::<String>::new()
        );
        let status = lock.status("k").await.unwrap().unwrap();
        assert_eq!(
            (status.fence, status.live, status.waiting.len()),
            (2, false, 0)
        );
    }

    #[tokio::test]
    async fn more_dead_tickets_than_one_decision_reads_are_cleared_in_batches() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("fl").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000));
        let lock = fair(&backend, &clock);
        let short = Duration::from_millis(100);
        for _ in 0..(LOOKAHEAD * 2 + 3) {
            lock.join_slow("k", short).await.unwrap();
        }
        assert!(lock.try_lock("k", short).await.unwrap().is_none());
        clock.advance(Duration::from_millis(101));
        let h = lock.try_lock("k", short).await.unwrap().unwrap();
        assert_eq!(h.fence(), 1);
        assert_eq!(
            backend.keys("fairlock/k/q/").await.unwrap(),
            Vec::<String>::new()
        );
    }
}
