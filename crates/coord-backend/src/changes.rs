//! Change notifications: an optional store capability that lets a waiter
//! sleep until something it cares about may have changed, instead of
//! polling on a timer.
//!
//! # Contract
//!
//! - A notification is a **wake-up, never a fact**. It says "something under
//!   this prefix may have changed": the waiter re-reads (snapshot) and decides
//!   through an asserted txn as always. Spurious wake-ups are allowed.
//! - **Subscribe, then read.** A change committed after [`Changes::watch`]
//!   returned is reported by that watch (unless the store loses it: see
//!   below), so a waiter that watches first, reads second and then waits
//!   cannot sleep through the change that frees it.
//! - **A lost notification costs latency, never correctness.** Pub/sub
//!   channels drop messages on reconnects, a server may restart, a watch may
//!   break: waiters always bound their sleep by a fallback poll interval.
//!   [`ChangeWatch::changed`] returning an error means the watch is broken
//!   for good: poll from then on, or watch again.
//! - A store without the capability answers `None` from
//!   [`crate::Backend::changes`]; callers poll.
//!
//! Which stores offer it, and how, is in docs/shapes.md.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::Result;

/// Watch for changes under key prefixes of one backend's namespace.
#[async_trait]
pub trait Changes: Send + Sync + Debug {
    /// Start watching every key that starts with `prefix` (relative to the
    /// namespace, literal like [`crate::Backend::keys`]' prefix; `""` is the
    /// whole namespace). Every change committed after this returns is
    /// reported through the watch, at least once, unless the store loses it
    /// (see the module docs).
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>>;
}

/// One live watch; dropping it ends the subscription.
#[async_trait]
pub trait ChangeWatch: Send + Debug {
    /// Wait until something under the watched prefix may have changed since
    /// the watch began or since the previous call returned. Several changes
    /// may be folded into one wake-up; a wake-up may be spurious. An error
    /// means the watch broke: the caller polls (or watches again).
    async fn changed(&mut self) -> Result<()>;
}
