//! The records of a fair lock, and the decisions over them that both a
//! release and a waiter make: who is first in line, the writes of a grant,
//! a hand-over, skipping dead waiters. Pure functions of a view: the
//! engine calls them, possibly several times per decision.

use std::time::Duration;

use coord_backend::{Error, Mutation};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::{FairLock, LOOKAHEAD};
use crate::cas::{record_kind, whole_millis, Decision, LeaseRecord, Nonce, Record, View};
use crate::lock::{LockHandle, LostReason};

/// The lock record, `<prefix><key>/m`: the fence, the holder, and how far
/// the line has been served. Written by grants, renewals and releases,
/// never by a waiter taking its place in line.
#[derive(Serialize, Deserialize, Default)]
pub(super) struct LockState {
    /// The fence of the latest grant (0 = never granted).
    pub(super) fence: u64,
    /// The current holder, if any (its lease may have expired).
    pub(super) holder: Option<Holder>,
    /// Every ticket numbered up to this one has left the line (granted, or
    /// skipped as dead): a grant moves the line on without writing it.
    pub(super) served: u64,
    /// The ticket a hand-over wrote for the holder (the write is what wakes
    /// that waiter), removed by the next write that changes the holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) ticket: Option<u64>,
    /// Fresh per write (see the CAS engine on indeterminate txns).
    pub(super) nonce: Nonce,
}

/// The line record, `<prefix><key>/n`: the ticket counter and the waiters.
/// Written by waiters joining (and leaving early), rarely by a holder: so
/// a waiter joining the line only races other waiters joining it, never a
/// holder's quick release and retake (which would starve it).
#[derive(Serialize, Deserialize, Default)]
pub(super) struct LineState {
    /// The number the next ticket gets (numbers are never reused).
    pub(super) next_seq: u64,
    /// The waiters, in order; those numbered up to the lock record's
    /// `served` have left (pruned by the next write that knows it).
    pub(super) queue: Vec<Waiter>,
    /// Fresh per write.
    pub(super) nonce: Nonce,
}

/// One waiter in line: what a releaser needs to hand it the lock.
#[derive(Serialize, Deserialize, Clone)]
pub(super) struct Waiter {
    pub(super) seq: u64,
    pub(super) token: String,
    /// The lease the waiter asked for: the length of its grant.
    pub(super) ttl_ms: u64,
    /// Its ticket's lease when it was taken. Until then the waiter is live
    /// without reading its ticket: a ticket's lease only grows while the
    /// ticket exists, and a removed ticket leaves the line in the same txn.
    pub(super) expires_ms: u64,
}

/// The holder's lease (the same record as every lock's).
pub(super) type Holder = LeaseRecord;

/// One waiter's ticket, `<prefix><key>/q/<seq>`: written by its waiter's
/// renewals while it waits, and by the hand-over that gives it the lock
/// (with lease 0: it left the line).
#[derive(Serialize, Deserialize)]
pub(super) struct TicketRecord {
    pub(super) token: String,
    pub(super) expires_ms: u64,
    pub(super) nonce: Nonce,
}

record_kind!(LockState, "a fair lock record");
record_kind!(LineState, "a fair lock line");
record_kind!(TicketRecord, "a fair lock ticket");

impl std::fmt::Debug for LockState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockState")
            .field("fence", &self.fence)
            .field("held", &self.holder.is_some())
            .field("served", &self.served)
            .field("ticket", &self.ticket)
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

/// What a decision found at the head of the line.
pub(super) enum Head {
    /// `queue[index]` is the first live waiter; `dead` are the ones ahead of it.
    Live { index: usize, dead: Vec<u64> },
    /// No live waiter among the first [`LOOKAHEAD`]: `dead` were judged
    /// dead; `complete`: that was the whole line.
    NoneLive { dead: Vec<u64>, complete: bool },
}

/// The record in `value` read from `key`, or a fresh one when it is missing.
pub(super) fn parse<T: Record + Default>(key: &str, value: Option<&[u8]>) -> Result<T, Error> {
    Ok(T::from_value(key, value)?.unwrap_or_default())
}

/// The waiters still in line: those after `served`.
pub(super) fn waiting(line: &LineState, served: u64) -> &[Waiter] {
    let first = line.queue.partition_point(|w| w.seq <= served);
    &line.queue[first..]
}

/// The line to write: served waiters pruned, the waiters `gone` removed.
pub(super) fn without(line: &LineState, served: u64, gone: &[u64]) -> LineState {
    LineState {
        next_seq: line.next_seq,
        queue: waiting(line, served)
            .iter()
            .filter(|w| !gone.contains(&w.seq))
            .cloned()
            .collect(),
        nonce: Nonce::default(),
    }
}

