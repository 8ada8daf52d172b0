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
//!   written by the waiter's renewals (from a third of the TTL on) and by
//!   the hand-over that gives it the lock, and the key its watch listens to.
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
//! for), marks it served and writes its ticket key, which wakes exactly
//! that waiter (it watched its ticket key before joining); the waiter only
//! reads to learn it holds the lock. A write, not a removal: a waiter
//! handed the lock before its first renewal has no ticket record, and a
//! store need not report a delete of a key that is not there (etcd after a
//! reclaim deletes for real: a delete of nothing is no event). That ticket
//! is removed by the next write that changes the holder. Dead waiters
//! ahead of it (their lease ran out: the waiter died, or paused past its
//! lease) are skipped in the same txn, at most 16 per txn: with
//! more, the release skips them in txns of their own first, still holding
//! the lock, so the lock reaches the first live waiter however many dead
//! ones precede it. When the holder dies instead, the first live waiter
//! takes the lock once the holder's lease has run out, in a txn asserting
//! both records.
//!
//! A waiter that gives up (timeout, error) leaves the line, or hands the
//! lock on if it was handed the lock meanwhile; one that is cancelled or
//! dies blocks the line until its lease runs out, never longer (the lock
//! may be handed to it just before: then until the lease of that grant
//! runs out). Ticket keys are deleted when their waiter leaves (a ticket a
//! hand-over wrote: when the holder changes again); like every deleted key
//! they leave a store tombstone (see docs/shapes.md on
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
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use coord_backend::Backend;
use tokio::time::Instant;

use super::{validate_lock_input, Lock, LockError, LockHandle, WaitOptions};
use crate::cas::record::time_at;
use crate::cas::{record_options, whole_millis, CasStats, Decision, Record, RecordSpace};
use crate::wake::Wake;
use crate::{mint_token, telemetry};

mod records;
mod waiter;

use records::*;

/// How many tickets ahead one decision reads at most. More dead tickets
/// than this ahead are removed in batches first (so one txn never names
/// more keys than a store accepts).
const LOOKAHEAD: usize = 16;

record_options! {
    /// Options of a [`FairLock`].
    pub struct FairLockOptions, prefix "fairlock/" {}
}

/// A fair (FIFO) [`Lock`] over any [`Backend`] (see the [module docs](self)).
///
/// Use [`LockExt::lock`](super::LockExt::lock) (or [`Lock::wait_lock`]) to
/// wait in line; [`Lock::try_lock`] only succeeds when nobody waits.
/// [`super::LockGuard`] works with it like with any `Lock`.
#[derive(Clone, Debug)]
pub struct FairLock {
    space: RecordSpace,
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

impl FairLock {
    /// A fair lock over `backend` with default options (system clock, prefix `fairlock/`).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, FairLockOptions::default())
    }

    /// A fair lock over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: FairLockOptions) -> Self {
        FairLock {
            space: options.space(backend),
        }
    }

    /// Store calls made so far (for tests and benchmarks).
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    /// The prefix of this lock's records (`fairlock/` by default).
    pub fn key_prefix(&self) -> &str {
        self.space.prefix()
    }

    /// What the store holds for `key`: the holder's lease and the line, by
    /// two reads (the lock and line records, then the tickets): for
    /// inspection only, never a basis for a decision. `Ok(None)`: never used.
    pub async fn status(&self, key: &str) -> Result<Option<FairLockStatus>, LockError> {
        validate_lock_input(key, Duration::from_millis(1))?;
        let Some((state, line)) = self.read_both(key).await? else {
            return Ok(None);
        };
        let now = self.space.now_millis();
        let mut tickets_status = Vec::new();
        let limit = self.space.keys_per_call().max(1);
        for chunk in waiting(&line, state.served).chunks(limit) {
            let keys: Vec<String> = chunk.iter().map(|w| self.ticket_key(key, w.seq)).collect();
            let tickets = self.space.engine().snapshot(&keys).await?;
            for (w, entry) in chunk.iter().zip(tickets) {
                let ticket = TicketRecord::from_value(&entry.key, entry.value.as_deref())?;
                // The lease in the line until the first renewal writes the ticket.
                let expires_ms = ticket
                    .filter(|t| t.token == w.token)
                    .map_or(w.expires_ms, |t| t.expires_ms.max(w.expires_ms));
                tickets_status.push(TicketStatus {
                    seq: w.seq,
                    expires_at: Some(time_at(expires_ms)),
                    live: expires_ms > now,
                });
            }
        }
        Ok(Some(FairLockStatus {
            key: key.to_owned(),
            fence: state.fence,
            expires_at: state.holder.as_ref().map(|h| time_at(h.expires_ms)),
            live: state.holder.as_ref().is_some_and(|h| h.is_live(now)),
            waiting: tickets_status,
        }))
    }
}

