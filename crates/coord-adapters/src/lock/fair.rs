//! [`FairLock`]: a lock handed over in request order (FIFO tickets), like
//! etcd's `concurrency.Mutex` and Curator's `InterProcessMutex`, decided
//! over the three primitives of any backend.
//!
//! # Records (per key, under the prefix, `fairlock/` by default)
//!
//! - `<prefix><key>/m`: the lock record: the fence counter, the next ticket
//!   number, the queue (ticket numbers in order) and the current holder.
//! - `<prefix><key>/q/<seq>` (20 digits): one ticket per waiter, with its
//!   own lease, renewed by the waiter while it waits.
//!
//! A ticket is created, and its number taken from the counter, in one
//! asserted txn with the lock record. The lock goes to the waiter whose
//! ticket is the first *live* one of the queue, in a txn that asserts the
//! lock record and every ticket ahead that it judged dead: dead tickets
//! (their lease ran out: the waiter died, or paused past its lease) are
//! removed in that txn by whoever sees them first. A waiter that gives up
//! (timeout) removes its own ticket; one that is cancelled or dies leaves a
//! ticket that blocks the queue until its lease runs out, never longer.
//! Tickets are deleted on grant and give-up, so storage stays bounded by
//! the waiters present; the lock record stays, to keep the fence.
//!
//! The holder's lease lives in the lock record, exactly as in
//! [`super::GenericLock`]: renew and release are one txn each, and the fence
//! (per key, strictly increasing, allocated in the grant's txn) survives
//! release. [`Lock::try_lock`] takes the lock only when it is free **and** no
//! live ticket waits: it never jumps the queue.
//!
//! Waiting watches the key's records ([`Wake`]) before enqueueing, so a
//! release wakes the next waiter at once on a store with change
//! notifications; otherwise (and after a lost notification) the waiter
//! polls with the backoff of [`WaitOptions`].

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

/// The lock record, `<prefix><key>/m`.
#[derive(Serialize, Deserialize, Default)]
struct FairRecord {
    /// The fence of the latest grant (0 = never granted).
    fence: u64,
    /// The number the next ticket gets (numbers are never reused).
    next_seq: u64,
    /// Ticket numbers of the waiters, in order.
    queue: Vec<u64>,
    /// The current holder, if any (its lease may have expired).
    holder: Option<Holder>,
    /// Fresh per write (see the CAS engine on indeterminate txns).
    nonce: String,
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

impl std::fmt::Debug for FairRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairRecord")
            .field("fence", &self.fence)
            .field("next_seq", &self.next_seq)
            .field("queue", &self.queue)
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

/// What one attempt of a waiter found.
enum Attempt {
    Granted(LockHandle),
    /// A live ticket is ahead, or the lock is held: wait.
    Wait,
    /// Dead tickets ahead were removed; try again at once.
    Cleaned,
    /// This waiter's ticket is gone (it was judged dead): enqueue again.
    Requeue,
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
    /// When the ticket's lease ends (`None`: the ticket record is gone).
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

    fn record_key(&self, key: &str) -> String {
        format!("{}{key}/m", self.prefix)
    }

    fn ticket_key(&self, key: &str, seq: u64) -> String {
        // 20 digits: every u64, and the ticket keys sort in queue order.
        format!("{}{key}/q/{seq:020}", self.prefix)
    }

    fn watch_prefix(&self, key: &str) -> String {
        format!("{}{key}/", self.prefix)
    }