/// The lock state after a grant to `holder` (the next fence), the line
/// served up to `served`; `ticket`: the one a hand-over writes for it.
pub(super) fn granted(
    state: &LockState,
    holder: Holder,
    served: u64,
    ticket: Option<u64>,
) -> LockState {
    LockState {
        fence: state.fence + 1,
        holder: Some(holder),
        served: state.served.max(served),
        ticket,
        nonce: Nonce::default(),
    }
}

/// The lock state with nobody holding it, the line served up to `served`.
pub(super) fn freed(state: &LockState, served: u64) -> LockState {
    LockState {
        fence: state.fence,
        holder: None,
        served: state.served.max(served),
        ticket: None,
        nonce: Nonce::default(),
    }
}

/// The lock state with the line served up to `served`, the holder unchanged.
pub(super) fn skipped(state: &LockState, served: u64) -> LockState {
    LockState {
        fence: state.fence,
        holder: state.holder.clone(),
        served: state.served.max(served),
        ticket: state.ticket,
        nonce: Nonce::default(),
    }
}

/// How many served waiters the line may keep before a release prunes them.
pub(super) const STALE_LIMIT: usize = LOOKAHEAD;

/// Who asks for the lock, and when (one per call, fixed across the
/// engine's retries).
#[derive(Clone, Copy)]
pub(super) struct Newcomer<'a> {
    pub(super) token: &'a str,
    pub(super) ttl: Duration,
    /// The lock's clock when the call began.
    pub(super) now: u64,
    /// When the call began (local monotonic time): the lease counts from then.
    pub(super) sent: Instant,
}

/// The records one decision writes: the lock state and the line when they
/// change, the tickets of waiters that left the line, and when the holder
/// changes, the ticket of the waiter handed the lock and the one the
/// holder replaced was handed.
#[derive(Default)]
pub(super) struct Writes<'a> {
    pub(super) state: Option<LockState>,
    pub(super) line: Option<LineState>,
    pub(super) gone: &'a [u64],
    /// The waiter handed the lock: its ticket is written (lease 0), which
    /// wakes it. A removal would not do: its ticket record may never have
    /// been written (its first renewal comes at a third of its lease), and a
    /// store need not report a delete of a key that is not there (etcd after
    /// a reclaim deletes for real, and a delete of nothing is no event).
    pub(super) handed: Option<&'a Waiter>,
    /// The ticket written for the holder this decision replaces (the
    /// previous state's [`LockState::ticket`]): removed.
    pub(super) retired: Option<u64>,
}

impl FairLock {
    pub(super) fn state_key(&self, key: &str) -> String {
        format!("{}{key}/m", self.space.prefix())
    }

    pub(super) fn line_key(&self, key: &str) -> String {
        format!("{}{key}/n", self.space.prefix())
    }

    pub(super) fn ticket_key(&self, key: &str, seq: u64) -> String {
        // 20 digits: every u64, and the ticket keys sort in queue order.
        format!("{}{key}/q/{seq:020}", self.space.prefix())
    }

    pub(super) fn both_keys(&self, key: &str) -> [String; 2] {
        [self.state_key(key), self.line_key(key)]
    }

    /// The lock state and the line of `key`, as one consistent read (one
    /// snapshot). `None`: neither record exists.
    pub(super) async fn read_both(
        &self,
        key: &str,
    ) -> Result<Option<(LockState, LineState)>, Error> {
        let keys = self.both_keys(key);
        let entries = self.space.engine().snapshot(&keys).await?;
        if entries.iter().all(|e| e.value.is_none()) {
            return Ok(None);
        }
        let value = |k: &str| {
            entries
                .iter()
                .find(|e| e.key == k)
                .and_then(|e| e.value.as_deref())
        };
        Ok(Some((
            parse(&keys[0], value(&keys[0]))?,
            parse(&keys[1], value(&keys[1]))?,
        )))
    }

    /// The lock state and the line as `view` holds them.
    pub(super) fn decode(&self, view: &View, key: &str) -> Result<(LockState, LineState), Error> {
        let (state_key, line_key) = (self.state_key(key), self.line_key(key));
        Ok((
            parse(&state_key, view.value(&state_key))?,
            parse(&line_key, view.value(&line_key))?,
        ))
    }

    pub(super) fn why_not_held(
        handle: &LockHandle,
        state: &LockState,
        now: u64,
    ) -> Option<LostReason> {
        LostReason::judge(handle, state.holder.as_ref(), state.fence, now)
    }

