//! A waiter's side of a fair lock: joining the line (watch first), looking
//! when woken, taking the lock when it is free and this waiter is first,
//! renewing its ticket while it waits, leaving the line when it gives up.

use std::time::Duration;

use coord_backend::Error;
use tokio::time::Instant;

use super::records::*;
use super::FairLock;
use crate::cas::{whole_millis, Decision, Nonce, Record};
use crate::lock::{LockError, LockHandle, WaitOptions};
use crate::mint_token;
use crate::wake::{later, Wake, FOREVER};

/// Tries of one round of joining through the line record alone: the first
/// may carry a view gone stale during a pause, the others the values their
/// rejection returned.
const JOIN_TRIES: u32 = 3;

/// A ticket this client holds while it waits.
pub(super) struct Ticket {
    pub(super) seq: u64,
    pub(super) token: String,
    /// When to renew the ticket's lease (local monotonic time).
    pub(super) renew_at: Instant,
}

/// What one step of a waiter found.
pub(super) enum Attempt {
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
#[derive(Clone, Copy)]
pub(super) enum Next {
    /// Read the lock and line records.
    Look,
    /// Decide in a txn (the lock looked free with this waiter first).
    Try,
    /// Sleep until a wake-up, the fallback poll, or the holder's lease end.
    Wait(Option<u64>),
}

/// A waiter in line: its ticket, the watch on it, and its next step.
pub(super) struct InLine {
    pub(super) ticket: Ticket,
    wake: Wake,
    next: Next,
}

/// What joining the line gave.
pub(super) enum Joined {
    /// Nobody held the lock and nobody live waited: it is granted at once.
    Granted(LockHandle),
    /// In line, and what to do first.
    Queued(Ticket, Next),
    /// Dead waiters were removed from the line: decide again.
    Cleaned,
}

impl FairLock {
    /// The handle of a grant this waiter learns by reading the lock record
    /// (handed over by a releaser): its lease is counted back from the end
    /// the record gives, so it never outlasts the store's. `None`: the end
    /// cannot be expressed in local time (then the lease simply runs out).
    pub(super) fn handed(
        key: &str,
        holder: &Holder,
        fence: u64,
        ttl: Duration,
        now: u64,
        sent: Instant,
    ) -> Option<LockHandle> {
        // In local time a TTL counts at most FOREVER (a saturated lease of
        // Duration::MAX would otherwise never be expressible).
        let ttl_local = ttl.min(FOREVER);
        let left = Duration::from_millis(holder.expires_ms.saturating_sub(now)).min(ttl_local);
        let requested = sent.checked_sub(ttl_local - left)?;
        Some(
            LockHandle::at(key, &holder.token, fence, ttl, holder.expires_ms)
                .requested_at(requested),
        )
    }

    /// What the records say to the waiter holding `ticket`.
    pub(super) fn judge(
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
        if let Some(h) = state.holder.as_ref().filter(|h| h.is_live(now)) {
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
    pub(super) fn predicted_seq(&self, key: &str) -> u64 {
        let line_key = self.line_key(key);
        self.space
            .engine()
            .cached(&line_key)
            .and_then(|entry| parse::<LineState>(&line_key, entry.value.as_deref()).ok())
            .map_or(1, |line| line.next_seq.max(1))
    }

    /// `line` with a new waiter at its end. Its ticket record is only
    /// written by its first renewal: until then the lease in the line says
    /// it is live, and a record written now would wake its own watch.
    pub(super) fn joined(
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
            ttl_ms: whole_millis(ttl),
            expires_ms,
        });
        (
            LineState {
                next_seq: seq + 1,
                queue,
                nonce: Nonce::default(),
            },
            Ticket {
                seq,
                token: token.to_owned(),
                renew_at: later(sent, ttl / 3),
            },
        )
    }

