//! [`LockGuard`]: a held lock that renews itself and says when it is lost.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Lock, LockError, LockExt, LockHandle, LostReason, WaitOptions};
use crate::wake::later;

/// Options of a [`LockGuard`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct GuardOptions {
    /// Renew this often (default: a third of the TTL, so two renewals may
    /// fail or be slow before the lease runs out).
    pub renew_every: Option<Duration>,
}

coord_backend::setters! {
    GuardOptions {
        /// Renew every `every` instead of every third of the TTL.
        with_renew_every(every: Duration) => renew_every = Some(every);
    }
}

/// A receiver of the "lost" signal: `None` while the lock is held, then the
/// reason once it is lost. Clone it into the tasks doing the protected work
/// and `select!` on `changed()` / `wait_for(Option::is_some)`.
pub type LostSignal = watch::Receiver<Option<Arc<LockError>>>;

/// A held lock that renews itself in the background every ~TTL/3.
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
#[derive(Debug)]
pub struct LockGuard {
    lock: Arc<dyn Lock>,
    /// `Some` until released (taken by `release` or `drop`).
    handle: Option<LockHandle>,
    /// Kept here so the signal never reads as "closed" while the guard lives.
    lost: watch::Sender<Option<Arc<LockError>>>,
    renewals: Arc<AtomicU64>,
    /// The local lease estimate, moved by each confirmed renewal.
    valid_until: Arc<Mutex<Instant>>,
    task: Option<JoinHandle<()>>,
}

impl LockGuard {
    /// Guard a handle just acquired from `lock` (must run inside a tokio runtime).
    pub fn new(lock: Arc<dyn Lock>, handle: LockHandle, options: GuardOptions) -> Self {
        let ttl = handle.ttl();
        let every = options
            .renew_every
            .unwrap_or(ttl / 3)
            .max(Duration::from_millis(1));
        let (lost, _) = watch::channel(None);
        let renewals = Arc::new(AtomicU64::new(0));
        let valid_until = Arc::new(Mutex::new(later(handle.requested_instant(), ttl)));
        let task = tokio::spawn(renew_loop(
            lock.clone(),
            handle.clone(),
            every,
            lost.clone(),
            renewals.clone(),
            valid_until.clone(),
        ));
        LockGuard {
            lock,
            handle: Some(handle),
            lost,
            renewals,
            valid_until,
            task: Some(task),
        }
    }

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

    fn held(&self) -> &LockHandle {
        self.handle
            .as_ref()
            .expect("a guard's handle is only taken when the guard is consumed")
    }

    /// The guarded handle.
    pub fn handle(&self) -> &LockHandle {
        self.held()
    }

    /// The locked key.
    pub fn key(&self) -> &str {
        self.held().key()
    }

    /// The fencing token of this grant: pass it with every protected write.
    pub fn fence(&self) -> u64 {
        self.held().fence()
    }

    /// Whether the lock is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Until when the lease surely lasts, in local monotonic time: the
    /// request time of the last confirmed grant or renewal plus the TTL.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the lock is surely still held right now: not known lost, and
    /// before [`LockGuard::valid_until`]. Check it right before each
    /// protected step: the lost signal is sent by a background task and can
    /// lag behind (after a pause, say), this check cannot.
    pub fn is_valid(&self) -> bool {
        !self.is_lost() && Instant::now() < self.valid_until()
    }

    /// Wait until the lock is lost, and say why (never returns while it is held).
    pub async fn lost(&self) -> Arc<LockError> {
        let mut signal = self.lost.subscribe();
        let reason = match signal.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            // Unreachable while `self.lost` lives; never claim a loss we did not see.
            None => std::future::pending().await,
        }
    }

    /// A receiver of the lost signal, to hand to other tasks.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.subscribe()
    }

    /// Successful background renewals so far.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Stop renewing, then release the lock. `Err(Lost)` when it was lost meanwhile.
    pub async fn release(mut self) -> Result<(), LockError> {
        if let Some(task) = self.task.take() {
            task.abort();
            // Wait until no renewal is in flight, so none lands after the release.
            let _ = task.await;
        }
        let handle = self.handle.take().expect("released once");
        self.lock.release(handle).await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(handle) = self.handle.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let lock = self.lock.clone();
                runtime.spawn(async move {
                    // Best effort: if this fails the lease expires on its own.
                    if let Err(error) = lock.release(handle).await {
                        tracing::debug!(%error, "release of a dropped lock guard failed");
                    }
                });
            }
        }
    }
}

async fn renew_loop(
    lock: Arc<dyn Lock>,
    handle: LockHandle,
    every: Duration,
    lost: watch::Sender<Option<Arc<LockError>>>,
    renewals: Arc<AtomicU64>,
    shared_valid_until: Arc<Mutex<Instant>>,
) {
    let ttl = handle.ttl();
    // Our own estimate of when the lease runs out, in local monotonic time,
    // counted from when the grant was requested (not answered): past it we
    // no longer know that we hold the lock, whatever the store says later.
    let mut valid_until = later(handle.requested_instant(), ttl);
    let lose = |error: LockError| {
        lost.send_replace(Some(Arc::new(error)));
    };
    loop {
        tokio::time::sleep_until(later(Instant::now(), every).min(valid_until)).await;
        let sent = Instant::now();
        if sent >= valid_until {
            crate::telemetry::lock_lost("expired");
            return lose(LockError::lost(handle.key(), LostReason::Expired));
        }
        match tokio::time::timeout_at(valid_until, lock.renew(&handle)).await {
            Ok(Ok(())) => {
                renewals.fetch_add(1, Ordering::Relaxed);
                valid_until = later(sent, ttl);
                *shared_valid_until.lock().unwrap_or_else(|e| e.into_inner()) = valid_until;
            }
            Ok(Err(error)) => {
                // A `Lost` answer was counted by the lock's own `renew`.
                if !error.is_lost() {
                    crate::telemetry::lock_lost("error");
                }
                return lose(error);
            }
            Err(_) => {
                crate::telemetry::lock_lost("expired");
                return lose(LockError::lost(handle.key(), LostReason::Expired));
            }
        }
    }
}
