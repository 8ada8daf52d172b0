//! Every decision of a [`RunStore`](super::RunStore), as a pure function of
//! one consistent view of the keys it reads. The engine may call a decision
//! again on a fresher view after a conflict, so each one only depends on its
//! arguments and writes nothing itself: what it returns is committed, or
//! answered, whole.

use crate::cas::{Decision, Nonce, Record, View};
use coord_backend::Mutation;

use super::records::{
    History, HistoryEntry, RunningEntry, RunningSet, SlotKeys, SlotRecord, SlotState,
};
use super::RunError;
use super::{
    Claim, ClaimOutcome, ClaimRequest, FinalStatus, Lease, ManualRun, RunStatus, SkipReason, Slot,
};

/// Who runs `keys.slot`: reads all three keys of the slot, writes all three
/// when the request wins.
pub(super) fn claim(
    view: &View,
    keys: &SlotKeys,
    request: &ClaimRequest,
    now: u64,
    lease_until: u64,
    history_size: usize,
) -> Result<Decision<Claim>, RunError> {
    let slot = keys.slot;
    let (record, mut running, mut history) = keys.read(view)?;
    let lease = running.runs.get(&slot).cloned();
    // (takeovers, attempts) of the run this claim would start.
    let (takeovers, attempts) = match &record {
        // The floor refuses only slots whose claim is gone: a slot that was
        // still running when a later one was forgotten keeps its record, and
        // is judged by it (its owner retrying, a takeover, its finish).
        None if slot < history.forgotten_below => {
            return Ok(Decision::Return(Claim {
                won: false,
                outcome: ClaimOutcome::Done,
                takeovers: 0,
                holder: None,
                lease_until_ms: None,
                attempts: 0,
            }));
        }
        None => (0, 1),
        Some(r) if r.state == SlotState::Running && r.token == request.token => {
            // The same attempt asking again: still ours. Renew an
            // expired lease so the answer is not stale on arrival.
            let outcome = if r.takeovers > 0 {
                ClaimOutcome::TakenOver
            } else {
                ClaimOutcome::Won
            };
            let claim = |until| Claim {
                won: true,
                outcome,
                takeovers: r.takeovers,
                holder: Some(r.instance.clone()),
                lease_until_ms: Some(until),
                attempts: r.attempts,
            };
            return Ok(match lease {
                Some(l) if l.token == request.token && l.lease_until_ms > now => {
                    Decision::Return(claim(l.lease_until_ms))
                }
                _ => {
                    running.runs.insert(
                        slot,
                        RunningEntry {
                            token: r.token.clone(),
                            instance: r.instance.clone(),
                            started_ms: r.started_ms,
                            lease_until_ms: lease_until,
                        },
                    );
                    Decision::Commit {
                        mutations: vec![running.put(&keys.running_key)],
                        then: claim(lease_until),
                    }
                }
            });
        }
        Some(r) if r.state == SlotState::Done => {
            return Ok(Decision::Return(Claim {
                won: false,
                outcome: ClaimOutcome::Done,
                takeovers: r.takeovers,
                holder: Some(r.instance.clone()),
                lease_until_ms: None,
                attempts: r.attempts,
            }));
        }
        Some(r) if r.state == SlotState::Running => match &lease {
            Some(l)
                if l.token == r.token
                    && (l.lease_until_ms > now || !request.takeover.allows(l.lease_until_ms)) =>
            {
                return Ok(Decision::Return(Claim {
                    won: false,
                    outcome: ClaimOutcome::Running,
                    takeovers: r.takeovers,
                    holder: Some(r.instance.clone()),
                    lease_until_ms: Some(l.lease_until_ms),
                    attempts: r.attempts,
                }));
            }
            // Lease expired (or lost from the running set): take over,
            // which starts the next attempt.
            _ => (r.takeovers.saturating_add(1), r.attempts.saturating_add(1)),
        },
        // Released: free for the next claimer, as the next attempt.
        Some(r) => (r.takeovers.saturating_add(1), r.attempts.saturating_add(1)),
    };
    if let Some(r) = record.filter(|r| request.max_attempts.is_some_and(|max| r.attempts >= max)) {
        return Ok(exhausted(
            keys,
            request,
            r,
            running,
            history,
            now,
            history_size,
        ));
    }
    if !request.allow_overlap {
        if let Some((other, entry)) = running
            .runs
            .iter()
            .find(|(s, e)| **s != slot && e.lease_until_ms > now)
        {
            return Ok(Decision::Return(Claim {
                won: false,
                outcome: ClaimOutcome::Overlap {
                    running_slot: *other,
                },
                takeovers,
                holder: Some(entry.instance.clone()),
                lease_until_ms: Some(entry.lease_until_ms),
                attempts: attempts.saturating_sub(1),
            }));
        }
    }
    let mut new_record = SlotRecord {
        token: request.token.clone(),
        instance: request.instance.clone(),
        state: SlotState::Running,
        started_ms: now,
        finished_ms: None,
        takeovers,
        attempts,
        nonce: Nonce::default(),
    };
    running.runs.insert(
        slot,
        RunningEntry {
            token: request.token.clone(),
            instance: request.instance.clone(),
            started_ms: now,
            lease_until_ms: lease_until,
        },
    );
    history.upsert(
        HistoryEntry {
            slot,
            manual: false,
            token: None,
            instance: request.instance.clone(),
            status: RunStatus::Running,
            message: None,
            started_ms: now,
            finished_ms: None,
            takeovers,
            attempts,
        },
        history_size,
    );
    Ok(Decision::Commit {
        mutations: keys.write(&mut new_record, &mut running, &mut history),
        then: Claim {
            won: true,
            outcome: if takeovers > 0 {
                ClaimOutcome::TakenOver
            } else {
                ClaimOutcome::Won
            },
            takeovers,
            holder: Some(request.instance.clone()),
            lease_until_ms: Some(lease_until),
            attempts,
        },
    })
}

