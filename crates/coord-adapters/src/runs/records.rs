//! What a [`RunStore`](super::RunStore) keeps in the backend: the key layout
//! of a job and its JSON records. Field names are the storage format, read
//! back by every instance and every version: change them only compatibly.

use std::collections::BTreeMap;

use crate::cas::{record_kind, Nonce, Record, View};
use coord_backend::Mutation;
use serde::{Deserialize, Serialize};

use super::RunError;
#[cfg(doc)]
use super::SlotStore;
use super::{RunStatus, Slot};

const PREFIX: &str = "sched/";

/// Where the claims of `job` live, one key per slot.
pub(super) fn slot_prefix(job: &str) -> String {
    format!("{PREFIX}{job}/slot/")
}

/// The claim of one slot; zero-padded so keys sort by slot.
pub(super) fn slot_key(job: &str, slot: Slot) -> String {
    format!("{PREFIX}{job}/slot/{slot:020}")
}

/// Every unfinished run of `job`: one key, so that claims of its slots
/// serialize on it.
pub(super) fn running_key(job: &str) -> String {
    format!("{PREFIX}{job}/running")
}

/// The bounded history of `job`.
pub(super) fn history_key(job: &str) -> String {
    format!("{PREFIX}{job}/history")
}

/// The three keys a decision about one `(job, slot)` reads and writes.
pub(super) struct SlotKeys {
    pub(super) job: String,
    pub(super) slot: Slot,
    pub(super) slot_key: String,
    pub(super) running_key: String,
    pub(super) history_key: String,
}

impl SlotKeys {
    pub(super) fn new(job: &str, slot: Slot) -> Self {
        SlotKeys {
            job: job.to_owned(),
            slot,
            slot_key: slot_key(job, slot),
            running_key: running_key(job),
            history_key: history_key(job),
        }
    }

    /// All three, for the engine to read and assert.
    pub(super) fn all(&self) -> [String; 3] {
        [
            self.slot_key.clone(),
            self.running_key.clone(),
            self.history_key.clone(),
        ]
    }

    /// The three records in `view`: a slot nobody claimed has no record; a
    /// job without a running set or history yet reads as empty.
    pub(super) fn read(
        &self,
        view: &View,
    ) -> Result<(Option<SlotRecord>, RunningSet, History), RunError> {
        Ok((
            SlotRecord::read(view, &self.slot_key)?,
            RunningSet::read(view, &self.running_key)?.unwrap_or_default(),
            History::read(view, &self.history_key)?.unwrap_or_default(),
        ))
    }

    /// Writes of all three records.
    pub(super) fn write(
        &self,
        record: &mut SlotRecord,
        running: &mut RunningSet,
        history: &mut History,
    ) -> Vec<Mutation> {
        vec![
            record.put(&self.slot_key),
            running.put(&self.running_key),
            history.put(&self.history_key),
        ]
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum SlotState {
    Running,
    Done,
    Released,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct SlotRecord {
    pub(super) token: String,
    pub(super) instance: String,
    pub(super) state: SlotState,
    pub(super) started_ms: u64,
    #[serde(default)]
    pub(super) finished_ms: Option<u64>,
    #[serde(default)]
    pub(super) takeovers: u32,
    /// Attempts started for the slot: 1 at the first claim, +1 per retry
    /// ([`SlotStore::record_attempt`]) and per takeover; only moves forward.
    /// Absent (= 1) in records written before retries, and when it is 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub(super) attempts: u32,
    /// Fresh per write (see the CAS engine on indeterminate txns);
    /// absent in records written before it.
    #[serde(default)]
    pub(super) nonce: Nonce,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct RunningEntry {
    pub(super) token: String,
    pub(super) instance: String,
    pub(super) started_ms: u64,
    pub(super) lease_until_ms: u64,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Default, Serialize, Deserialize)]
pub(super) struct RunningSet {
    pub(super) runs: BTreeMap<Slot, RunningEntry>,
    /// Fresh per write (see the CAS engine on indeterminate txns);
    /// absent in records written before it.
    #[serde(default)]
    pub(super) nonce: Nonce,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct HistoryEntry {
    pub(super) slot: Slot,
    #[serde(default)]
    pub(super) manual: bool,
    /// Only for manual runs (they have no slot record to hold it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) token: Option<String>,
    pub(super) instance: String,
    pub(super) status: RunStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) message: Option<String>,
    pub(super) started_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) finished_ms: Option<u64>,
    #[serde(default)]
    pub(super) takeovers: u32,
    /// As the slot record's (absent = 1).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub(super) attempts: u32,
}

// No `Debug`: it holds tokens.
#[derive(Clone, Default, Serialize, Deserialize)]
pub(super) struct History {
    pub(super) runs: Vec<HistoryEntry>,
    /// Slots below this were forgotten by [`SlotStore::prune`] (their claims
    /// deleted): never claimable again. Kept in the store, not judged by any
    /// instance's clock, so an instance whose clock lags the pruner's cannot
    /// claim and run a forgotten slot a second time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(super) forgotten_below: Slot,
    /// Fresh per write (see the CAS engine on indeterminate txns);
    /// absent in records written before it.
    #[serde(default)]
    pub(super) nonce: Nonce,
}

record_kind!(SlotRecord, "a run's slot record");
record_kind!(RunningSet, "a job's running set");
record_kind!(History, "a job's run history");

fn is_zero(n: &Slot) -> bool {
    *n == 0
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

impl History {
    pub(super) fn scheduled_mut(&mut self, slot: Slot) -> Option<&mut HistoryEntry> {
        self.runs.iter_mut().find(|e| !e.manual && e.slot == slot)
    }

    /// Insert or replace the scheduled entry of `entry.slot`, keep newest
    /// slot first, drop the oldest beyond `size`.
    pub(super) fn upsert(&mut self, entry: HistoryEntry, size: usize) {
        if let Some(existing) = self.scheduled_mut(entry.slot).filter(|_| !entry.manual) {
            *existing = entry;
        } else {
            let at = self
                .runs
                .iter()
                .position(|e| e.slot < entry.slot)
                .unwrap_or(self.runs.len());
            self.runs.insert(at, entry);
        }
        self.runs.truncate(size);
    }
}
