//! The vocabulary of the [`SlotStore`] contract: what a caller asks for and
//! what it is told back. None of it knows how a store keeps its records.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Slot;
#[cfg(doc)]
use super::SlotStore;

/// What one instance asks for when it wants to run `(job, slot)`.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// The job name.
    pub job: String,
    /// The slot (scheduled instant, UTC ms).
    pub slot: Slot,
    /// A random value unique to this attempt ([`crate::mint_token`]);
    /// sending the same token again is a retry of the same attempt.
    pub token: String,
    /// Who asks (shown in history and `active`).
    pub instance: String,
    /// How long the lease lasts without a heartbeat.
    pub lease_ttl: Duration,
    /// Whether this slot may run while another slot of the job is running.
    pub allow_overlap: bool,
    /// When a lease of another token that expired by the store's clock may
    /// be taken over (default [`Takeover::WhenExpired`]).
    pub takeover: Takeover,
    /// The most attempts the slot may start, takeovers included (`None`,
    /// the default: no bound, every takeover runs). A takeover that would
    /// start attempt `max_attempts + 1` finishes the run failed instead
    /// (outcome [`ClaimOutcome::Done`]).
    pub max_attempts: Option<u32>,
}

impl std::fmt::Debug for ClaimRequest {
    // The token is the run's credential: it never appears in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimRequest")
            .field("job", &self.job)
            .field("slot", &self.slot)
            .field("token", &coord_backend::redact::Hidden)
            .field("instance", &self.instance)
            .field("lease_ttl", &self.lease_ttl)
            .field("allow_overlap", &self.allow_overlap)
            .field("takeover", &self.takeover)
            .field("max_attempts", &self.max_attempts)
            .finish()
    }
}

/// When [`SlotStore::claim`] may take over another token's unfinished run
/// whose lease expired by the store's clock. A released run is free for
/// any claimer whatever the rule.
///
/// Expiry read from one instance's wall clock alone is not enough: a clock
/// stepped forward (e.g. +1 h) makes every live lease look expired. The
/// scheduler therefore first observes a lease, and takes it over only once
/// that lease stayed the same for a full lease duration on its own monotonic
/// clock (as Kubernetes leader election does): the holder, which counts its
/// own lease from when its last confirmed heartbeat was *sent*, has given
/// it up locally by then.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Takeover {
    /// The store's clock alone decides (expired = takeable).
    #[default]
    WhenExpired,
    /// Only when the expired lease still ends at this instant (UTC ms): the
    /// `lease_until_ms` the caller saw unchanged for a full lease duration.
    IfUnchanged(u64),
    /// Never take over an unreleased run: only learn who holds it and until when.
    Never,
}

impl Takeover {
    pub(super) fn allows(self, lease_until_ms: u64) -> bool {
        match self {
            Takeover::WhenExpired => true,
            Takeover::IfUnchanged(seen) => seen == lease_until_ms,
            Takeover::Never => false,
        }
    }
}

impl ClaimRequest {
    /// A claim without overlap.
    pub fn new(
        job: impl Into<String>,
        slot: Slot,
        token: impl Into<String>,
        instance: impl Into<String>,
        lease_ttl: Duration,
    ) -> Self {
        ClaimRequest {
            job: job.into(),
            slot,
            token: token.into(),
            instance: instance.into(),
            lease_ttl,
            allow_overlap: false,
            takeover: Takeover::WhenExpired,
            max_attempts: None,
        }
    }
}

coord_backend::setters! {
    ClaimRequest {
        /// Set when an expired lease of another token may be taken over.
        with_takeover(rule: Takeover) => takeover = rule;
        /// Allow (or not) this slot to run while another slot of the job runs.
        with_allow_overlap(allow: bool) => allow_overlap = allow;
        /// Bound the attempts of the slot, takeovers included (`None` = no bound).
        with_max_attempts(max: Option<u32>) => max_attempts = max;
    }
}

/// Why a claim was won or lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// Won a slot nobody had claimed (or the same token asked again).
    Won,
    /// Won a slot whose previous holder's lease expired or who released it.
    TakenOver,
    /// Lost: another token holds a live lease on this slot (or an expired
    /// one that the request's [`Takeover`] rule did not allow to take over).
    Running,
    /// Lost: the slot's run is finished, or its claim was forgotten
    /// ([`SlotStore::prune`]): a forgotten slot is never claimable again.
    Done,
    /// Lost: another slot of the job is running with a live lease and the
    /// job does not allow overlap.
    Overlap {
        /// The running slot that blocks this one.
        running_slot: Slot,
    },
}