/// The message history shows for a run [`exhausted`] ended.
pub(super) const EXHAUSTED: &str =
    "attempts exhausted: the holder of the last attempt stopped without finishing";

/// A takeover that would start an attempt past `request.max_attempts`: the
/// run is finished failed instead (its slot record done under the
/// claimer's token, so the stopped holder's late finish is refused), and
/// the claim is lost with [`ClaimOutcome::Done`].
fn exhausted(
    keys: &SlotKeys,
    request: &ClaimRequest,
    old: SlotRecord,
    mut running: RunningSet,
    mut history: History,
    now: u64,
    history_size: usize,
) -> Decision<Claim> {
    let slot = keys.slot;
    let mut record = SlotRecord {
        token: request.token.clone(),
        instance: request.instance.clone(),
        state: SlotState::Done,
        started_ms: old.started_ms,
        finished_ms: Some(now),
        takeovers: old.takeovers,
        attempts: old.attempts,
        nonce: Nonce::default(),
    };
    running.runs.remove(&slot);
    let last = history
        .scheduled_mut(slot)
        .and_then(|e| e.message.take())
        .map(|m| format!("{EXHAUSTED} (last failure: {m})"))
        .unwrap_or_else(|| EXHAUSTED.to_owned());
    history.upsert(
        HistoryEntry {
            slot,
            manual: false,
            token: None,
            instance: old.instance.clone(),
            status: RunStatus::Failed,
            message: Some(last),
            started_ms: old.started_ms,
            finished_ms: Some(now.max(old.started_ms)),
            takeovers: old.takeovers,
            attempts: old.attempts,
        },
        history_size,
    );
    Decision::Commit {
        mutations: keys.write(&mut record, &mut running, &mut history),
        then: Claim {
            won: false,
            outcome: ClaimOutcome::Done,
            takeovers: old.takeovers,
            holder: Some(old.instance),
            lease_until_ms: None,
            attempts: old.attempts,
        },
    }
}

/// Record that the owner `token` starts attempt `attempt` of `keys.slot`
/// (a retry after `failure`): only while it owns the run (its claim and
/// its running entry), only as the next attempt. The same attempt asked
/// again is answered without a write (a retry after a lost reply).
pub(super) fn record_attempt(
    view: &View,
    keys: &SlotKeys,
    token: &str,
    attempt: u32,
    failure: &str,
    history_size: usize,
) -> Result<Decision<()>, RunError> {
    let slot = keys.slot;
    let (record, running, mut history) = keys.read(view)?;
    let owned = running.runs.get(&slot).is_some_and(|e| e.token == token);
    let Some(mut record) =
        record.filter(|r| owned && r.token == token && r.state == SlotState::Running)
    else {
        return Err(RunError::not_owner(&keys.job, slot));
    };
    if attempt == record.attempts {
        return Ok(Decision::Return(()));
    }
    if attempt != record.attempts.saturating_add(1) {
        return Err(RunError::InvalidArgument(format!(
            "attempt {attempt} does not follow attempt {} of {:?} slot {slot}",
            record.attempts, keys.job
        )));
    }
    record.attempts = attempt;
    let entry = HistoryEntry {
        slot,
        manual: false,
        token: None,
        instance: record.instance.clone(),
        status: RunStatus::Running,
        message: Some(failure.to_owned()),
        started_ms: record.started_ms,
        finished_ms: None,
        takeovers: record.takeovers,
        attempts: attempt,
    };
    history.upsert(entry, history_size);
    // The running set is read, so asserted: a takeover or a prune that
    // moved it since refuses this write.
    Ok(Decision::Commit {
        mutations: vec![record.put(&keys.slot_key), history.put(&keys.history_key)],
        then: (),
    })
}

