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
    /// Fresh per write, so an indeterminate txn can be told apart from
    /// someone else's identical write.
    pub(super) nonce: Nonce,
}

record_kind!(TaskRecord, "a task record");

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
