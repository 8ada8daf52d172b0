//! What ticks and manual runs report back: one event per slot a tick looked
//! at, so callers and tests can see each decision without reading logs.

use crate::{FinalStatus, SkipReason, Slot};

#[cfg(doc)]
use super::Scheduler;

/// What a tick did with one slot.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TickAction {
    /// The handler was started (`coordinated = false`: a local run).
    Started {
        /// Whether the slot was taken over from an expired or released holder.
        takeover: bool,
        /// Whether the run is coordinated through the store.
        coordinated: bool,
    },
    /// Another instance holds the slot; it is looked at again (and taken
    /// over once its lease stayed unchanged for a full lease on this
    /// instance's monotonic clock and expired) until it becomes late.
    HeldElsewhere {
        /// The holder.
        holder: Option<String>,
    },
    /// The slot's run is already finished.
    AlreadyDone,
    /// Another slot of the job is running (store-wide); retried until late.
    Overlap {
        /// The blocking slot.
        running_slot: Slot,
    },
    /// Another slot of the job is running on this instance (local runs); retried until late.
    LocalOverlap,
    /// Too late to start: skipped.
    Late {
        /// Why it could not run in time.
        reason: SkipReason,
        /// Whether this instance recorded the skip in the store's history.
        recorded: bool,
    },
    /// Slots before this instant were skipped without being listed one by one.
    LateUnlisted {
        /// Every slot of the job before this instant (and after the previous cursor) was skipped.
        before: Slot,
    },
    /// The store failed: the slot is skipped this tick (and retried until late).
    StoreError {
        /// The error.
        message: String,
    },
}

/// One thing a tick did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickEvent {
    /// The job.
    pub job: String,
    /// The slot.
    pub slot: Slot,
    /// What happened.
    pub action: TickAction,
}

/// Everything one tick did, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TickReport {
    /// The tick's time (UTC ms).
    pub now_ms: u64,
    /// What happened, per slot.
    pub events: Vec<TickEvent>,
}

impl TickReport {
    /// The `(job, slot)`s whose handler this tick started.
    pub fn started(&self) -> Vec<(&str, Slot)> {
        self.events
            .iter()
            .filter(|e| matches!(e.action, TickAction::Started { .. }))
            .map(|e| (e.job.as_str(), e.slot))
            .collect()
    }

    /// The events of one job.
    pub fn of<'a>(&'a self, job: &'a str) -> impl Iterator<Item = &'a TickEvent> + 'a {
        self.events.iter().filter(move |e| e.job == job)
    }
}

/// The result of [`Scheduler::run_now`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManualReport {
    /// The run's slot in history (when it started, UTC ms).
    pub slot: Slot,
    /// How it ended.
    pub status: FinalStatus,
    /// Whether it was recorded in the store.
    pub recorded: bool,
}
