//! Locks with fencing tokens (guide: docs/locks.md; contract: the lock suite).
//!
//! # Contract
//!
//! A [`Lock`] grants a string key to one holder at a time for a TTL:
//!
//! - [`Lock::try_lock`] answers `Ok(Some(handle))` when the caller got the
//!   lock, `Ok(None)` when someone else holds it (contention is not a
//!   failure), and `Err` only when the store is broken or the input is bad.
//! - [`Lock::renew`] extends the lease **and** checks ownership: a handle
//!   whose lease expired, was taken over or was released gets
//!   [`LockError::Lost`] and nothing changes.
//! - [`Lock::release`] frees the lock only for the handle that holds it; a
//!   stale handle can neither renew nor release a newer holder's lock.
//! - Every grant carries a **fencing token** ([`LockHandle::fence`]): per key,
//!   strictly increasing, allocated in the same atomic step as the grant, and
//!   never reset by a release. Pass it to whatever the lock protects and let
//!   that side refuse writes with a lower fence: that keeps safety
//!   independent of clocks and pauses, which a TTL alone cannot.
//!
//! On top of any `Lock`: [`LockExt::lock`] waits until a timeout (through
//! [`Lock::wait_lock`]: by default watch the key, try, then sleep until a
//! change notification or an exponential backoff with jitter, whichever
//! comes first), and [`LockGuard`] renews in the background and tells the
//! holder (a signal it can await) the moment the lock is lost.
//!
//! [`FairLock`] hands the lock over in request order (FIFO tickets);
//! [`Semaphore`] ([`GenericSemaphore`]) grants up to N permits per key,
//! each with its own fence.
//!
//! # Boundary
//!
//! [`GenericLock`] decides over the three primitives of any
//! [`coord_backend::Backend`], so it is exactly as atomic as that store (on
//! `coord_memory::SingleProcessMemoryBackend` that means one process only:
//! a development and test lock, never a distributed one). Expiry is judged
//! with the adapter's [`coord_backend::Clock`]: instances must agree on time
//! within a bound well below the TTLs they use; a skewed clock can let a
//! lease be taken over early (liveness and exclusivity of the *lease*), but
//! the fence still orders holders, so a store that checks fences stays safe.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use coord_adapters::lock::{GenericLock, Lock};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = Arc::new(SingleProcessMemoryBackend::new("demo")?);
//! let lock = GenericLock::new(store);
//!
//! let first = lock.try_lock("reports", Duration::from_secs(30)).await?.expect("free");
//! assert!(lock.try_lock("reports", Duration::from_secs(30)).await?.is_none()); // held
//! let fence = first.fence();
//! lock.release(first).await?;
//!
//! let second = lock.try_lock("reports", Duration::from_secs(30)).await?.expect("free again");
//! assert!(second.fence() > fence); // fences survive release
//! # lock.release(second).await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt::Debug;
use std::time::{Duration, SystemTime};

use coord_backend::InvalidInput;

use crate::cas::{Record, RecordSpace};
use crate::grant::{grant_accessors, Grant};
use crate::wake::Wake;

pub mod fair;
mod generic;
mod guard;
mod observe;
pub mod semaphore;
mod wait;

pub use fair::{FairLock, FairLockOptions, FairLockStatus, TicketStatus};
pub use generic::{GenericLock, LockOptions, LockStatus};
pub use guard::{GuardOptions, LockGuard, LostSignal, PermitGuard};
pub(crate) use observe::renewed;
pub use observe::{lock_lost_if, observe_release, observe_renew, observe_try_lock};
pub use semaphore::{
    GenericSemaphore, Permit, PermitStatus, Semaphore, SemaphoreOptions, SemaphoreStatus,
};
pub use wait::{retry_until_free, LockExt, WaitOptions};

/// Re-exported so that other `Lock` implementations (native locks, test
/// doubles) can implement the trait without depending on `async-trait` themselves.
pub use async_trait::async_trait;