#[async_trait]
impl Lock for FairLock {
    #[tracing::instrument(name = "lock.try_lock", skip_all, fields(
        key = %key, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        validate_lock_input(key, ttl)?;
        let keys = self.both_keys(key);
        let sent = Instant::now();
        let now = self.space.now_millis();
        let token = mint_token();
        let newcomer = Newcomer {
            token: &token,
            ttl,
            now,
            sent,
        };
        loop {
            let answer = self
                .space
                .engine()
                .decide::<_, LockError, _>(&keys, |view| {
                    let (state, line) = self.decode(view, key)?;
                    let answer = |handle: Option<LockHandle>| handle.map(Some);
                    match self.grant_if_free(view, key, (&state, &line), &newcomer, answer)? {
                        Ok(decision) => Ok(decision),
                        Err(_) => Ok(Decision::Return(Some(None))),
                    }
                })
                .await?;
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
        key = %handle.key(), store = self.space.store_name(), fence = handle.fence(),
    ))]
    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        validate_lock_input(handle.key(), handle.ttl())?;
        let state_key = self.state_key(handle.key());
        let now = self.space.now_millis();
        let keys = [state_key.clone()];
        let renewed = self
            .space
            .engine()
            .decide::<_, LockError, _>(&keys, |view| {
                let state: LockState = parse(&state_key, view.value(&state_key))?;
                if let Some(reason) = Self::why_not_held(handle, &state, now) {
                    return Err(LockError::lost(handle.key(), reason));
                }
                let mut renewed = state;
                if let Some(holder) = renewed.holder.as_mut() {
                    holder.extend(now.saturating_add(whole_millis(handle.ttl())));
                }
                Ok(Decision::Commit {
                    mutations: vec![renewed.put(&state_key)],
                    then: (),
                })
            })
            .await;
        crate::lock::renewed(renewed)
    }

    /// Release, handing the lock to the first live waiter in the same txn
    /// (the next fence, the lease it asked for): the waiter is woken by the
    /// write of its ticket and only reads to learn it holds the lock. More
    /// dead waiters ahead of it than one txn skips: they leave the line in
    /// txns of their own first (the lock still held), then the hand-over.
    #[tracing::instrument(name = "lock.release", skip_all, fields(
        key = %handle.key(), store = self.space.store_name(), fence = handle.fence(),
    ))]
    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        validate_lock_input(handle.key(), handle.ttl())?;
        let keys = self.both_keys(handle.key());
        let now = self.space.now_millis();
        loop {
            let handed = self
                .space
                .engine()
                .decide::<_, LockError, _>(&keys, |view| {
                    let (state, line) = self.decode(view, handle.key())?;
                    if let Some(reason) = Self::why_not_held(&handle, &state, now) {
                        return Err(LockError::lost(handle.key(), reason));
                    }
                    // The lock record stays: its fence must survive.
                    Ok(self.hand_over(view, handle.key(), &state, &line, now)?)
                })
                .await?;
            if handed {
                return Ok(());
            }
        }
    }

    async fn watch_key(&self, key: &str) -> Wake {
        // Every record of the key: the lock, the line and the tickets.
        self.space.watch(&format!("{key}/")).await
    }

    /// Wait in line: watch the ticket, take it, then sleep until the holder
    /// hands the lock over (its txn writes the ticket, which wakes this
    /// waiter), the holder's lease runs out, or the fallback poll; renew
    /// the ticket every third of `ttl`. On timeout or error the ticket is
    /// removed (if that fails too, it expires within `ttl`).
    #[tracing::instrument(name = "lock.wait", skip_all, fields(
        key = %key, store = self.space.store_name(),
    ))]
    async fn wait_lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<LockHandle, LockError> {
        validate_lock_input(key, ttl)?;
        let started = Instant::now();
        let mut line = match self.join_line(key, ttl, wait, started).await? {
            Ok(handle) => {
                telemetry::lock_acquired();
                return Ok(handle);
            }
            Err(line) => line,
        };
        match self.wait_in_line(key, ttl, wait, started, &mut line).await {
            Ok(handle) => {
                telemetry::lock_acquired();
                Ok(handle)
            }
            Err(error) => {
                if let Err(cleanup) = self.abandon(key, &line.ticket).await {
                    tracing::debug!(%cleanup, "could not remove a ticket: it expires by itself");
                }
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::waiter::Attempt;
    use super::*;
    use crate::lock::LockExt;
    use coord_backend::ManualClock;
    use coord_memory::SingleProcessMemoryBackend;

    /// A fair lock over a fresh store, and the store and clock it uses.
    fn fair() -> (Arc<dyn Backend>, Arc<ManualClock>, FairLock) {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("fl").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000));
        let lock = FairLock::with_options(
            backend.clone(),
            FairLockOptions::default().with_clock(clock.clone()),
        );
        (backend, clock, lock)
    }

    /// Check that no ticket is left in key `k`'s line.
    async fn assert_no_tickets(backend: &Arc<dyn Backend>) {
        assert_eq!(
            backend.keys("fairlock/k/q/").await.unwrap(),
            Vec::<String>::new()
        );
    }

    #[tokio::test]
    async fn try_lock_and_release_keep_the_fence_and_leave_no_tickets() {
        let (backend, _, lock) = fair();
        let ttl = Duration::from_secs(10);
        let h = lock.try_lock("k", ttl).await.unwrap().unwrap();
        assert_eq!(h.fence(), 1);
        assert!(lock.try_lock("k", ttl).await.unwrap().is_none());
        lock.release(h).await.unwrap();
        let h = lock.lock("k", ttl, Duration::from_secs(1)).await.unwrap();
        assert_eq!(h.fence(), 2);
        lock.release(h).await.unwrap();
        assert_no_tickets(&backend).await;
        let status = lock.status("k").await.unwrap().unwrap();
        assert_eq!(
            (status.fence, status.live, status.waiting.len()),
            (2, false, 0)
        );
    }

    /// A waiter whose join lost one race (it took the ticket after the one
    /// its cache predicted) is woken by the watch it set on that next
    /// ticket before joining: it reads once, when handed the lock. With a
    /// fallback poll longer than the timeout, a lost wake-up times out.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiter_one_ticket_behind_its_guess_is_woken_without_a_second_read() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("fl").unwrap());
        let (holder, first, late) = (
            FairLock::new(backend.clone()),
            FairLock::new(backend.clone()),
            FairLock::new(backend.clone()),
        );
        let ttl = Duration::from_secs(30);
        let no_poll = WaitOptions::with_timeout(Duration::from_secs(20))
            .with_backoff(Duration::from_secs(60), Duration::from_secs(60));
        let held = holder.try_lock("k", ttl).await.unwrap().unwrap();
        // `late` remembers the line while it is empty: it predicts ticket 1.
        assert!(late.status("k").await.unwrap().unwrap().waiting.is_empty());
        let first_waits = {
            let (first, no_poll) = (first.clone(), no_poll.clone());
            tokio::spawn(async move { first.wait_lock("k", ttl, &no_poll).await })
        };
        while holder
            .status("k")
            .await
            .unwrap()
            .unwrap()
            .waiting
            .is_empty()
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let reads_before = late.stats().snapshots;
        let late_waits = {
            let (late, no_poll) = (late.clone(), no_poll.clone());
            tokio::spawn(async move { late.wait_lock("k", ttl, &no_poll).await })
        };
        while holder.status("k").await.unwrap().unwrap().waiting.len() < 2 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        holder.release(held).await.unwrap();
        let first_held = first_waits.await.unwrap().unwrap();
        first.release(first_held).await.unwrap();
        let late_held = late_waits.await.unwrap().unwrap();
        assert_eq!(late_held.fence(), 3);
        assert_eq!(
            late.stats().snapshots - reads_before,
            1,
            "one read: the one after the hand-over woke it"
        );
        late.release(late_held).await.unwrap();
    }

    /// A hand-over writes the ticket of the waiter it hands the lock to
    /// (here one whose ticket record was never written: its first renewal
    /// is a third of its lease away): a write wakes a watch on every store,
    /// a delete of a key that is not there need not (etcd after a reclaim).
    /// The next change of holder, by release or by expiry, removes it.
    #[tokio::test]
    async fn a_hand_over_writes_the_handed_ticket_and_the_next_holder_removes_it() {
        let (backend, clock, lock) = fair();
        let ttl = Duration::from_secs(60);
        let ticket_value = |seq| {
            let backend = backend.clone();
            let key = lock.ticket_key("k", seq);
            async move { backend.snapshot(&[key]).await.unwrap()[0].value.clone() }
        };
        for ends_by in ["release", "expiry"] {
            let held = lock.try_lock("k", ttl).await.unwrap().unwrap();
            let ticket = lock.join_slow("k", ttl).await.unwrap();
            assert_eq!(ticket_value(ticket.seq).await, None, "never written yet");
            lock.release(held).await.unwrap();
            assert!(
                ticket_value(ticket.seq).await.is_some(),
                "the hand-over writes the ticket"
            );
            let Attempt::Granted(handed) = lock.look("k", &ticket, ttl).await.unwrap() else {
                panic!("the hand-over gave the lock to the waiter");
            };
            match ends_by {
                "release" => lock.release(handed).await.unwrap(),
                _ => {
                    clock.advance(ttl + Duration::from_millis(1));
                    let next = lock.try_lock("k", ttl).await.unwrap().unwrap();
                    assert_no_tickets(&backend).await;
                    lock.release(next).await.unwrap();
                }
            }
            assert_no_tickets(&backend).await;
        }
    }

    /// A release with more dead waiters ahead of a live one than one
    /// decision reads skips them in txns of at most [`LOOKAHEAD`] tickets
    /// (the lock still held), then hands the lock to the live waiter in the
    /// same kind of txn: the write of its ticket wakes the watch it set
    /// before joining, at once (no poll).
    #[tokio::test]
    async fn a_release_behind_more_dead_than_one_decision_reads_wakes_the_live_waiter() {
        let (backend, clock, lock) = fair();
        let (short, long) = (Duration::from_millis(100), Duration::from_secs(60));
        let held = lock.try_lock("k", long).await.unwrap().unwrap();
        let dead = LOOKAHEAD * 2 + 3;
        for _ in 0..dead {
            lock.join_slow("k", short).await.unwrap();
        }
        clock.advance(short + Duration::from_millis(1));
        let live = lock.join_slow("k", long).await.unwrap();
        let changes = backend.changes().expect("the memory store notifies");
        let mut watch = changes
            .watch(&lock.ticket_key("k", live.seq))
            .await
            .unwrap();
        let before = lock.stats();
        lock.release(held).await.unwrap();
        let after = lock.stats();
        assert_eq!(
            (
                after.txns - before.txns,
                after.rejections - before.rejections
            ),
            (dead.div_ceil(LOOKAHEAD) as u64, 0),
            "one txn per batch of dead tickets, the last one handing over"
        );
        // Already published: the first poll of `changed` is ready.
        tokio::time::timeout(Duration::ZERO, watch.changed())
            .await
            .expect("the hand-over woke the live waiter's watch")
            .unwrap();
        let Attempt::Granted(handle) = lock.look("k", &live, long).await.unwrap() else {
            panic!("the release handed the lock to the live waiter");
        };
        assert_eq!(handle.fence(), 2);
        assert!(lock.status("k").await.unwrap().unwrap().waiting.is_empty());
        lock.release(handle).await.unwrap();
        assert_no_tickets(&backend).await;
    }

    #[tokio::test]
    async fn more_dead_tickets_than_one_decision_reads_are_cleared_in_batches() {
        let (backend, clock, lock) = fair();
        let short = Duration::from_millis(100);
        for _ in 0..(LOOKAHEAD * 2 + 3) {
            lock.join_slow("k", short).await.unwrap();
        }
        assert!(lock.try_lock("k", short).await.unwrap().is_none());
        clock.advance(Duration::from_millis(101));
        let h = lock.try_lock("k", short).await.unwrap().unwrap();
        assert_eq!(h.fence(), 1);
        assert_no_tickets(&backend).await;
    }
}
