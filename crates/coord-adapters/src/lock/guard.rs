//! [`LockGuard`] and [`PermitGuard`]: a held lock or semaphore permit that
//! renews itself and says when it is lost (the [`Guard`] of every grant,
//! see [`crate::guard`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::Lock;
use super::{LockError, LockExt, LockHandle, LostReason, Permit, Semaphore, WaitOptions};
pub use crate::guard::GuardOptions;
use crate::guard::{Guard, Lease, LostSignalOf, Renew};

/// A receiver of the "lost" signal of a [`LockGuard`] or [`PermitGuard`]:
/// `None` while held, then the reason once lost.
pub type LostSignal = LostSignalOf<LockError>;

/// A held lock that renews itself in the background every ~TTL/3 (the
/// [`Guard`] of a [`Lock`]).
///
/// The moment a renewal fails (lost, expired, taken over, store error) or
/// does not answer before the lease would have run out, the guard stops
/// renewing and fires its **lost signal** ([`LockGuard::lost`],
/// [`LockGuard::lost_signal`]): stop the protected work then, and fence every
/// write with [`LockGuard::fence`] so that a write that races the signal is
/// still refused downstream.
///
/// [`LockGuard::release`] stops renewing, then releases. Dropping the guard
/// stops renewing and releases in a spawned task (best effort; when no tokio
/// runtime is running, the lease simply expires).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::lock::{GenericLock, Lock, LockGuard};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let lock: Arc<dyn Lock> = Arc::new(GenericLock::new(Arc::new(SingleProcessMemoryBackend::new("demo")?)));
/// let guard = LockGuard::acquire(&lock, "compaction", Duration::from_secs(30), Duration::from_secs(5)).await?;
/// let fence = guard.fence();
/// tokio::select! {
///     lost = guard.lost() => panic!("lock lost: {lost}"),
///     _ = async { /* the protected work, passing `fence` to every write */ } => {}
/// }
/// guard.release().await?;
/// # let _ = fence;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub type LockGuard = Guard<dyn Lock>;

fn lock_lease(handle: &LockHandle) -> Lease<'_> {
    Lease {
        key: handle.key(),
        fence: handle.fence(),
        ttl: handle.ttl(),
        requested: handle.requested_instant(),
    }
}

fn note_lock_loss(error: Option<&LockError>) {
    match error {
        None => crate::telemetry::lock_lost("expired"),
        // A `Lost` answer was counted by the lock's own `renew`.
        Some(error) if !error.is_lost() => crate::telemetry::lock_lost("error"),
        Some(_) => {}
    }
}

#[async_trait]
impl<'a> Renew for dyn Lock + 'a {
    type Held = LockHandle;
    type Error = LockError;

    async fn renew_grant(&self, held: &LockHandle) -> Result<(), LockError> {
        self.renew(held).await
    }

    async fn release_grant(&self, held: LockHandle) -> Result<(), LockError> {
        self.release(held).await
    }

    fn lease(held: &LockHandle) -> Lease<'_> {
        lock_lease(held)
    }

    fn expired(held: &LockHandle) -> LockError {
        LockError::lost(held.key(), LostReason::Expired)
    }

    fn note_loss(error: Option<&LockError>) {
        note_lock_loss(error)
    }
}

impl Guard<dyn Lock> {
    /// Take `key` if it is free and guard it; `Ok(None)` when someone else holds it.
    pub async fn try_acquire(
        lock: &Arc<dyn Lock>,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Self>, LockError> {
        Ok(lock
            .try_lock(key, ttl)
            .await?
            .map(|handle| Self::new(lock.clone(), handle, GuardOptions::default())))
    }

    /// Wait up to `timeout` for `key` (see [`LockExt::lock`]) and guard it.
    pub async fn acquire(
        lock: &Arc<dyn Lock>,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Self, LockError> {
        Self::acquire_with(
            lock,
            key,
            ttl,
            &WaitOptions::with_timeout(timeout),
            GuardOptions::default(),
        )
        .await
    }

    /// [`LockGuard::acquire`] with explicit wait and guard options.
    pub async fn acquire_with(
        lock: &Arc<dyn Lock>,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
        options: GuardOptions,
    ) -> Result<Self, LockError> {
        let handle = lock.lock_with(key, ttl, wait).await?;
        Ok(Self::new(lock.clone(), handle, options))
    }

    /// The guarded handle.
    pub fn handle(&self) -> &LockHandle {
        self.held()
    }
}

/// A held semaphore permit that renews itself in the background (the
/// [`Guard`] of a [`Semaphore`]; the same contract as [`LockGuard`]).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::lock::{GenericSemaphore, PermitGuard, Semaphore};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let semaphore: Arc<dyn Semaphore> =
///     Arc::new(GenericSemaphore::new(Arc::new(SingleProcessMemoryBackend::new("demo")?)));
/// let permit = PermitGuard::try_acquire(&semaphore, "api-quota", 2, Duration::from_secs(30))
///     .await?
///     .expect("a free permit");
/// assert!(permit.is_valid());
/// permit.release().await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub type PermitGuard = Guard<dyn Semaphore>;

#[async_trait]
impl<'a> Renew for dyn Semaphore + 'a {
    type Held = Permit;
    type Error = LockError;

    async fn renew_grant(&self, held: &Permit) -> Result<(), LockError> {
        self.renew(held).await
    }

    async fn release_grant(&self, held: Permit) -> Result<(), LockError> {
        self.release(held).await
    }

    fn lease(held: &Permit) -> Lease<'_> {
        lock_lease(held)
    }

    fn expired(held: &Permit) -> LockError {
        LockError::lost(held.key(), LostReason::Expired)
    }

    fn note_loss(error: Option<&LockError>) {
        note_lock_loss(error)
    }
}

impl Guard<dyn Semaphore> {
    /// Take one of `permits` permits of `key` if one is free and guard it.
    pub async fn try_acquire(
        semaphore: &Arc<dyn Semaphore>,
        key: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Option<Self>, LockError> {
        Ok(semaphore
            .try_acquire(key, permits, ttl)
            .await?
            .map(|permit| Self::new(semaphore.clone(), permit, GuardOptions::default())))
    }

    /// Wait for a permit (see [`Semaphore::acquire`]) and guard it.
    pub async fn acquire(
        semaphore: &Arc<dyn Semaphore>,
        key: &str,
        permits: u32,
        ttl: Duration,
        wait: &WaitOptions,
        options: GuardOptions,
    ) -> Result<Self, LockError> {
        let permit = semaphore.acquire(key, permits, ttl, wait).await?;
        Ok(Self::new(semaphore.clone(), permit, options))
    }

    /// The guarded permit.
    pub fn permit(&self) -> &Permit {
        self.held()
    }
}