    /// Join the line in one decision over both records: the lock itself
    /// when it is free and nobody live waits, else a ticket. Two rejected
    /// txns (the holder's writes raced it) and it gives up, so that the
    /// caller joins through the line record alone.
    pub(super) async fn join_fast(&self, key: &str, ttl: Duration) -> Result<Joined, LockError> {
        let keys = self.both_keys(key);
        let offer = self.space.offer(ttl);
        let newcomer = Newcomer {
            token: &offer.token,
            ttl,
            now: offer.now,
            sent: offer.sent,
        };
        self.space
            .engine()
            .with_retries(2, Duration::ZERO)
            .decide::<_, LockError, _>(&keys, |view| {
                let (state, line) = self.decode(view, key)?;
                let grant = self.grant_if_free(view, key, (&state, &line), &newcomer, |handle| {
                    handle.map_or(Joined::Cleaned, Joined::Granted)
                });
                let held = match grant? {
                    Ok(decision) => return Ok(decision),
                    Err(held) => held,
                };
                let line = without(&line, state.served, &[]);
                let (line, ticket) =
                    Self::joined(&line, &offer.token, ttl, offer.expires_ms, offer.sent);
                let writes = Writes {
                    line: Some(line),
                    ..Writes::default()
                };
                Ok(self.write(view, key, writes, Joined::Queued(ticket, Next::Wait(held))))
            })
            .await
    }

    /// Join the line through the line record alone (it never collides with
    /// the holder's writes, only with other waiters joining); then read the
    /// lock, which may have been freed meanwhile.
    pub(super) async fn join_slow(&self, key: &str, ttl: Duration) -> Result<Ticket, LockError> {
        let line_key = self.line_key(key);
        let token = mint_token();
        let sent = Instant::now();
        let expires_ms = self.space.now_millis().saturating_add(whole_millis(ttl));
        // No pause between the tries of a round: each carries the values
        // the rejection before it returned, so it loses only to a join
        // landing in between; after a pause the holder's rejoin (fresh
        // cache, one round trip) would win every race.
        self.space
            .engine()
            .with_retries(JOIN_TRIES, Duration::ZERO)
            .decide::<_, LockError, _>(std::slice::from_ref(&line_key), |view| {
                let line: LineState = parse(&line_key, view.value(&line_key))?;
                let (line, ticket) = Self::joined(&line, &token, ttl, expires_ms, sent);
                let writes = Writes {
                    line: Some(line),
                    ..Writes::default()
                };
                Ok(self.write(view, key, writes, ticket))
            })
            .await
    }