/// Extend the lease of `slot` to `until`, for its owning token only.
pub(super) fn heartbeat(
    view: &View,
    job: &str,
    running_key: &str,
    slot: Slot,
    token: &str,
    until: u64,
) -> Result<Decision<Lease>, RunError> {
    let mut running = RunningSet::read(view, running_key)?.unwrap_or_default();
    match running.runs.get_mut(&slot) {
        Some(entry) if entry.token == token => {
            entry.lease_until_ms = until;
            Ok(Decision::Commit {
                mutations: vec![running.put(running_key)],
                then: Lease {
                    lease_until_ms: until,
                },
            })
        }
        _ => Err(RunError::not_owner(job, slot)),
    }
}

/// Mark a run finished with `status`: a scheduled one in its slot record,
/// the running set and history; a manual one in history only.
pub(super) fn finish(
    view: &View,
    keys: &SlotKeys,
    token: &str,
    status: &FinalStatus,
    now: u64,
    history_size: usize,
) -> Result<Decision<()>, RunError> {
    let slot = keys.slot;
    let (run_status, message) = match status {
        FinalStatus::Succeeded => (RunStatus::Succeeded, None),
        FinalStatus::Failed(m) => (RunStatus::Failed, Some(m.clone())),
        FinalStatus::TimedOut => (RunStatus::TimedOut, None),
    };
    let (record, mut running, mut history) = keys.read(view)?;
    match record {
        Some(r) if r.token == token && r.state == SlotState::Done => {
            return Ok(Decision::Return(()));
        }
        Some(mut r) if r.token == token && r.state == SlotState::Running => {
            r.state = SlotState::Done;
            r.finished_ms = Some(now);
            running.runs.remove(&slot);
            let entry = HistoryEntry {
                slot,
                manual: false,
                token: None,
                instance: r.instance.clone(),
                status: run_status,
                message: message.clone(),
                started_ms: r.started_ms,
                finished_ms: Some(now),
                takeovers: r.takeovers,
                attempts: r.attempts,
            };
            history.upsert(entry, history_size);
            return Ok(Decision::Commit {
                mutations: keys.write(&mut r, &mut running, &mut history),
                then: (),
            });
        }
        _ => {}
    }
    // A manual run: it lives in history only.
    let manual = history
        .runs
        .iter_mut()
        .find(|e| e.manual && e.slot == slot && e.token.as_deref() == Some(token));
    match manual {
        Some(e) if e.status != RunStatus::Running => Ok(Decision::Return(())),
        Some(e) => {
            e.status = run_status;
            e.message = message.clone();
            e.finished_ms = Some(now);
            Ok(Decision::Commit {
                mutations: vec![history.put(&keys.history_key)],
                then: (),
            })
        }
        None => Err(RunError::not_owner(&keys.job, slot)),
    }
}

/// Give up a run so the next claimer takes it over at once.
pub(super) fn release(
    view: &View,
    keys: &SlotKeys,
    token: &str,
    now: u64,
    history_size: usize,
) -> Result<Decision<()>, RunError> {
    let slot = keys.slot;
    let (record, mut running, mut history) = keys.read(view)?;
    match record {
        Some(r) if r.token == token && r.state == SlotState::Released => Ok(Decision::Return(())),
        Some(mut r) if r.token == token && r.state == SlotState::Running => {
            r.state = SlotState::Released;
            r.finished_ms = Some(now);
            running.runs.remove(&slot);
            history.upsert(
                HistoryEntry {
                    slot,
                    manual: false,
                    token: None,
                    instance: r.instance.clone(),
                    status: RunStatus::Released,
                    message: None,
                    started_ms: r.started_ms,
                    finished_ms: Some(now),
                    takeovers: r.takeovers,
                    attempts: r.attempts,
                },
                history_size,
            );
            Ok(Decision::Commit {
                mutations: keys.write(&mut r, &mut running, &mut history),
                then: (),
            })
        }
        _ => Err(RunError::not_owner(&keys.job, slot)),
    }
}

/// Add a manual run to history, once per token.
pub(super) fn record_manual(
    view: &View,
    history_key: &str,
    run: &ManualRun,
    now: u64,
    history_size: usize,
) -> Result<Decision<()>, RunError> {
    let mut history = History::read(view, history_key)?.unwrap_or_default();
    if history
        .runs
        .iter()
        .any(|e| e.manual && e.token.as_deref() == Some(run.token.as_str()))
    {
        // The same manual run recorded again (a retry): nothing to do.
        return Ok(Decision::Return(()));
    }
    history.upsert(
        HistoryEntry {
            slot: run.slot,
            manual: true,
            token: Some(run.token.clone()),
            instance: run.instance.clone(),
            status: RunStatus::Running,
            message: None,
            started_ms: now,
            finished_ms: None,
            takeovers: 0,
            attempts: 1,
        },
        history_size,
    );
    Ok(Decision::Commit {
        mutations: vec![history.put(history_key)],
        then: (),
    })
}

