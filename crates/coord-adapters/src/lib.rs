//! The one copy of coord's decision logic, over any [`coord_backend::Backend`].
//!
//! Every adapter decides the same way (see [`cas`]): read a view of the keys
//! it needs, decide, then commit with a txn that asserts the version of
//! EVERY key the decision read; when the txn is rejected, decide again from
//! the entries it returned. Stores only make the primitives atomic; no
//! adapter knows which store it runs on.
//!
//! - [`cas`]: the CAS engine every adapter decides through.
//! - [`lock`]: locks with fencing tokens ([`GenericLock`] over any backend),
//!   waiting acquisition and a renewing [`LockGuard`].
//! - [`rwlock`]: a read-write lock with leases, fences and writer preference.
//! - [`election`]: leader election with a fencing term (campaign, proclaim, resign, observe).
//! - [`board`]: a task board with dependencies and takeover fences.
//! - [`runs`]: who runs a scheduled `(job, slot)`, decided once: the run
//!   store the cluster-wide scheduler (`coord-scheduler`) claims through.
//! - [`sideeffect`]: at-most-once side effects: the store adapter, the
//!   [`Runner`], [`sideeffect::FencedSink`] and reconciliation.
//! - [`telemetry`]: the names of the metrics the adapters emit (docs/operations.md).

pub mod board;
pub mod cas;
pub mod election;
mod grant;
pub mod guard;
pub mod jitter;
pub mod lock;
pub mod maintenance;
pub mod outbox;
pub mod retention;
pub mod runs;
pub mod rwlock;
pub mod sideeffect;
pub mod telemetry;
pub mod token;
pub mod wake;

pub use board::{Board, BoardAdapter, BoardError};
pub use cas::{CasEngine, CasOptions, CasStats, Decision, Nonce, Record, View};
pub use lock::{
    FairLock, GenericLock, GenericSemaphore, Lock, LockError, LockExt, LockGuard, LockHandle,
    PermitGuard, Semaphore,
};
pub use sideeffect::{Runner, SideEffectAdapter, SideEffectError, SideEffectStore};
pub use token::mint_token;

/// Re-exported so other crates can implement [`Backend`](coord_backend::Backend),
/// [`Lock`], [`Board`] or [`SideEffectStore`] without naming the dependency.
pub use async_trait::async_trait;
