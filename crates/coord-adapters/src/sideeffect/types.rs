//! The values that cross the side-effect API: actions, leases, outcomes, results.

use std::fmt;
use std::time::SystemTime;

use coord_backend::redact::{Bytes, Hidden};
use serde::{Deserialize, Serialize};

/// Whether an action may be applied again after an apply that failed.
///
/// The kernel cannot see the remote side; only the host knows whether its
/// downstream deduplicates by idempotency key. Silence costs one
/// reconciliation, a wrong "safe" costs a double application, so the default
/// is the weakest level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetrySafety {
    /// Not declared (the default): a failed apply makes the outcome unknown;
    /// the key must be reconciled before it runs again.
    #[default]
    Unknown,
    /// The downstream deduplicates by idempotency key: a failed apply may be
    /// retried. Declaring this wrongly means applying twice.
    Safe,
    /// Retrying would apply twice. Behaves like [`RetrySafety::Unknown`];
    /// only the stated intent differs (audit).
    Unsafe,
}

impl fmt::Display for RetrySafety {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RetrySafety::Unknown => "unknown",
            RetrySafety::Safe => "safe",
            RetrySafety::Unsafe => "unsafe",
        })
    }
}

/// One logical action to apply at most once.
///
/// Every retry of one logical action must use the same [`key`](Action::key):
/// that is what deduplication rests on.
///
/// ```
/// use coord_adapters::sideeffect::{Action, RetrySafety};
///
/// let action = Action::new("invoice-42/charge", "customer-7")
///     .with_payload(b"{\"cents\":1200}".to_vec())
///     .with_retry_safety(RetrySafety::Safe);
/// assert_eq!(action.key, "invoice-42/charge");
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Action {
    /// The idempotency key (required, non-empty).
    pub key: String,
    /// The resource the action touches (required, non-empty): at most one
    /// holder per resource at a time.
    pub resource: String,
    /// The action's parameters; the kernel does not interpret them.
    pub payload: Vec<u8>,
    /// What a failed apply means (default [`RetrySafety::Unknown`]).
    pub retry_safety: RetrySafety,
}

impl fmt::Debug for Action {
    // The payload is application data: only its length is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Action")
            .field("key", &self.key)
            .field("resource", &self.resource)
            .field("payload", &Bytes(&self.payload))
            .field("retry_safety", &self.retry_safety)
            .finish()
    }
}

impl Action {
    /// An action with an empty payload and [`RetrySafety::Unknown`].
    pub fn new(key: impl Into<String>, resource: impl Into<String>) -> Self {
        Action {
            key: key.into(),
            resource: resource.into(),
            payload: Vec::new(),
            retry_safety: RetrySafety::Unknown,
        }
    }
}

coord_backend::setters! {
    Action {
        /// The same action with `payload`.
        with_payload(payload: impl Into<Vec<u8>>) => payload = payload.into();
        /// The same action with another retry safety.
        with_retry_safety(retry_safety: RetrySafety) => retry_safety = retry_safety;
    }
}

/// A fencing token: the generation of one grant on a resource.
///
/// Allocated by the store in the same txn as the grant, strictly increasing
/// per resource and never reused. Pass it downstream (see
/// [`FencedSink`](super::FencedSink)) so a paused, expired holder's late write
/// is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fence(pub u64);

impl fmt::Display for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fence {}", self.0)
    }
}

/// One exclusive hold of a resource, granted by `acquire`.
#[derive(Clone, PartialEq, Eq)]
pub struct Lease {
    /// The resource held.
    pub resource: String,
    /// The fencing token of this grant.
    pub fence: Fence,
    /// A random token minted for this grant only (the lease's credential).
    pub token: String,
    /// The idempotency key this lease was granted to.
    pub holder: String,
    /// When the hold ends unless renewed (judged with the adapter's clock).
    pub expires_at: SystemTime,
}

impl fmt::Debug for Lease {
    // The token is the lease's credential: it never appears in logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource)
            .field("fence", &self.fence)
            .field("token", &Hidden)
            .field("holder", &self.holder)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// What `acquire` decided. An enum rather than a bool: each calls for a
/// different next step (do it / take the stored result / retry later /
/// reconcile first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// This call holds the right to apply the action (a lease comes with it).
    Applied,
    /// The action was completed before: take the stored result, do not apply.
    Replayed,
    /// Someone else holds the resource (or this key is in flight elsewhere).
    /// Retryable, never an error: retry later with the same key.
    Contended,
    /// A previous attempt may or may not have applied: do not apply, reconcile first.
    Uncertain,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Applied => "applied",
            Outcome::Replayed => "replayed",
            Outcome::Contended => "contended",
            Outcome::Uncertain => "uncertain",
        })
    }
}

/// The bytes an action produced (its result), stored and replayed as they are.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct EffectResult(pub Vec<u8>);

impl fmt::Debug for EffectResult {
    // A result is application data: only its length is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EffectResult")
            .field(&Bytes(&self.0))
            .finish()
    }
}

impl EffectResult {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, by value.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl From<Vec<u8>> for EffectResult {
    fn from(bytes: Vec<u8>) -> Self {
        EffectResult(bytes)
    }
}

impl From<&[u8]> for EffectResult {
    fn from(bytes: &[u8]) -> Self {
        EffectResult(bytes.to_vec())
    }
}

impl From<&str> for EffectResult {
    fn from(text: &str) -> Self {
        EffectResult(text.as_bytes().to_vec())
    }
}

/// A reconciler's verdict on an uncertain key, after checking downstream facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolution {
    /// `true`: the action did take effect (the key becomes completed with
    /// `result`); `false`: it did not (the mark is cleared, the key may run again).
    pub applied: bool,
    /// The action's result when `applied` (ignored otherwise).
    pub result: EffectResult,
    /// Why (kept for the post-mortem: the evidence matters more than the verdict).
    pub reason: String,
}

