//! At-most-once side effects across processes: the gate
//! ([`SideEffectStore`], implemented once by [`SideEffectAdapter`]), the
//! [`Runner`] that fixes the order of steps, and the downstream
//! [`FencedSink`].
//!
//! # The contract
//!
//! An action ([`Action`]) is identified by an idempotency key and touches
//! one resource. Three failure shapes are closed, by one state decided in
//! one atomic step:
//!
//! - the same logical action retried → the **idempotency key**: a completed
//!   key is replayed (its stored result), never redone;
//! - two workers on one resource → the **lease**: at most one live holder
//!   per resource, with a TTL, taken over after expiry;
//! - an expired holder coming back (GC pause, partition) → the **fence**:
//!   each grant issues `highest ever + 1`, and the downstream refuses lower
//!   fences ([`FencedSink`]).
//!
//! `acquire` decides in this order (docs/at-most-once.md, "The decision order"): **completed → `Replayed` >
//! uncertain → `Uncertain` > unresolved execution intent → `Contended` while
//! its lease is live, `Uncertain` once it expired or was released > resource
//! leased by a live holder → `Contended` > grant → `Applied`** (fence =
//! highest + 1, intent recorded in the same txn). "Unknown" is a state, not a
//! default: a key whose attempt may have applied is never silently granted
//! again; it must be reconciled ([`SideEffectStore::resolve_uncertain`],
//! [`Runner::reconcile`]).
//!
//! What this module promises: at most one live holder per resource, and a
//! completed action is replayed. What it cannot promise alone: "applied at
//! most once" on the remote side needs the remote side (pass the fence or
//! the key downstream); when the answer is lost, the key becomes uncertain.
//!
//! # Boundary
//!
//! Decisions are made here; atomicity comes from the [`Backend`](coord_backend::Backend)
//! (one txn asserting every record read). Expiry is judged with the
//! adapter's injectable [`Clock`](coord_backend::Clock): instances must agree
//! on time within a small fraction of the TTLs (clocks affect liveness,
//! fences keep safety). Stored layout: `se/act/<key>` (key level: idle /
//! intent / uncertain / completed, plus a reconcile claim) and
//! `se/res/<resource>` (the fence counter and the current holder; never
//! deleted, so fences never restart), `se/sink/<resource>` for
//! [`BackendFencedSink`]. JSON records; bytes that do not decode are
//! [`coord_backend::Error::MalformedRecord`].
//!
//! # Choices the contract leaves open
//!
//! Each keeps "never apply twice":
//!
//! - **Renew refusals are [`SideEffectError::LeaseLost`]** (to a holder, a
//!   stale fence and a gate that changed hands mean the same: stop):
//!   taken over, released,
//!   expired, or the attempt no longer open all answer `LeaseLost`. The
//!   runner also maps a `FenceStale` from another store's renew to `LeaseLost`.
//! - **`complete` frees the resource** in the same txn that records the
//!   result. Release is "frees the resource only"; a completed key's lease
//!   has no purpose left, and the key itself can only replay from then on.
//!   The runner therefore does not call `release` after a successful
//!   `complete` (3 round trips per uncontended run: acquire, renew-check,
//!   complete). A lease used after its own `complete` is stale.
//! - **`complete` on a completed key returns the first result without a
//!   fence check** (a repeated complete is not an error); nothing is
//!   written, so a late holder cannot overwrite anything. `complete` on an
//!   uncertain key is refused with [`SideEffectError::OutcomeUnknown`]: only
//!   a resolution clears the mark. `complete` of an attempt that was
//!   abandoned or resolved meanwhile → [`SideEffectError::FenceStale`].
//! - **`complete` with the current fence after the lease's expiry (nobody
//!   took over) is accepted**: recording a fact is always safer than
//!   forgetting it. `renew` after expiry is refused (suite check `rule_20_renew_after_expiry`).
//! - **Release keeps the intent** (not "the key can be acquired again",
//!   which would let an attempt that may have applied run twice): a key released between
//!   grant and complete reads as `Uncertain` until abandoned or reconciled.
//! - **Retry-safe re-grant** (suite check `rule_06_dead_intent_uncertain`): an intent whose lease expired or was
//!   released is granted again (higher fence) only when the action was
//!   declared [`RetrySafety::Safe`] both when it was granted and now.
//!   `Unknown` and `Unsafe` read as `Uncertain`.
//! - **`mark_uncertain` on an already uncertain key succeeds without any
//!   check** (nothing is written); on a completed key it is refused
//!   (`FenceStale`): a known result is never turned into an unknown one.
//! - **An intent whose lease is gone counts as uncertain** for
//!   `resolve_uncertain` and `begin_reconcile` (that is what `acquire`
//!   reports); a live intent is `NotUncertain` (still in flight).
//!   `resolve_uncertain(applied = false)` answers [`Outcome::Applied`] with no
//!   result and no lease: "cleared, the key may run again".
//! - **`abandon` only drops this attempt's own open intent**; a key that is
//!   completed, uncertain or held by another attempt → `FenceStale`, nothing
//!   changed. The own lease is released only if still held.
//! - **`begin_reconcile` while another claim is live → `Ok(None)`** (like a
//!   busy lock, not an error); on a key that is not uncertain → `NotUncertain`.
//! - **`Runner::run` returns `Ok(None)` when contended** (retryable, never an
//!   error) and [`SideEffectError::OutcomeUnknown`] for an uncertain key.
//!
//! # Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use coord_adapters::sideeffect::{Action, Resolution, Runner, SideEffectAdapter, SideEffectError};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! let backend = Arc::new(SingleProcessMemoryBackend::new("se-docs")?);
//! let runner = Runner::new(Arc::new(SideEffectAdapter::new(backend)));
//! let action = Action::new("ship-17", "warehouse");
//!
//! // The apply step fails after maybe reaching the carrier: outcome unknown.
//! let failed = runner
//!     .execute(&action, Duration::from_secs(10), |_lease| async {
//!         Err::<coord_adapters::sideeffect::EffectResult, _>(std::io::Error::other("timeout"))
//!     })
//!     .await;
//! assert!(matches!(failed, Err(SideEffectError::OutcomeUnknown { .. })));
//!
//! // After checking with the carrier: it did ship.
//! runner.reconcile(&action, Resolution::applied("tracking-123", "carrier API lists it")).await?;
//! let result = runner
//!     .run(&action, Duration::from_secs(10), |_lease| async {
//!         Ok::<_, std::io::Error>("never called".into())
//!     })
//!     .await?;
//! assert_eq!(result.unwrap().as_bytes(), b"tracking-123");
//! # Ok(()) }
//! ```

mod adapter;
mod error;
mod fenced_sink;
mod reconcile;
mod record;
mod runner;
mod store;
mod types;

pub use adapter::SideEffectAdapter;
/// Re-exported so implementors of [`SideEffectStore`] and [`FencedSink`]
/// need no dependency of their own.
pub use async_trait::async_trait;
pub use error::{BoxError, SideEffectError};
pub use fenced_sink::{BackendFencedSink, FencedSink};
pub use runner::Runner;
pub use store::SideEffectStore;
pub use types::{
    Acquired, Action, EffectResult, Execution, Fence, KeyStatus, Lease, Outcome, ReconcileClaim,
    Resolution, ResourceStatus, RetrySafety,
};

#[cfg(test)]
mod tests;