    /// Judge the head of `queue`: a waiter is live by the lease recorded in
    /// the line, else by its ticket (read through the view).
    /// `Err(keys)`: read these tickets first.
    pub(super) fn head(
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
            match TicketRecord::read(view, &self.ticket_key(key, w.seq))? {
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

    /// One txn writing `writes`. Ticket writes are asserted when the view
    /// read the ticket, unasserted otherwise (a waiter asserts the lock and
    /// line records before each renewal of its ticket, so it never brings
    /// a removed ticket back nor overwrites one a hand-over wrote). The
    /// write of the handed waiter's ticket is what wakes it.
    pub(super) fn write<T>(
        &self,
        view: &View,
        key: &str,
        writes: Writes<'_>,
        then: T,
    ) -> Decision<T> {
        let mut mutations = Vec::new();
        let mut unasserted = Vec::new();
        if let Some(mut state) = writes.state {
            mutations.push(state.put(self.state_key(key)));
        }
        if let Some(mut line) = writes.line {
            mutations.push(line.put(self.line_key(key)));
        }
        let mut ticket_write = |ticket: &str, mutation: Mutation| {
            if view.contains(ticket) {
                mutations.push(mutation);
            } else {
                unasserted.push(mutation);
            }
        };
        for seq in writes.gone.iter().copied().chain(writes.retired) {
            let ticket = self.ticket_key(key, seq);
            ticket_write(&ticket, Mutation::delete(ticket.clone()));
        }
        if let Some(waiter) = writes.handed {
            let ticket = self.ticket_key(key, waiter.seq);
            let mut handed = TicketRecord {
                token: waiter.token.clone(),
                expires_ms: 0,
                nonce: Nonce::default(),
            };
            ticket_write(&ticket, handed.put(&ticket));
        }
        Decision::CommitWithUnasserted {
            mutations,
            unasserted,
            then,
        }
    }

    /// Skip the dead waiters `dead` (a prefix of the line): the lock record
    /// marks them served and their tickets go.
    pub(super) fn skip_dead<T>(
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
            gone: dead,
            ..Writes::default()
        };
        self.write(view, key, writes, then)
    }

    /// The line to write along with a lock state that serves it up to
    /// `served`, when enough served waiters piled up in it (else `None`:
    /// the line is left alone, so as not to race the waiters joining it).
    pub(super) fn prune(line: &LineState, served: u64) -> Option<LineState> {
        let stale = line.queue.partition_point(|w| w.seq <= served);
        (stale > STALE_LIMIT).then(|| without(line, served, &[]))
    }

    /// Grant the lock to `newcomer` when nobody holds it and nobody live
    /// waits: `Ok(decision)`; `Err(end)`: it must wait in line (`end`: when
    /// the holder's lease ends, if someone holds it).
    pub(super) fn grant_if_free<T>(
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
        if let Some(h) = state.holder.as_ref().filter(|h| h.is_live(now)) {
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
        let expires_ms = now.saturating_add(whole_millis(ttl));
        let served = dead.last().copied().unwrap_or(0);
        let retired = state.ticket;
        let state = granted(
            state,
            Holder {
                token: token.to_owned(),
                expires_ms,
            },
            served,
            None,
        );
        let handle = LockHandle::at(key, token, state.fence, ttl, expires_ms).requested_at(sent);
        let writes = Writes {
            line: Self::prune(line, state.served),
            state: Some(state),
            gone: &dead,
            handed: None,
            retired,
        };
        Ok(Ok(self.write(view, key, writes, answer(Some(handle)))))
    }

    /// The holder leaves (release, or a waiter that gave up just after the
    /// lock was handed to it): the lock goes to the first live waiter, with
    /// the next fence and the lease that waiter asked for; dead waiters ahead
    /// of it leave the line. Nobody live waiting: the lock is free.
    /// `false`: the first [`LOOKAHEAD`] waiters were all dead and only they
    /// left the line (the holder keeps the lock): decide again, so that the
    /// lock reaches a live waiter however many dead ones are ahead of it,
    /// at most [`LOOKAHEAD`] tickets per txn.
    pub(super) fn hand_over(
        &self,
        view: &View,
        key: &str,
        state: &LockState,
        line: &LineState,
        now: u64,
    ) -> Result<Decision<bool>, Error> {
        let queue = waiting(line, state.served);
        Ok(match self.head(view, key, queue, now)? {
            Err(unread) => Decision::Expand(unread),
            Ok(Head::Live { index, dead }) => {
                let next = &queue[index];
                let holder = Holder {
                    token: next.token.clone(),
                    expires_ms: now.saturating_add(next.ttl_ms),
                };
                let granted = granted(state, holder, next.seq, Some(next.seq));
                let writes = Writes {
                    line: Self::prune(line, granted.served),
                    state: Some(granted),
                    gone: &dead,
                    handed: Some(next),
                    retired: state.ticket,
                };
                self.write(view, key, writes, true)
            }
            Ok(Head::NoneLive {
                dead,
                complete: false,
            }) => self.skip_dead(view, key, state, &dead, false),
            Ok(Head::NoneLive { dead, .. }) => {
                let freed = freed(state, dead.last().copied().unwrap_or(0));
                let writes = Writes {
                    line: Self::prune(line, freed.served),
                    state: Some(freed),
                    gone: &dead,
                    handed: None,
                    retired: state.ticket,
                };
                self.write(view, key, writes, true)
            }
        })
    }
}