/// A lock service: one holder per key at a time, with fencing tokens.
///
/// Object safe: pass `Arc<dyn Lock>` around and pick the implementation at
/// run time. See the [module docs](self) for the contract every
/// implementation must meet (checked by `coord_conformance::lock`).
#[async_trait]
pub trait Lock: Send + Sync + Debug {
    /// Take `key` for `ttl` if nobody holds it.
    ///
    /// `Ok(None)`: someone else holds it (retry later). `Err`: the store is
    /// broken ([`LockError::Store`]) or the input is bad ([`LockError::Invalid`]:
    /// empty key, TTL under one millisecond).
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError>;

    /// Extend the lease of `handle` by its TTL, counted from now, if it still holds the lock.
    ///
    /// Expired, taken over or released → [`LockError::Lost`], nothing changes.
    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError>;

    /// Give the lock up. A handle that no longer holds the lock (expired,
    /// taken over, already released) gets [`LockError::Lost`] and nothing
    /// changes: a stale holder never frees a newer holder's lock.
    async fn release(&self, handle: LockHandle) -> Result<(), LockError>;

    /// A watch on whatever decides whether `key` is free, for callers about
    /// to wait for it (see [`crate::wake`]: wake-ups only, re-read always).
    /// The default is no watch: waiters poll.
    async fn watch_key(&self, key: &str) -> Wake {
        let _ = key;
        Wake::polling()
    }

    /// Wait until `key` can be taken, then take it for `ttl`; give up with
    /// [`LockError::Timeout`] after `wait.timeout`. What [`LockExt::lock`]
    /// and [`LockExt::lock_with`] call.
    ///
    /// The default watches first ([`Lock::watch_key`]), then tries, then
    /// sleeps until a change or the backoff of `wait` (the fallback poll),
    /// whichever comes first. A lock with its own queue ([`FairLock`])
    /// overrides it to wait in order.
    async fn wait_lock(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<LockHandle, LockError> {
        wait::retry_until_free(self, key, ttl, wait).await
    }
}

/// Proof of holding a lock, returned by [`Lock::try_lock`]. Treat it as
/// opaque and hand it back unchanged to [`Lock::renew`] / [`Lock::release`].
///
/// Cloning it does not copy the lock: clones are the same holder, and once
/// one of them released, all are stale.
#[derive(Clone, PartialEq, Eq)]
pub struct LockHandle {
    key: String,
    fence: u64,
    grant: Grant,
}

impl LockHandle {
    /// A handle, for [`Lock`] implementations only: `token` must be fresh
    /// and random for every grant (see [`crate::mint_token`]) and `fence`
    /// must follow the fencing rules of the [module docs](self).
    pub fn new(
        key: impl Into<String>,
        token: impl Into<String>,
        fence: u64,
        ttl: Duration,
        expires_at: SystemTime,
    ) -> Self {
        LockHandle {
            key: key.into(),
            fence,
            grant: Grant::new(token.into(), ttl, expires_at),
        }
    }

    /// The handle of a grant to `token` whose lease ends at `expires_ms`
    /// (milliseconds since the epoch, as the adapters' records keep it).
    pub(crate) fn at(key: &str, token: &str, fence: u64, ttl: Duration, expires_ms: u64) -> Self {
        Self::new(
            key,
            token,
            fence,
            ttl,
            crate::cas::record::time_at(expires_ms),
        )
    }

    /// The handle of the grant `offer` makes for `key` with `fence`: its
    /// token and lease end, the lease counted from when it was asked for.
    pub(crate) fn offered(
        key: &str,
        offer: &crate::cas::space::LeaseOffer,
        fence: u64,
        ttl: Duration,
    ) -> Self {
        Self::at(key, &offer.token, fence, ttl, offer.expires_ms).requested_at(offer.sent)
    }

    grant_accessors!("this handle");

    /// The locked key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The fencing token: strictly greater than that of every earlier holder of this key.
    pub fn fence(&self) -> u64 {
        self.fence
    }
}

impl Debug for LockHandle {
    // The token is a credential: keep it out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockHandle")
            .field("key", &self.key)
            .field("fence", &self.fence)
            .field("ttl", &self.grant.ttl)
            .field("expires_at", &self.grant.expires_at)
            .finish_non_exhaustive()
    }
}

