//! The errors of the side-effect contract, named after the outcomes a caller acts on.

use super::types::Outcome;

/// A boxed error of a host's prepare or apply step.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a side-effect call did not do what was asked.
///
/// [`Outcome::Contended`] is not an error (retry later); everything here is
/// either a refusal that changed nothing, or an explicit "unknown" that must
/// be reconciled. [`SideEffectError::outcome`] maps the variants that stand
/// for an outcome.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SideEffectError {
    /// The action is incomplete (empty key or resource), a key is not storable,
    /// or a TTL is zero. Nothing was stored.
    #[error("invalid action: {0}")]
    InvalidAction(String),

    /// The lease is no longer the current one of its resource (taken over,
    /// released, granted to another key or for another resource): the late
    /// write was refused and nothing was recorded. Also returned by a
    /// [`FencedSink`](super::FencedSink) refusing a stale write.
    #[error("fence stale: the lease is no longer the current one of its resource")]
    FenceStale,

    /// Renewing found the hold gone (taken over, released, expired, or the
    /// attempt was resolved): stop before applying. From the runner this
    /// means [`Outcome::Contended`]: nothing was applied, retry the whole action.
    #[error("lease lost: this attempt no longer holds its resource")]
    LeaseLost,

    /// No store is configured: an explicit failure, never a silent success.
    #[error("no side-effect store configured")]
    NoStore,

    /// The key is not in the uncertain state (never failed, in flight, or cleared).
    #[error("the key is not uncertain: nothing to resolve")]
    NotUncertain,

    /// The outcome of an attempt is unknown: it may or may not have applied.
    /// The key is (or stays) uncertain; reconcile before touching it again.
    #[error("outcome unknown, reconcile before retrying: {reason}")]
    OutcomeUnknown {
        /// What happened.
        reason: String,
        /// The apply or store error behind it, when there is one.
        #[source]
        source: Option<BoxError>,
    },

    /// The caller is not the current, unexpired reconciler of the key: nothing changed.
    #[error("reconcile lost: not the current reconciler of this key")]
    ReconcileLost,

    /// The prepare step failed: nothing was applied, the attempt was abandoned;
    /// running the same key again is safe.
    #[error("prepare failed (nothing applied): {source}")]
    PrepareFailed {
        /// The host's error.
        #[source]
        source: BoxError,
    },

    /// The apply step of a [`RetrySafety::Safe`](super::RetrySafety::Safe)
    /// action failed: the attempt was abandoned and may be retried.
    #[error("apply failed (retry-safe action, attempt abandoned): {source}")]
    ApplyFailed {
        /// The host's error.
        #[source]
        source: BoxError,
    },

    /// The store failed (unavailable, indeterminate, malformed record, ...).
    #[error(transparent)]
    Store(#[from] coord_backend::Error),
}

impl SideEffectError {
    /// The outcome this error stands for: [`Outcome::Contended`] for
    /// [`SideEffectError::LeaseLost`], [`Outcome::Uncertain`] for
    /// [`SideEffectError::OutcomeUnknown`]; `None` otherwise.
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            SideEffectError::LeaseLost => Some(Outcome::Contended),
            SideEffectError::OutcomeUnknown { .. } => Some(Outcome::Uncertain),
            _ => None,
        }
    }

    /// Whether running the same action again later is safe and may succeed
    /// (nothing was applied, or the action is retry-safe, or the store was busy).
    pub fn is_retryable(&self) -> bool {
        match self {
            SideEffectError::LeaseLost
            | SideEffectError::PrepareFailed { .. }
            | SideEffectError::ApplyFailed { .. } => true,
            SideEffectError::Store(e) => e.is_retryable(),
            _ => false,
        }
    }
}