    /// Join the line: the fast way, else the slow one, in rounds of
    /// [`JOIN_TRIES`] tries without a pause. A round whose every try lost
    /// (other waiters joining; none applied) is followed by a jittered pause
    /// over a window that starts at the round's own length and doubles each
    /// round, up to the longest pause of `wait`, until the deadline, then
    /// [`LockError::Timeout`]. Only one joiner wins each try, so a crowd
    /// arriving at once (a fleet starting) would otherwise cost one rejected
    /// txn per joiner per winner: the pauses spread it out.
    pub(super) async fn join(
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
        let mut rounds = 0u32;
        loop {
            let round_started = Instant::now();
            match self.join_slow(key, ttl).await {
                Err(LockError::Store(Error::ConflictRetriesExhausted { .. })) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(LockError::Timeout {
                            key: key.to_owned(),
                            waited: now - started,
                        });
                    }
                    // A uniform draw over a window that starts at what a
                    // round costs on this store and doubles each round: the
                    // crowd spreads until about one joiner arrives per try.
                    let window = (now - round_started)
                        .saturating_mul(1 << rounds.min(16))
                        .min(wait.pause(u32::MAX));
                    rounds += 1;
                    let pause = window.mul_f64(crate::jitter::unit());
                    tokio::time::sleep_until(later(now, pause).min(deadline)).await;
                }
                other => return other.map(|ticket| Joined::Queued(ticket, Next::Look)),
            }
        }
    }

    /// Watch, then join the line. The watches are on the ticket the cache
    /// predicts and the one after it (when another waiter's join lands
    /// first), set up before joining so that a hand-over right after it
    /// wakes this waiter; the unused one is dropped at once (a ticket key
    /// is written only by its own waiter's renewals, its hand-over and its
    /// removal). A
    /// guess wrong by more costs one more watch and one read.
    pub(super) async fn join_line(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        started: Instant,
    ) -> Result<Result<LockHandle, InLine>, LockError> {
        let backend = self.space.engine().backend().as_ref();
        loop {
            let predicted = self.predicted_seq(key);
            let wake = Wake::watch(backend, &self.ticket_key(key, predicted)).await;
            let spare =
                Wake::watch(backend, &self.ticket_key(key, predicted.saturating_add(1))).await;
            match self.join(key, ttl, wait, started).await? {
                Joined::Granted(handle) => return Ok(Ok(handle)),
                Joined::Cleaned => continue,
                Joined::Queued(ticket, next) if ticket.seq == predicted => {
                    return Ok(Err(InLine { ticket, wake, next }))
                }
                Joined::Queued(ticket, next) if ticket.seq == predicted.saturating_add(1) => {
                    return Ok(Err(InLine {
                        ticket,
                        wake: spare,
                        next,
                    }))
                }
                Joined::Queued(ticket, _) => {
                    drop((wake, spare));
                    let wake = Wake::watch(backend, &self.ticket_key(key, ticket.seq)).await;
                    return Ok(Err(InLine {
                        ticket,
                        wake,
                        next: Next::Look,
                    }));
                }
            }
        }
    }

    /// Read both records and judge them for the waiter holding `ticket`: a
    /// read, never a txn, so waiters do not collide with the writers.
    pub(super) async fn look(
        &self,
        key: &str,
        ticket: &Ticket,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        let sent = Instant::now();
        let now = self.space.now_millis();
        let (state, line) = self.read_both(key).await?.unwrap_or_default();
        Ok(Self::judge(key, (&state, &line), ticket, ttl, now, sent))
    }

    /// The decision of a waiter that found the lock free: take it when it is
    /// the first live waiter (removing the dead ones ahead).
    pub(super) async fn attempt(
        &self,
        key: &str,
        ticket: &Ticket,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        let keys = self.both_keys(key);
        let sent = Instant::now();
        let now = self.space.now_millis();
        self.space
            .engine()
            .decide::<_, LockError, _>(&keys, |view| {
                let (state, line) = self.decode(view, key)?;
                match Self::judge(key, (&state, &line), ticket, ttl, now, sent) {
                    Attempt::Try => {}
                    other => return Ok(Decision::Return(other)),
                }
                let queue = waiting(&line, state.served);
                let head = match self.head(view, key, queue, now)? {
                    Err(unread) => return Ok(Decision::Expand(unread)),
                    Ok(head) => head,
                };
                Ok(match head {
                    Head::Live { index, mut dead } if queue[index].seq == ticket.seq => {
                        let expires_ms = now.saturating_add(whole_millis(ttl));
                        let retired = state.ticket;
                        let state = granted(
                            &state,
                            Holder {
                                token: ticket.token.clone(),
                                expires_ms,
                            },
                            ticket.seq,
                            None,
                        );
                        let handle =
                            LockHandle::at(key, &ticket.token, state.fence, ttl, expires_ms)
                                .requested_at(sent);
                        dead.push(ticket.seq);
                        let writes = Writes {
                            line: Self::prune(&line, state.served),
                            state: Some(state),
                            gone: &dead,
                            handed: None,
                            retired,
                        };
                        self.write(view, key, writes, Attempt::Granted(handle))
                    }
                    Head::Live { dead, .. } | Head::NoneLive { dead, .. } if !dead.is_empty() => {
                        self.skip_dead(view, key, &state, &dead, Attempt::Cleaned)
                    }
                    // Someone live is ahead (it takes the lock), or this
                    // waiter is beyond the first waiters: wait and look again.
                    _ => Decision::Return(Attempt::Wait(None)),
                })
            })
            .await
    }

    /// Extend the lease of a waiting ticket (writing its record). Asserts
    /// the lock and line records too, so a ticket written by a hand-over or
    /// removed as dead is never overwritten. `Ok(false)`: this waiter is no longer
    /// waiting (the lock was handed to it, or it left the line): look.
    pub(super) async fn renew_ticket(
        &self,
        key: &str,
        ticket: &mut Ticket,
        ttl: Duration,
    ) -> Result<bool, LockError> {
        let my_key = self.ticket_key(key, ticket.seq);
        let [state_key, line_key] = self.both_keys(key);
        let keys = [state_key, line_key, my_key.clone()];
        let sent = Instant::now();
        let now = self.space.now_millis();
        let expires_ms = now.saturating_add(whole_millis(ttl));
        let renewed = self
            .space
            .engine()
            .with_retries(self.space.engine().options().max_attempts, Duration::ZERO)
            .decide::<_, LockError, _>(&keys, |view| {
                let (state, line) = self.decode(view, key)?;
                match Self::judge(key, (&state, &line), ticket, ttl, now, sent) {
                    Attempt::Granted(_) | Attempt::Requeue => return Ok(Decision::Return(false)),
                    _ => {}
                }
                let current = TicketRecord::read(view, &my_key)?.map_or(0, |t| t.expires_ms);
                let mut renewed = TicketRecord {
                    token: ticket.token.clone(),
                    expires_ms: expires_ms.max(current),
                    nonce: Nonce::default(),
                };
                Ok(Decision::commit(vec![renewed.put(&my_key)], true))
            })
            .await?;
        ticket.renew_at = later(sent, ttl / 3);
        Ok(renewed)
    }

    /// Leave the line: remove the ticket if it is still there; if the lock
    /// was handed to this waiter meanwhile, hand it on (in several txns
    /// when many dead waiters are ahead, as a release does).
    pub(super) async fn abandon(&self, key: &str, ticket: &Ticket) -> Result<(), LockError> {
        let keys = self.both_keys(key);
        let now = self.space.now_millis();
        loop {
            let done = self
                .space
                .engine()
                .decide::<_, LockError, _>(&keys, |view| {
                    let (state, line) = self.decode(view, key)?;
                    if state
                        .holder
                        .as_ref()
                        .is_some_and(|h| h.token == ticket.token)
                    {
                        return Ok(self.hand_over(view, key, &state, &line, now)?);
                    }
                    if !waiting(&line, state.served)
                        .iter()
                        .any(|w| w.seq == ticket.seq)
                    {
                        return Ok(Decision::Return(true));
                    }
                    let gone = [ticket.seq];
                    let writes = Writes {
                        line: Some(without(&line, state.served, &gone)),
                        gone: &gone,
                        ..Writes::default()
                    };
                    Ok(self.write(view, key, writes, true))
                })
                .await?;
            if done {
                return Ok(());
            }
        }
    }

    /// The local instant at which `expires_ms` (by the lock's clock) passes.
    pub(super) fn instant_of(&self, expires_ms: u64) -> Instant {
        let left = expires_ms.saturating_sub(self.space.now_millis());
        later(
            Instant::now(),
            Duration::from_millis(left.saturating_add(1)),
        )
    }

    /// Wait in line until the lock is this waiter's (see [`FairLock::wait_lock`]).
    pub(super) async fn wait_in_line(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        started: Instant,
        line: &mut InLine,
    ) -> Result<LockHandle, LockError> {
        let deadline = wait.deadline_from(started);
        let mut refusals = 0u32;
        loop {
            let InLine { ticket, wake, next } = line;
            let attempt = match *next {
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
                        *next = Next::Look;
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
                    let mut until = later(now, poll).min(deadline).min(ticket.renew_at);
                    if let Some(expires_ms) = held {
                        until = until.min(self.instant_of(expires_ms));
                    }
                    wake.until(until).await?;
                    *next = Next::Look;
                    continue;
                }
            };
            let step = match attempt {
                Attempt::Granted(handle) => return Ok(handle),
                Attempt::Wait(held) => Some(Next::Wait(held)),
                Attempt::Try | Attempt::Cleaned => Some(Next::Try),
                Attempt::Requeue => None,
            };
            match step {
                Some(step) => *next = step,
                None => match self.join_line(key, ttl, wait, started).await? {
                    Ok(handle) => return Ok(handle),
                    Err(fresh) => *line = fresh,
                },
            }
        }
    }
}