/// Add a skipped slot to history, unless the slot was claimed or is
/// already there; reads the slot record and history only.
pub(super) fn record_skip(
    view: &View,
    keys: &SlotKeys,
    instance: &str,
    reason: SkipReason,
    now: u64,
    history_size: usize,
) -> Result<Decision<bool>, RunError> {
    let SlotKeys {
        slot,
        slot_key,
        history_key,
        ..
    } = keys;
    let slot = *slot;
    if view.value(slot_key).is_some() {
        return Ok(Decision::Return(false));
    }
    let mut history = History::read(view, history_key)?.unwrap_or_default();
    if history.scheduled_mut(slot).is_some() {
        return Ok(Decision::Return(false));
    }
    if history.runs.len() >= history_size && history.runs.last().is_some_and(|e| e.slot > slot) {
        // Older than everything kept: recording it would drop it at once.
        return Ok(Decision::Return(false));
    }
    history.upsert(
        HistoryEntry {
            slot,
            manual: false,
            token: None,
            instance: instance.to_owned(),
            status: RunStatus::Skipped(reason),
            message: None,
            started_ms: now,
            finished_ms: Some(now),
            takeovers: 0,
            attempts: 1,
        },
        history_size,
    );
    Ok(Decision::Commit {
        mutations: vec![history.put(history_key)],
        then: true,
    })
}

/// The message history shows for a run [`forget`] found abandoned.
pub(super) const ABANDONED: &str =
    "abandoned: its lease ended with no finish and no takeover, and its claim was forgotten";

/// Delete the claims of `batch` (keys under `prefix`) that ended before
/// `horizon`, and raise history's floor past them in the same txn.
///
/// A claim ends when its run finishes or is released, or, for a run whose
/// owner went silent and nobody took over, when its lease ends (as the
/// running set says; a claim missing from it ends when it started, since
/// any claimer may take it over at once). Such an abandoned run also leaves
/// the running set and is marked in history, in the same txn. Whatever its
/// owner sends after that is refused, and none of its txns still held in
/// the store can apply: its heartbeat asserts the running set, its finish the
/// claim, and a claim all three keys, each of which this txn writes (a
/// version only moves forward, and the floor in history refuses the slot
/// once its claim is gone).
pub(super) fn forget(
    view: &View,
    batch: &[String],
    prefix: &str,
    horizon: u64,
    running_key: &str,
    history_key: &str,
) -> Result<Decision<usize>, RunError> {
    let mut running = if view.contains(running_key) {
        Some(RunningSet::read(view, running_key)?.unwrap_or_default())
    } else {
        None
    };
    let mut deletes = Vec::new();
    let mut abandoned = Vec::new();
    let mut below = 0;
    for key in batch {
        let Some(record) = SlotRecord::read(view, key)? else {
            continue;
        };
        let Ok(slot) = key[prefix.len()..].parse::<Slot>() else {
            continue;
        };
        // Remember a claim for the whole window after it ended,
        // so a backup still following it sees it done.
        let ended = match record.state {
            // A lease never ends before its run started.
            SlotState::Running if record.started_ms >= horizon => continue,
            SlotState::Running => {
                let Some(running) = &running else {
                    return Ok(Decision::Expand(vec![running_key.to_owned()]));
                };
                running
                    .runs
                    .get(&slot)
                    .map_or(record.started_ms, |entry| entry.lease_until_ms)
            }
            SlotState::Done | SlotState::Released => record.finished_ms.unwrap_or(u64::MAX),
        };
        if ended < horizon {
            deletes.push(Mutation::delete(key.clone()));
            below = below.max(slot.saturating_add(1));
            if record.state == SlotState::Running {
                abandoned.push((slot, ended));
            }
        }
    }
    let n = deletes.len();
    if n == 0 {
        return Ok(Decision::Return(0));
    }
    // Raise the floor in the same txn as the deletes.
    let mut history = History::read(view, history_key)?.unwrap_or_default();
    history.forgotten_below = history.forgotten_below.max(below);
    if let Some(running) = running.as_mut().filter(|_| !abandoned.is_empty()) {
        for (slot, ended) in abandoned {
            running.runs.remove(&slot);
            if let Some(entry) = history
                .scheduled_mut(slot)
                .filter(|e| e.status == RunStatus::Running)
            {
                entry.status = RunStatus::Failed;
                entry.message = Some(ABANDONED.into());
                entry.finished_ms = Some(ended.max(entry.started_ms));
            }
        }
        deletes.push(running.put(running_key));
    }
    deletes.push(history.put(history_key));
    Ok(Decision::Commit {
        mutations: deletes,
        then: n,
    })
}