impl Resolution {
    /// "It took effect, with this result."
    pub fn applied(result: impl Into<EffectResult>, reason: impl Into<String>) -> Self {
        Resolution {
            applied: true,
            result: result.into(),
            reason: reason.into(),
        }
    }

    /// "It did not take effect."
    pub fn not_applied(reason: impl Into<String>) -> Self {
        Resolution {
            applied: false,
            result: EffectResult::default(),
            reason: reason.into(),
        }
    }
}

/// The answer of `acquire`. Each outcome carries exactly what goes with it:
/// a lease only when granted, a result only when replayed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Granted: apply the action, passing the lease's fence downstream, then
    /// complete with its result ([`Outcome::Applied`]).
    Applied(Lease),
    /// Completed before: the stored result, as it was stored ([`Outcome::Replayed`]).
    Replayed(EffectResult),
    /// Another attempt holds the key or its resource now ([`Outcome::Contended`]).
    Contended,
    /// The key may have been applied and nobody knows: only a resolution
    /// clears it ([`Outcome::Uncertain`]).
    Uncertain,
}

impl Acquired {
    /// The outcome this answer stands for.
    pub fn outcome(&self) -> Outcome {
        match self {
            Acquired::Applied(_) => Outcome::Applied,
            Acquired::Replayed(_) => Outcome::Replayed,
            Acquired::Contended => Outcome::Contended,
            Acquired::Uncertain => Outcome::Uncertain,
        }
    }

    /// The granted lease ([`Acquired::Applied`] only).
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Acquired::Applied(lease) => Some(lease),
            _ => None,
        }
    }

    /// The granted lease, by value ([`Acquired::Applied`] only).
    pub fn into_lease(self) -> Option<Lease> {
        match self {
            Acquired::Applied(lease) => Some(lease),
            _ => None,
        }
    }

    /// The stored result ([`Acquired::Replayed`] only).
    pub fn result(&self) -> Option<&EffectResult> {
        match self {
            Acquired::Replayed(result) => Some(result),
            _ => None,
        }
    }
}

/// What a run (or a resolution) ended with: an outcome and, when there is
/// one, the action's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Execution {
    /// [`Outcome::Applied`]: applied by this call (result = its result);
    /// [`Outcome::Replayed`]: completed before (result = the stored one);
    /// [`Outcome::Contended`] / [`Outcome::Uncertain`]: nothing done, no result.
    /// For resolutions, `Applied` means "cleared: the key may run again"
    /// (no lease is granted; run it to get one).
    pub outcome: Outcome,
    /// The result, when the key is completed.
    pub result: Option<EffectResult>,
}

/// A reconciler's claim on an uncertain key (see `begin_reconcile`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReconcileClaim {
    /// The idempotency key being reconciled.
    pub key: String,
    /// The claim's credential; pass it to `resolve_uncertain_owned`.
    pub holder: String,
    /// When the claim lapses (another reconciler may then claim the key).
    pub expires_at: SystemTime,
}

/// What the store holds for one idempotency key (read-only inspection).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyStatus {
    /// Never acquired, abandoned, or cleared by a resolution.
    Idle,
    /// An execution intent: granted and not yet completed, abandoned or marked.
    InFlight {
        /// The resource of the grant.
        resource: String,
        /// The grant's fence.
        fence: Fence,
        /// Whether the grant's lease is still held and unexpired (if not, the
        /// key is effectively uncertain: it must be reconciled).
        live: bool,
    },
    /// Marked uncertain; waits for a resolution.
    Uncertain {
        /// Why it was marked.
        reason: String,
    },
    /// Completed with this result.
    Completed {
        /// The stored result.
        result: EffectResult,
    },
}

/// What the store holds for one resource (read-only inspection).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceStatus {
    /// The highest fence ever issued on the resource (`Fence(0)` = none yet).
    pub highest_fence: Fence,
    /// The idempotency key holding the resource, if any (expired or not).
    pub holder: Option<String>,
    /// When the holder's lease ends.
    pub expires_at: Option<SystemTime>,
    /// Whether the holder's lease is unexpired now.
    pub live: bool,
}

#[cfg(test)]
mod redaction_tests {
    use super::*;

    #[test]
    fn debug_shows_no_token_payload_or_result() {
        let lease = Lease {
            resource: "payments".into(),
            fence: Fence(7),
            token: "tok-SECRET-123".into(),
            holder: "refund/1".into(),
            expires_at: SystemTime::UNIX_EPOCH,
        };
        let action = Action::new("refund/1", "payments").with_payload(b"card=SECRET".to_vec());
        let done = Execution {
            outcome: Outcome::Applied,
            result: Some(EffectResult::from("SECRET-receipt")),
        };
        let status = KeyStatus::Completed {
            result: EffectResult::from("SECRET-receipt"),
        };
        for shown in [
            format!("{lease:?}"),
            format!("{lease:#?}"),
            format!("{action:?}"),
            format!("{done:?}"),
            format!("{status:?}"),
        ] {
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        assert!(format!("{lease:?}").contains("fence: Fence(7)"));
        assert!(format!("{lease:?}").contains("<redacted>"));
    }
}
