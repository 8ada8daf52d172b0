//! The run store: who runs `(job, slot)`, decided once, atomically, over the
//! three primitives.
//!
//! # Contract ([`SlotStore`])
//!
//! - [`claim`](SlotStore::claim) is ONE atomic decision: for a `(job, slot)`
//!   it answers `won = true` for exactly one token, and `true` again when the
//!   same token asks again while its run is unfinished (a client retrying
//!   after a lost reply still owns its run). Any other token gets
//!   `won = false` with the reason: the run is live elsewhere, done, or
//!   blocked by a live run of another slot (overlap protection).
//! - A run whose lease expired without finishing, or that was released, is
//!   **taken over** by the next claimer; the record counts takeovers.
//! - Every run counts its **attempts**: 1 at its first claim, +1 per
//!   takeover and per retry its owner records with
//!   [`record_attempt`](SlotStore::record_attempt) (conditional on its
//!   token, never backwards). A claim with
//!   [`ClaimRequest::max_attempts`] that would take over a run whose
//!   attempts reached it finishes the run failed instead of starting it.
//! - [`heartbeat`](SlotStore::heartbeat), [`finish`](SlotStore::finish) and
//!   [`release`](SlotStore::release) act only with the owning token; anything
//!   else is [`RunError::NotOwner`] and changes nothing. An expired lease that
//!   nobody took over yet still belongs to its holder (expiry only opens the
//!   door to a takeover), until the store forgets the run: with a dedupe
//!   window, a run whose lease ended longer than the window ago is
//!   *abandoned* and forgotten by [`prune`](SlotStore::prune) like a
//!   finished one; its holder is then refused like anyone else.
//! - [`history`](SlotStore::history) lists recent runs of a job from every
//!   instance, newest slot first, bounded by the store's history size.
//! - [`dedupe_window`](SlotStore::dedupe_window) says how long a claim is
//!   remembered after its run ended (finished, released, or its lease ran
//!   out with nobody taking over); the scheduler refuses jobs that could
//!   still claim a slot after that. A forgotten slot is never claimable again.
//!
//! # The implementation ([`RunStore`])
//!
//! Three keys per job, each decision a single
//! [`CasEngine::decide`](crate::CasEngine::decide) call that
//! asserts every key it read (never read-decide-write in separate calls):
//!
//! | key | holds |
//! | --- | --- |
//! | `sched/{job}/slot/{slot:020}` | one record per claimed slot: token, instance, state, takeovers, attempts (the dedupe memory) |
//! | `sched/{job}/running` | every unfinished run of the job with its lease: the overlap check and [`SlotStore::active`] |
//! | `sched/{job}/history` | the last `history_size` runs (JSON list), newest slot first |
//!
//! A claim reads all three and writes all three, so two slots of one job
//! serialize on the `running` key (that is what makes overlap protection
//! atomic); different jobs never contend. Expiry is judged with the store's
//! [`Clock`](coord_backend::Clock): instances must agree on time to within a
//! small fraction of the lease TTL; a skewed clock can only cause an early
//! takeover (a liveness / duplicate-work risk bounded by the lease), never
//! two winners of one claim.
//!
//! # Layout
//!
//! The public vocabulary of the contract is in `types`, the stored JSON
//! records and the key layout in `records`, each atomic decision as a pure
//! function of one view in `decide`, and [`RunStore`] (validation, then one
//! engine call per operation) in `run_store`.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

mod decide;
mod error;
mod records;
mod run_store;
#[cfg(test)]
mod tests;
mod types;

pub use error::RunError;
pub use run_store::{RunStore, RunStoreOptions};
pub use types::{
    ActiveRun, Claim, ClaimOutcome, ClaimRequest, FinalStatus, Lease, ManualRun, RunRecord,
    RunStatus, SkipReason, Takeover,
};

/// A slot: the scheduled instant in UTC milliseconds since the Unix epoch.
pub type Slot = u64;

const MAX_NAME: usize = 128;