/// The answer of [`SlotStore::claim`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// Whether the asking token owns the run.
    pub won: bool,
    /// Why.
    pub outcome: ClaimOutcome,
    /// How many times this slot was taken over (0 for a first run).
    pub takeovers: u32,
    /// The instance holding the slot (or the blocking slot, for `Overlap`).
    pub holder: Option<String>,
    /// When the holder's lease expires (UTC ms), when there is a live holder.
    pub lease_until_ms: Option<u64>,
    /// The attempt a won claim starts (1 for a first run, +1 per retry and
    /// per takeover); for a lost claim, the attempts the slot has started
    /// (0 when it has none).
    pub attempts: u32,
}

/// How a run ended, as its owner reports it to [`SlotStore::finish`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FinalStatus {
    /// The handler returned success.
    Succeeded,
    /// The handler failed (with its message).
    Failed(String),
    /// The handler ran longer than the job's timeout and was stopped.
    TimedOut,
}

/// Why a slot was skipped without running.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SkipReason {
    /// Nobody claimed it within the job's maximum lateness.
    Late,
    /// It stayed blocked by a running slot of the same job until it was too late.
    Overlap,
}

/// The state of one run in [`SlotStore::history`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RunStatus {
    /// Claimed and not finished (its lease may have expired; see `active`).
    Running,
    /// Finished successfully.
    Succeeded,
    /// Finished with an error, or abandoned: its lease ran out with no
    /// finish and no takeover, and the store forgot its claim (the message
    /// starts with `abandoned`).
    Failed,
    /// Stopped by the job's timeout.
    TimedOut,
    /// Given up by its holder (graceful shutdown) and not taken over yet.
    Released,
    /// Not run.
    Skipped(SkipReason),
}

/// One run as [`SlotStore::history`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The slot (for a manual run: when it started).
    pub slot: Slot,
    /// The instance that ran (or skipped) it.
    pub instance: String,
    /// Its state.
    pub status: RunStatus,
    /// The failure message, when there is one.
    pub message: Option<String>,
    /// When the current holder started it (UTC ms).
    pub started_ms: u64,
    /// How long it ran, once finished.
    pub duration_ms: Option<u64>,
    /// How many times the slot was taken over.
    pub takeovers: u32,
    /// How many attempts the slot started: 1 plus its retries and takeovers
    /// (records written before attempts were counted read as 1; a skipped
    /// slot started none: 0).
    pub attempts: u32,
    /// Whether it was started by `run_now` (never deduplicated).
    pub manual: bool,
}

/// An unfinished run, as [`SlotStore::active`] lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ActiveRun {
    /// The slot.
    pub slot: Slot,
    /// Its holder.
    pub instance: String,
    /// When the holder started it (UTC ms).
    pub started_ms: u64,
    /// When its lease expires (UTC ms).
    pub lease_until_ms: u64,
    /// Whether the lease is still live by the store's clock.
    pub live: bool,
}

/// A renewed lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Lease {
    /// When it now expires (UTC ms).
    pub lease_until_ms: u64,
}

/// A manual run (`run_now`), recorded without deduplication.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManualRun {
    /// The job.
    pub job: String,
    /// When it started (UTC ms); also its slot in history.
    pub slot: Slot,
    /// The run's token (used to finish it).
    pub token: String,
    /// Who runs it.
    pub instance: String,
}

impl std::fmt::Debug for ManualRun {
    // The token is the run's credential: it never appears in logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManualRun")
            .field("job", &self.job)
            .field("slot", &self.slot)
            .field("token", &coord_backend::redact::Hidden)
            .field("instance", &self.instance)
            .finish()
    }
}

impl ManualRun {
    /// A manual run.
    pub fn new(
        job: impl Into<String>,
        slot: Slot,
        token: impl Into<String>,
        instance: impl Into<String>,
    ) -> Self {
        ManualRun {
            job: job.into(),
            slot,
            token: token.into(),
            instance: instance.into(),
        }
    }
}
