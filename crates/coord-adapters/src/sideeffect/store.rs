//! The [`SideEffectStore`] trait: the gate's storage boundary.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use super::error::SideEffectError;
use super::types::{Acquired, Action, EffectResult, Execution, Lease, ReconcileClaim, Resolution};

/// The side-effect gate: one atomic `acquire` decides at once whether the key
/// was done, who holds the resource and which fence to issue.
///
/// [`SideEffectAdapter`](super::SideEffectAdapter) implements it once over
/// any [`Backend`](coord_backend::Backend); the trait exists so the
/// [`Runner`](super::Runner) and the conformance suite can take any
/// implementation (also deliberately broken ones). Object safe: use
/// `Arc<dyn SideEffectStore>`.
///
/// "The three-way check" below means: the lease's token is the current grant
/// of its resource, the holder recorded with it is the action's key, and the
/// lease's resource is the action's resource.
#[async_trait]
pub trait SideEffectStore: Send + Sync + Debug {
    /// Decide, in one atomic step, in this order: completed →
    /// [`Outcome::Replayed`](super::Outcome::Replayed) with the stored result;
    /// marked uncertain → `Uncertain`; an unresolved execution intent →
    /// `Contended` while its lease is live, `Uncertain` once it expired or was
    /// released; resource held by a live lease → `Contended`; otherwise grant
    /// (`Applied`, fence = highest ever issued + 1, intent recorded in the
    /// same txn). Zero `ttl`, empty key or resource → `InvalidAction`.
    async fn acquire(&self, action: &Action, ttl: Duration) -> Result<Acquired, SideEffectError>;

    /// Record the result and mark the key completed, clearing the intent and
    /// freeing the resource (three-way check, else `FenceStale`). Idempotent:
    /// a completed key returns the FIRST result. An uncertain key is refused
    /// with `OutcomeUnknown` (only a resolution clears it).
    async fn complete(
        &self,
        action: &Action,
        lease: &Lease,
        result: EffectResult,
    ) -> Result<EffectResult, SideEffectError>;

    /// Free the resource only (three-way check, else `FenceStale`): the key is
    /// not marked done and its intent stays, so it must be abandoned or
    /// reconciled before it runs again.
    async fn release(&self, action: &Action, lease: &Lease) -> Result<(), SideEffectError>;

    /// Check ownership and extend the lease to now + `ttl` in one atomic step.
    /// Taken over, released, expired, or the attempt no longer open → `LeaseLost`.
    async fn renew(
        &self,
        action: &Action,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease, SideEffectError>;

    /// Mark the key uncertain and drop its intent in one txn (per key: the
    /// resource lease is NOT released). Idempotent on an uncertain key; a
    /// stale lease is refused with `FenceStale`.
    async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError>;

    /// Resolve an uncertain key (also one whose intent lost its lease). No
    /// fence check. First resolution wins; a completed key answers
    /// `Replayed` with its result; any other key → `NotUncertain`.
    async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Execution, SideEffectError>;

    /// Nothing was applied: drop this attempt's intent and release the lease
    /// if it is still held (a newer holder's lease is never touched). An
    /// attempt that is no longer the key's open intent → `FenceStale`,
    /// nothing changed.
    async fn abandon(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError>;

    /// Claim the right to reconcile an uncertain key for `ttl`. `None` while
    /// another reconciler's claim is live; a key that is not uncertain →
    /// `NotUncertain`.
    async fn begin_reconcile(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError>;

    /// [`resolve_uncertain`](SideEffectStore::resolve_uncertain) by the holder
    /// of the current, unexpired reconcile claim, checked in the same txn;
    /// anyone else → `ReconcileLost`, nothing changed.
    async fn resolve_uncertain_owned(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: &str,
    ) -> Result<Execution, SideEffectError>;
}