/// The contract a scheduler coordinates through.
/// [`RunStore`] implements it over any [`Backend`](coord_backend::Backend);
/// the conformance suite checks any implementation.
#[async_trait]
pub trait SlotStore: Send + Sync + fmt::Debug {
    /// How long a claim is remembered after its run ended: finished,
    /// released, or abandoned (its lease ran out and nobody took over).
    /// `None` = forever.
    fn dedupe_window(&self) -> Option<Duration>;

    /// Decide, atomically, whether `request.token` runs `(job, slot)`.
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, RunError>;

    /// Extend the lease to now + `ttl`, only for the owning token.
    async fn heartbeat(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        ttl: Duration,
    ) -> Result<Lease, RunError>;

    /// Mark the run finished, only for the owning token (idempotent for it).
    async fn finish(
        &self,
        job: &str,
        slot: Slot,
        token: &str,
        status: FinalStatus,
    ) -> Result<(), RunError>;

    /// Record that the owning `token` starts attempt `attempt` (2 or more)
    /// of `(job, slot)` again, after `failure` (shown in history until the
    /// run ends). One conditional decision: refused with
    /// [`RunError::NotOwner`] unless `token` still owns the run (its claim
    /// and its lease entry: a takeover or a prune refuses it), and with
    /// [`RunError::InvalidArgument`] unless `attempt` is the run's next one.
    /// Asking again for the attempt already recorded answers `Ok` without a
    /// write, so a call whose reply was lost is asked again, never guessed.
    ///
    /// The default refuses every call (`InvalidArgument`): a store that
    /// does not count attempts never lets a scheduler retry.
    async fn record_attempt(
        &self,
        job: &str,
        slot: Slot,
        _token: &str,
        attempt: u32,
        _failure: &str,
    ) -> Result<(), RunError> {
        Err(RunError::InvalidArgument(format!(
            "this run store does not record attempts (attempt {attempt} of {job:?} slot {slot})"
        )))
    }

    /// End the lease now so a backup can take over, only for the owning token.
    async fn release(&self, job: &str, slot: Slot, token: &str) -> Result<(), RunError>;

    /// The unfinished runs of `job` and whether each lease is live.
    async fn active(&self, job: &str) -> Result<Vec<ActiveRun>, RunError>;

    /// Record a manual run (no deduplication); finish it with [`SlotStore::finish`].
    async fn record_manual(&self, run: &ManualRun) -> Result<(), RunError>;

    /// Record that `slot` was skipped, unless it was claimed or already
    /// recorded. Returns whether this call recorded it. A skip record does
    /// not block a later claim of the slot (by an instance still on time).
    async fn record_skip(
        &self,
        job: &str,
        slot: Slot,
        instance: &str,
        reason: SkipReason,
    ) -> Result<bool, RunError>;

    /// Recent runs of `job` from every instance, newest slot first, at most `limit`.
    async fn history(&self, job: &str, limit: usize) -> Result<Vec<RunRecord>, RunError>;

    /// Forget the claims whose run ended (finished, released, or abandoned:
    /// its lease ran out and nobody took over) longer than the dedupe window
    /// ago; returns how many. A forgotten slot is never claimable again, and
    /// the holder of a forgotten run is refused like anyone else.
    async fn prune(&self, _job: &str) -> Result<usize, RunError> {
        Ok(0)
    }
}

/// Check a job name: 1..=128 characters of `A-Z a-z 0-9 . _ : -`.
pub fn validate_job_name(job: &str) -> Result<(), RunError> {
    let ok = !job.is_empty()
        && job.len() <= MAX_NAME
        && job
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if ok {
        Ok(())
    } else {
        Err(RunError::InvalidJobName(job.to_owned()))
    }
}

pub(super) fn validate_label(what: &str, value: &str) -> Result<(), RunError> {
    if value.is_empty() || value.len() > MAX_NAME || value.contains('\0') {
        return Err(RunError::InvalidArgument(format!(
            "{what} must be 1 to {MAX_NAME} bytes without NUL"
        )));
    }
    Ok(())
}
