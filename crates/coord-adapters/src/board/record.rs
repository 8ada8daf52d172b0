//! How a task is stored: one JSON record per task, state and fence included.

use coord_backend::Error;
use serde::{Deserialize, Serialize};

use super::{ClaimedTask, Task, TaskState};
use crate::cas::record::time_at;
use crate::cas::{record_kind, LeaseRecord, Nonce, Record};

/// What is stored under `<prefix>task/<id>`. A record is only deleted by a
/// prune, once completed: a task added again under its id starts its
/// fences above every version the record had (see the claim).
// No `Debug`: it holds a token or stored bytes; see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct TaskRecord {
    pub(super) id: String,
    #[serde(with = "hex")]
    pub(super) payload: Vec<u8>,
    pub(super) deps: Vec<String>,
    /// Dependencies known completed for good: completed when the task was
    /// added or redefined, or pruned since (a prune writes it here in the
    /// same txn that deletes the dependency's record). A claim does not
    /// read them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) met: Vec<String>,
    /// Fence of the latest claim (0 = never claimed). Stored under its
    /// first name, so records written before the rename still read.
    #[serde(rename = "generation")]
    pub(super) fence: u64,
    pub(super) claim: Option<ClaimRecord>,
    pub(super) done: Option<DoneRecord>,
    /// The queue the task waits in (see `queue.rs`); absent: claimed by id only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) queue: Option<String>,
    /// Higher is claimed first from its queue.
    #[serde(default, skip_serializing_if = "is_zero_i16")]
    pub(super) priority: i16,
    /// No claim before this time (ms since the epoch): the task's run-at,
    /// then the end of each backoff.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) not_before_ms: Option<u64>,
    /// Claims that ran (or still run) an attempt: every claim counts one, a
    /// release gives it back. An expired claim stays counted.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub(super) attempts: u32,
    /// The attempt after which a failure makes the task dead (absent: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) max_attempts: Option<u32>,
    /// The backoff after a failure (absent: the default one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) backoff: Option<BackoffRecord>,
    /// The error of the last failed attempt (a `fail`, or a lease that ran out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last_error: Option<String>,
    /// Dead (attempts used up) or cancelled: never claimed again unless retried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) dead: Option<DeadRecord>,
    /// A queued task waits on this one: its completion marks it met there
    /// (see `queue.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) awaited: bool,
    /// The task's entry in its queue's index, when it has one: written and
    /// removed only in txns that write this record (see `queue.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) indexed: Option<String>,
    /// The task's entry in its queue's dead index
    /// (`queue/<queue>/d/<at>/<id>`) while it is dead (not cancelled):
    /// written and removed only in txns that write this record, as
    /// `indexed` (see `queue.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) dead_entry: Option<String>,
    /// At most once: a claim that ran out is not taken over, the task
    /// becomes uncertain instead (see [`super::TaskSpec::at_most_once`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) at_most_once: bool,
    /// Fresh per write, so an indeterminate txn can be told apart from
    /// someone else's identical write.
    pub(super) nonce: Nonce,
}

record_kind!(TaskRecord, "a task record");

fn is_zero_i16(n: &i16) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// A retry backoff: `initial_ms` doubled per failed attempt, at most `max_ms`.
#[derive(Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct BackoffRecord {
    pub(super) initial_ms: u64,
    pub(super) max_ms: u64,
}

/// Why a task stopped for good short of completion.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct DeadRecord {
    /// When (ms since the epoch, the deciding instance's clock).
    pub(super) at_ms: u64,
    /// Cancelled by an operator rather than out of attempts.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) cancelled: bool,
    /// Stopped with its last attempt's outcome unknown (an at-most-once
    /// task whose claim ran out, or whose holder said so): it may have run.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) uncertain: bool,
}

/// How a task stops for good short of completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Death {
    /// Its last allowed attempt failed.
    OutOfAttempts,
    /// Its last attempt's outcome is unknown (see [`DeadRecord::uncertain`]).
    Uncertain,
    /// An operator cancelled it.
    Cancelled,
}

// No `Debug`: it holds a token or stored bytes; see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct ClaimRecord {
    pub(super) agent: String,
    /// The claim's token and lease.
    #[serde(flatten)]
    pub(super) lease: LeaseRecord,
}

// No `Debug`: it holds a token or stored bytes; see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct DoneRecord {
    pub(super) agent: String,
    /// The token that completed the task: a retry of the same completion is a no-op.
    pub(super) token: String,
    #[serde(with = "hex")]
    pub(super) result: Vec<u8>,
    /// When it was completed (ms since the epoch, the completer's clock);
    /// absent in records completed before retention existed, which are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) at_ms: Option<u64>,
}