    fn decode_record(view: &View, key: &str) -> Result<FairRecord, Error> {
        match view.value(key) {
            None => Ok(FairRecord::default()),
            Some(bytes) => serde_json::from_slice(bytes)
                .map_err(|e| Error::malformed(key, format!("not a fair lock record: {e}"))),
        }
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

    fn why_not_held(handle: &LockHandle, record: &FairRecord, now: u64) -> Option<LostReason> {
        match &record.holder {
            Some(h) if h.token == handle.token() => {
                (h.expires_ms <= now).then_some(LostReason::Expired)
            }
            _ if record.fence > handle.fence() => Some(LostReason::TakenOver),
            _ => Some(LostReason::NotHeld),
        }
    }

    /// Which of `seqs` (tickets ahead) are dead, reading them from the view.
    /// `Err(keys)`: read these first. `Ok(None)`: one of them is live.
    #[allow(clippy::type_complexity)]
    fn dead_ahead(
        &self,
        view: &View,
        key: &str,
        seqs: &[u64],
        now: u64,
    ) -> Result<Result<Option<Vec<u64>>, Vec<String>>, Error> {
        let unread: Vec<String> = seqs
            .iter()
            .map(|&s| self.ticket_key(key, s))
            .filter(|k| !view.contains(k))
            .collect();
        if !unread.is_empty() {
            return Ok(Err(unread));
        }
        let mut dead = Vec::new();
        for &seq in seqs {
            match Self::decode_ticket(view, &self.ticket_key(key, seq))? {
                Some(t) if t.expires_ms > now => return Ok(Ok(None)),
                _ => dead.push(seq),
            }
        }
        Ok(Ok(Some(dead)))
    }

    /// Grant the lock to `token` in `record`, removing the tickets `gone`
    /// from the queue and the store.
    #[allow(clippy::too_many_arguments)]
    fn grant(
        &self,
        key: &str,
        record: &FairRecord,
        record_key: &str,
        gone: &[u64],
        token: &str,
        ttl: Duration,
        now: u64,
        sent: Instant,
    ) -> (Vec<Mutation>, LockHandle) {
        let expires_ms = now.saturating_add(millis(ttl));
        let granted = FairRecord {
            fence: record.fence + 1,
            next_seq: record.next_seq,
            queue: record
                .queue
                .iter()
                .copied()
                .filter(|s| !gone.contains(s))
                .collect(),
            holder: Some(Holder {
                token: token.to_owned(),
                expires_ms,
            }),
            nonce: mint_token(),
        };
        let mut mutations = vec![Mutation::put(record_key, encode(&granted))];
        mutations.extend(
            gone.iter()
                .map(|&s| Mutation::delete(self.ticket_key(key, s))),
        );
        let handle = LockHandle::new(
            key,
            token,
            granted.fence,
            ttl,
            UNIX_EPOCH + Duration::from_millis(expires_ms),
        )
        .requested_at(sent);
        (mutations, handle)
    }

    /// Remove the tickets `gone` (dead) from the queue and the store.
    fn cleanup(
        &self,
        key: &str,
        record: &FairRecord,
        record_key: &str,
        gone: &[u64],
    ) -> Vec<Mutation> {
        let cleaned = FairRecord {
            fence: record.fence,
            next_seq: record.next_seq,
            queue: record
                .queue
                .iter()
                .copied()
                .filter(|s| !gone.contains(s))
                .collect(),
            holder: record.holder.as_ref().map(|h| Holder {
                token: h.token.clone(),
                expires_ms: h.expires_ms,
            }),
            nonce: mint_token(),
        };
        let mut mutations = vec![Mutation::put(record_key, encode(&cleaned))];
        mutations.extend(
            gone.iter()
                .map(|&s| Mutation::delete(self.ticket_key(key, s))),
        );
        mutations
    }

    /// Take a ticket: its number from the counter, in one txn with the record.
    async fn enqueue(&self, key: &str, ttl: Duration) -> Result<Ticket, LockError> {
        let record_key = self.record_key(key);
        let token = mint_token();
        let sent = Instant::now();
        let expires_ms = self.clock.now_millis().saturating_add(millis(ttl));
        let keys = [record_key.clone()];
        let seq = self
            .engine
            .decide::<Result<u64, LockError>, LockError, _>(&keys, |view| {
                let record = match Self::decode_record(view, &record_key) {
                    Ok(record) => record,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                let seq = record.next_seq.max(1);
                let ticket_key = self.ticket_key(key, seq);
                if !view.contains(&ticket_key) {
                    return Ok(Decision::Expand(vec![ticket_key]));
                }
                let mut queue = record.queue.clone();
                queue.push(seq);
                let updated = FairRecord {
                    next_seq: seq + 1,
                    queue,
                    nonce: mint_token(),
                    ..record
                };
                let ticket = TicketRecord {
                    token: token.clone(),
                    expires_ms,
                    nonce: mint_token(),
                };
                Ok(Decision::Commit {
                    mutations: vec![
                        Mutation::put(record_key.clone(), encode(&updated)),
                        Mutation::put(ticket_key, encode(&ticket)),
                    ],
                    then: Ok(seq),
                })
            })
            .await??;
        Ok(Ticket {
            seq,
            token,
            renew_at: sent + ttl / 3,
        })
    }

    /// Whether a consistent read shows this waiter must wait (the lock held,
    /// or a live ticket ahead) or is out of line. Waiters that merely poll
    /// answer from reads and never send a txn, so they do not collide with
    /// the writers of the lock record; only the head of the line decides.
    async fn look(
        &self,
        key: &str,
        ticket: &Ticket,
        now: u64,
    ) -> Result<Option<Attempt>, LockError> {
        let record_key = self.record_key(key);
        let entries = self
            .engine
            .snapshot(std::slice::from_ref(&record_key))
            .await?;
        let record = match entries.first().and_then(|e| e.value.as_deref()) {
            None => FairRecord::default(),
            Some(bytes) => serde_json::from_slice(bytes).map_err(|e| {
                Error::malformed(&record_key, format!("not a fair lock record: {e}"))
            })?,
        };
        if !record.queue.contains(&ticket.seq) {
            // A removed ticket never comes back (numbers are not reused).
            return Ok(Some(Attempt::Requeue));
        }
        if record.holder.as_ref().is_some_and(|h| h.expires_ms > now) {
            return Ok(Some(Attempt::Wait));
        }
        let ahead: Vec<String> = record
            .queue
            .iter()
            .filter(|&&s| s < ticket.seq)
            .take(LOOKAHEAD)
            .map(|&s| self.ticket_key(key, s))
            .collect();
        if ahead.is_empty() {
            return Ok(None);
        }
        for entry in self.engine.snapshot(&ahead).await? {
            let live = match entry.value.as_deref() {
                None => false,
                Some(bytes) => {
                    let t: TicketRecord = serde_json::from_slice(bytes).map_err(|e| {
                        Error::malformed(&entry.key, format!("not a fair lock ticket: {e}"))
                    })?;
                    t.expires_ms > now
                }
            };
            if live {
                return Ok(Some(Attempt::Wait));
            }
        }
        Ok(None)
    }
    /// [`FairLock::enqueue`] for a waiter: every txn rejected (contention
    /// with other waiters; none applied) is retried after a pause until the
    /// deadline, then [`LockError::Timeout`].
    async fn enqueue_waiting(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        started: Instant,
    ) -> Result<Ticket, LockError> {
        let deadline = wait.deadline_from(started);
        let mut refusals = 0u32;
        loop {
            match self.enqueue(key, ttl).await {
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
                other => return other,
            }
        }
    }

    /// One attempt of the waiter holding `ticket` to take the lock.
    async fn attempt(
        &self,
        key: &str,
        ticket: &Ticket,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        let record_key = self.record_key(key);
        let my_key = self.ticket_key(key, ticket.seq);
        let sent = Instant::now();
        let now = self.clock.now_millis();
        if let Some(answer) = self.look(key, ticket, now).await? {
            return Ok(answer);
        }
        let keys = [record_key.clone(), my_key.clone()];
        self.engine
            .decide::<Result<Attempt, LockError>, LockError, _>(&keys, |view| {
                let record = match Self::decode_record(view, &record_key) {
                    Ok(record) => record,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if !record.queue.contains(&ticket.seq) {
                    return Ok(Decision::Return(Ok(Attempt::Requeue)));
                }
                let ahead: Vec<u64> = record
                    .queue
                    .iter()
                    .copied()
                    .filter(|&s| s < ticket.seq)
                    .collect();
                let first = &ahead[..ahead.len().min(LOOKAHEAD)];
                let dead = match self.dead_ahead(view, key, first, now) {
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                    Ok(Err(unread)) => return Ok(Decision::Expand(unread)),
                    Ok(Ok(None)) => return Ok(Decision::Return(Ok(Attempt::Wait))),
                    Ok(Ok(Some(dead))) => dead,
                };
                if ahead.len() > first.len() {
                    return Ok(Decision::Commit {
                        mutations: self.cleanup(key, &record, &record_key, &dead),
                        then: Ok(Attempt::Cleaned),
                    });
                }
                if record.holder.as_ref().is_some_and(|h| h.expires_ms > now) {
                    return Ok(Decision::Return(Ok(Attempt::Wait)));
                }
                let mut gone = dead;
                gone.push(ticket.seq);
                let (mutations, handle) = self.grant(
                    key,
                    &record,
                    &record_key,
                    &gone,
                    &ticket.token,
                    ttl,
                    now,
                    sent,
                );
                Ok(Decision::Commit {
                    mutations,
                    then: Ok(Attempt::Granted(handle)),
                })
            })
            .await?
    }

    /// Extend the lease of a waiting ticket. `Ok(false)`: it is gone.
    async fn renew_ticket(
        &self,
        key: &str,
        ticket: &mut Ticket,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let my_key = self.ticket_key(key, ticket.seq);
        let sent = Instant::now();
        let expires_ms = self.clock.now_millis().saturating_add(millis(ttl));
        let keys = [my_key.clone()];
        let token = ticket.token.clone();
        let renewed =
            self.engine
                .decide::<Result<bool, LockError>, LockError, _>(&keys, |view| {
                    match Self::decode_ticket(view, &my_key) {
                        Err(e) => Ok(Decision::Return(Err(e.into()))),
                        Ok(Some(t)) if t.token == token => Ok(Decision::Commit {
                            mutations: vec![Mutation::put(
                                my_key.clone(),
                                encode(&TicketRecord {
                                    token: token.clone(),
                                    expires_ms: expires_ms.max(t.expires_ms),
                                    nonce: mint_token(),
                                }),
                            )],
                            then: Ok(true),
                        }),
                        Ok(_) => Ok(Decision::Return(Ok(false))),
                    }
                })
                .await??;
        ticket.renew_at = sent + ttl / 3;
        Ok(renewed)
    }

    /// Leave the queue: remove the ticket (if it is still there).
    async fn abandon(&self, key: &str, ticket: &Ticket) -> Result<(), LockError> {
        let record_key = self.record_key(key);
        let my_key = self.ticket_key(key, ticket.seq);
        let keys = [record_key.clone(), my_key.clone()];
        self.engine
            .decide::<Result<(), LockError>, LockError, _>(&keys, |view| {
                let record = match Self::decode_record(view, &record_key) {
                    Ok(record) => record,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if !record.queue.contains(&ticket.seq) {
                    return Ok(Decision::Return(Ok(())));
                }
                Ok(Decision::Commit {
                    mutations: self.cleanup(key, &record, &record_key, &[ticket.seq]),
                    then: Ok(()),
                })
            })
            .await?
    }

    /// What the store holds for `key`: the holder's lease and the queue, by
    /// two reads (the lock record, then its tickets): for inspection only,
    /// never a basis for a decision. `Ok(None)`: never used.
    pub async fn status(&self, key: &str) -> Result<Option<FairLockStatus>, LockError> {
        validate_lock_input(key, Duration::from_millis(1))?;
        let record_key = self.record_key(key);
        let entries = self
            .engine
            .snapshot(std::slice::from_ref(&record_key))
            .await?;
        let Some(bytes) = entries.first().and_then(|e| e.value.as_deref()) else {
            return Ok(None);
        };
        let record: FairRecord = serde_json::from_slice(bytes)
            .map_err(|e| Error::malformed(&record_key, format!("not a fair lock record: {e}")))?;
        let now = self.clock.now_millis();
        let mut waiting = Vec::new();
        let limit = self.engine.backend().limits().max_keys_per_call.max(1);
        for chunk in record.queue.chunks(limit) {
            let keys: Vec<String> = chunk.iter().map(|&s| self.ticket_key(key, s)).collect();
            let tickets = self.engine.snapshot(&keys).await?;
            for (&seq, entry) in chunk.iter().zip(tickets) {
                let ticket: Option<TicketRecord> = entry
                    .value
                    .as_deref()
                    .map(serde_json::from_slice)
                    .transpose()
                    .map_err(|e| {
                        Error::malformed(&entry.key, format!("not a fair lock ticket: {e}"))
                    })?;
                waiting.push(TicketStatus {
                    seq,
                    expires_at: ticket
                        .as_ref()
                        .map(|t| UNIX_EPOCH + Duration::from_millis(t.expires_ms)),
                    live: ticket.is_some_and(|t| t.expires_ms > now),
                });
            }
        }
        Ok(Some(FairLockStatus {
            key: key.to_owned(),
            fence: record.fence,
            expires_at: record
                .holder
                .as_ref()
                .map(|h| UNIX_EPOCH + Duration::from_millis(h.expires_ms)),
            live: record.holder.as_ref().is_some_and(|h| h.expires_ms > now),
            waiting,
        }))
    }

    async fn wait_in_line(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        ticket: &mut Ticket,
        started: Instant,
        wake: &mut Wake,
    ) -> Result<LockHandle, LockError> {
        let deadline = wait.deadline_from(started);
        let mut refusals = 0u32;
        loop {
            let attempt = match self.attempt(key, ticket, ttl).await {
                // Every txn was rejected (none applied): contention with
                // other waiters, not a failure; try again after a pause.
                Err(LockError::Store(Error::ConflictRetriesExhausted { .. })) => Attempt::Wait,
                other => other?,
            };
            match attempt {
                Attempt::Granted(handle) => return Ok(handle),
                Attempt::Cleaned => continue,
                Attempt::Requeue => {
                    *ticket = self.enqueue_waiting(key, ttl, wait, started).await?;
                    continue;
                }
                Attempt::Wait => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(LockError::Timeout {
                    key: key.to_owned(),
                    waited: now - started,
                });
            }
            if now >= ticket.renew_at && !self.renew_ticket(key, ticket, ttl).await? {
                *ticket = self.enqueue_waiting(key, ttl, wait, started).await?;
                continue;
            }
            refusals += 1;
            let until = (now + wait.pause(refusals))
                .min(deadline)
                .min(ticket.renew_at);
            wake.until(until).await;
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
        let record_key = self.record_key(key);
        let sent = Instant::now();
        let now = self.clock.now_millis();
        let token = mint_token();
        let keys = [record_key.clone()];
        loop {
            let answer = self
                .engine
                .decide::<Result<Option<Option<LockHandle>>, LockError>, LockError, _>(
                    &keys,
                    |view| {
                        let record = match Self::decode_record(view, &record_key) {
                            Ok(record) => record,
                            Err(e) => return Ok(Decision::Return(Err(e.into()))),
                        };
                        if record.holder.as_ref().is_some_and(|h| h.expires_ms > now) {
                            return Ok(Decision::Return(Ok(Some(None))));
                        }
                        let first = &record.queue[..record.queue.len().min(LOOKAHEAD)];
                        let dead = match self.dead_ahead(view, key, first, now) {
                            Err(e) => return Ok(Decision::Return(Err(e.into()))),
                            Ok(Err(unread)) => return Ok(Decision::Expand(unread)),
                            // A live waiter is in line: never jump the queue.
                            Ok(Ok(None)) => return Ok(Decision::Return(Ok(Some(None)))),
                            Ok(Ok(Some(dead))) => dead,
                        };
                        if record.queue.len() > first.len() {
                            return Ok(Decision::Commit {
                                mutations: self.cleanup(key, &record, &record_key, &dead),
                                then: Ok(None),
                            });
                        }
                        let (mutations, handle) =
                            self.grant(key, &record, &record_key, &dead, &token, ttl, now, sent);
                        Ok(Decision::Commit {
                            mutations,
                            then: Ok(Some(Some(handle))),
                        })
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
        let record_key = self.record_key(handle.key());
        let now = self.clock.now_millis();
        let keys = [record_key.clone()];
        let renewed = self
            .engine
            .decide::<Result<(), LockError>, LockError, _>(&keys, |view| {
                let record = match Self::decode_record(view, &record_key) {
                    Ok(record) => record,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if let Some(reason) = Self::why_not_held(handle, &record, now) {
                    return Ok(Decision::Return(Err(Self::lost(handle, reason))));
                }
                let current = record.holder.as_ref().map_or(0, |h| h.expires_ms);
                let renewed = FairRecord {
                    holder: Some(Holder {
                        token: handle.token().to_owned(),
                        // A clock stepping back must not shorten a granted lease.
                        expires_ms: now.saturating_add(millis(handle.ttl())).max(current),
                    }),
                    nonce: mint_token(),
                    ..record
                };
                Ok(Decision::Commit {
                    mutations: vec![Mutation::put(record_key.clone(), encode(&renewed))],
                    then: Ok(()),
                })
            })
            .await?;
        if let Err(error) = &renewed {
            telemetry::lock_lost_if(error);
        }
        renewed
    }

    #[tracing::instrument(name = "lock.release", skip_all, fields(
        key = %handle.key(), store = self.engine.backend().store_name(), fence = handle.fence(),
    ))]
    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        validate_lock_input(handle.key(), handle.ttl())?;
        let record_key = self.record_key(handle.key());
        let now = self.clock.now_millis();
        let keys = [record_key.clone()];
        self.engine
            .decide::<Result<(), LockError>, LockError, _>(&keys, |view| {
                let record = match Self::decode_record(view, &record_key) {
                    Ok(record) => record,
                    Err(e) => return Ok(Decision::Return(Err(e.into()))),
                };
                if let Some(reason) = Self::why_not_held(&handle, &record, now) {
                    return Ok(Decision::Return(Err(Self::lost(&handle, reason))));
                }
                // The record stays: its fence and ticket counter must survive.
                let released = FairRecord {
                    holder: None,
                    nonce: mint_token(),
                    ..record
                };
                Ok(Decision::Commit {
                    mutations: vec![Mutation::put(record_key.clone(), encode(&released))],
                    then: Ok(()),
                })
            })
            .await?
    }

    async fn watch_key(&self, key: &str) -> Wake {
        Wake::watch(self.engine.backend().as_ref(), &self.watch_prefix(key)).await
    }

    /// Wait in line: watch, take a ticket, then try whenever something
    /// changed (or the backoff of `wait` passed), renewing the ticket every
    /// third of `ttl`. On timeout or error the ticket is removed (if that
    /// fails too, it expires within `ttl`).
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
        // Watch before the first read: a release after it wakes this waiter.
        let mut wake = self.watch_key(key).await;
        let mut ticket = self.enqueue_waiting(key, ttl, wait, started).await?;
        match self
            .wait_in_line(key, ttl, wait, &mut ticket, started, &mut wake)
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
            lock.enqueue("k", short).await.unwrap();
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