/// Why a handle no longer holds its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The lease ran out (nobody took the lock over yet, but anyone may).
    Expired,
    /// Another holder took the lock (it has a higher fence).
    TakenOver,
    /// The lock is not held by this handle: released, never granted, or the
    /// implementation cannot tell which of the above happened.
    NotHeld,
}

impl LostReason {
    /// Why `handle` does not hold a lock whose record says `holder` holds
    /// it and `fence` is its latest grant (`None`: it holds a live lease).
    pub(crate) fn judge(
        handle: &LockHandle,
        holder: Option<&crate::cas::LeaseRecord>,
        fence: u64,
        now: u64,
    ) -> Option<LostReason> {
        match holder {
            Some(h) if h.token == handle.token() => {
                (!h.is_live(now)).then_some(LostReason::Expired)
            }
            _ if fence > handle.fence => Some(LostReason::TakenOver),
            _ => Some(LostReason::NotHeld),
        }
    }

    /// Why a handle whose grant is `grant` in a record of several grants
    /// (permits, readers) does not hold it (`None`: the grant is there and
    /// its lease is live). A grant gone from the record is `NotHeld`: such
    /// records keep no fence to tell a take-over from a release.
    pub(crate) fn of_grant(
        grant: Option<&crate::cas::LeaseRecord>,
        now: u64,
    ) -> Option<LostReason> {
        match grant {
            Some(lease) => (!lease.is_live(now)).then_some(LostReason::Expired),
            None => Some(LostReason::NotHeld),
        }
    }
}

impl std::fmt::Display for LostReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LostReason::Expired => "the lease expired",
            LostReason::TakenOver => "another holder took it over",
            LostReason::NotHeld => "it is not held by this handle",
        })
    }
}

/// Errors of [`Lock`] operations. Contention is not an error (`Ok(None)`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The handle no longer holds the lock; stop doing the protected work.
    /// Nothing was changed.
    #[error("lock {key:?} lost: {reason}")]
    Lost {
        /// The key of the handle.
        key: String,
        /// What happened.
        reason: LostReason,
    },
    /// A waiting [`LockExt::lock`] gave up: the lock stayed held by others.
    #[error("timed out after {waited:?} waiting for lock {key:?}")]
    Timeout {
        /// The key waited for.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The call was refused before touching the store (empty key, TTL under
    /// one millisecond, key too long for the store); nothing changed.
    #[error("invalid lock input: {0}")]
    Invalid(InvalidInput),
    /// The store failed (unreachable, indeterminate, malformed record,
    /// too much contention). Do not assume you hold the lock.
    #[error("lock store error: {0}")]
    Store(#[source] coord_backend::Error),
}

impl LockError {
    /// [`LockError::Lost`] for the lock `key`.
    pub fn lost(key: &str, reason: LostReason) -> Self {
        LockError::Lost {
            key: key.to_owned(),
            reason,
        }
    }

    /// Whether this is [`LockError::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. })
    }
}

crate::wake::store_errors!(LockError, waits);

/// The input checks every implementation should run first: a non-empty key
/// without NUL bytes and a TTL of at least one millisecond.
pub fn validate_lock_input(key: &str, ttl: Duration) -> Result<(), LockError> {
    if key.is_empty() {
        return Err(LockError::Invalid(InvalidInput::EmptyKey));
    }
    if key.contains('\0') {
        return Err(LockError::Invalid(InvalidInput::NulByte(key.to_owned())));
    }
    if ttl < Duration::from_millis(1) {
        return Err(LockError::Invalid(InvalidInput::Argument(format!(
            "lock ttl must be at least 1 ms, got {ttl:?}"
        ))));
    }
    Ok(())
}

/// The record of lock `key` in `space`, and now by the space's clock, for a
/// status read (one consistent read; inspection only, never a basis for a
/// decision): the key is checked first; `None` when it has no record.
pub(crate) async fn inspect_status<R: Record>(
    space: &RecordSpace,
    key: &str,
) -> Result<Option<(R, u64)>, LockError> {
    validate_lock_input(key, Duration::from_millis(1))?;
    let Some(record) = space.inspect::<R>(key).await? else {
        return Ok(None);
    };
    Ok(Some((record, space.now_millis())))
}