impl TaskRecord {
    /// The record in `bytes`, read from `key`, which must be `id`'s.
    pub(super) fn decode(key: &str, id: &str, bytes: &[u8]) -> Result<Self, Error> {
        let record = TaskRecord::from_bytes(key, bytes)?;
        if record.id != id {
            return Err(Error::malformed(
                key,
                format!("record names task {:?}, expected {id:?}", record.id),
            ));
        }
        Ok(record)
    }

    /// What the holder of `claim` learns from this record, written with it
    /// (what a claim and a renewal answer).
    pub(super) fn claimed_task(self, claim: ClaimRecord) -> ClaimedTask {
        ClaimedTask {
            id: self.id,
            payload: self.payload,
            deps: self.deps,
            agent: claim.agent,
            token: claim.lease.token,
            fence: self.fence,
            expires_at: time_at(claim.lease.expires_ms),
        }
    }

    /// When the task reached its final state (completed, dead or
    /// cancelled), if it did and the time is known: what retention judges.
    pub(super) fn final_at_ms(&self) -> Option<u64> {
        match (&self.done, &self.dead) {
            (Some(done), _) => done.at_ms,
            (None, Some(dead)) => Some(dead.at_ms),
            (None, None) => None,
        }
    }

    /// Dependencies not yet known completed for good.
    pub(super) fn unmet(&self) -> impl Iterator<Item = &String> {
        self.deps.iter().filter(|d| !self.met.contains(d))
    }

    /// The live claim at `now`, if any.
    pub(super) fn live_claim(&self, now: u64) -> Option<&ClaimRecord> {
        self.claim.as_ref().filter(|c| c.lease.is_live(now))
    }

    pub(super) fn to_task(&self, now: u64) -> Task {
        let state = match (&self.done, &self.claim) {
            (Some(done), _) => TaskState::Completed {
                agent: done.agent.clone(),
                result: done.result.clone(),
            },
            (None, _) if self.dead.as_ref().is_some_and(|d| d.cancelled) => TaskState::Cancelled,
            (None, _) if self.dead.as_ref().is_some_and(|d| d.uncertain) => TaskState::Uncertain {
                error: self.last_error.clone(),
            },
            (None, _) if self.dead.is_some() => TaskState::Dead {
                error: self.last_error.clone(),
            },
            (None, Some(c)) if c.lease.is_live(now) => TaskState::Claimed {
                agent: c.agent.clone(),
                expires_at: time_at(c.lease.expires_ms),
            },
            (None, Some(c)) => TaskState::Expired {
                agent: c.agent.clone(),
                expired_at: time_at(c.lease.expires_ms),
            },
            (None, None) => TaskState::Open,
        };
        Task {
            id: self.id.clone(),
            payload: self.payload.clone(),
            deps: self.deps.clone(),
            fence: self.fence,
            state,
            queue: self.queue.clone(),
            priority: self.priority,
            attempts: self.attempts,
            max_attempts: self.max_attempts,
            last_error: self.last_error.clone(),
            not_before: self.not_before_ms.filter(|at| *at > now).map(time_at),
        }
    }
}

/// Bytes as lowercase hex: half the size of a JSON number array, and readable.
mod hex {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        let mut out = String::with_capacity(bytes.len() * 2);
        for b in bytes {
            out.push_str(&format!("{b:02x}"));
        }
        s.serialize_str(&out)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        if text.len() % 2 != 0 {
            return Err(D::Error::custom("odd number of hex digits"));
        }
        (0..text.len())
            .step_by(2)
            .map(|i| {
                text.get(i..i + 2)
                    .filter(|pair| pair.bytes().all(|c| c.is_ascii_hexdigit()))
                    .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                    .ok_or_else(|| D::Error::custom("invalid hex digit"))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_round_trips_through_hex() {
        let record = TaskRecord {
            id: "t".into(),
            payload: vec![0, 1, 0x7f, 0x80, 0xff],
            deps: vec![],
            met: vec![],
            fence: 3,
            claim: None,
            done: None,
            queue: None,
            priority: 0,
            not_before_ms: None,
            attempts: 0,
            max_attempts: None,
            backoff: None,
            last_error: None,
            dead: None,
            awaited: false,
            indexed: None,
            dead_entry: None,
            at_most_once: false,
            nonce: Nonce::default(),
        };
        let bytes = record.to_bytes();
        assert!(String::from_utf8_lossy(&bytes).contains("\"00017f80ff\""));
        let back = TaskRecord::decode("k", "t", &bytes).unwrap();
        assert_eq!(back.payload, record.payload);
        assert!(TaskRecord::decode("k", "other", &bytes).is_err());
        assert!(TaskRecord::decode("k", "t", b"{\"id\":\"t\",\"payload\":\"0g\"}").is_err());
    }
}
