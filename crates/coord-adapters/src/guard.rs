//! [`Guard`]: a grant that renews itself in the background and says when it
//! is lost. One implementation for every lease-backed grant:
//!
//! | guard | grant | from |
//! | --- | --- | --- |
//! | [`LockGuard`](crate::lock::LockGuard) | a lock | any [`Lock`](crate::lock::Lock) (generic, fair, native) |
//! | [`PermitGuard`](crate::lock::PermitGuard) | a semaphore permit | [`Semaphore`](crate::lock::Semaphore) |
//! | [`RwGuard`](crate::rwlock::RwGuard) | a read or write lock | [`RwLock`](crate::rwlock::RwLock) |
//! | [`LeadershipGuard`](crate::election::LeadershipGuard) | a leadership | [`Election`](crate::election::Election) |
//! | [`ClaimGuard`](crate::board::ClaimGuard) | a task claim | [`Board`](crate::board::Board) |
//!
//! The contract, the same for all (what Redisson's watchdog and etcd's
//! session keepalive do, plus a local deadline neither has):
//! - **renewal** every third of the TTL by default ([`GuardOptions`]), so
//!   two renewals may fail or be slow before the lease runs out;
//! - **a local deadline**: the lease counts from when the granting (or last
//!   confirmed renewing) request was *sent*, in local monotonic time. Past
//!   it the guard no longer knows it holds the grant, whatever the store
//!   says later: a pause of the process longer than the TTL (GC, VM stall,
//!   `SIGSTOP`) ends it even if no renewal failed;
//! - **the lost signal** ([`Guard::lost`], [`Guard::lost_signal`]) fires once
//!   a renewal is refused, fails, or does not answer before the deadline;
//!   renewing stops then. It comes from a background task and can lag behind
//!   a pause: [`Guard::is_valid`] cannot (it reads the clock at call time),
//!   so check it right before each protected step, and pass
//!   [`Guard::fence`] to every protected write so that one racing the
//!   signal is still refused downstream;
//! - [`Guard::release`] stops renewing (waiting out a renewal in flight),
//!   then releases; dropping the guard stops renewing and releases in a
//!   spawned task (best effort; without a tokio runtime the lease expires).
//!
//! A recipe joins by implementing [`Renew`] for its trait object.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::wake::later;

/// Options of a [`Guard`].
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

/// What a guard needs to know of a grant's lease.
#[derive(Clone, Copy, Debug)]
pub struct Lease<'a> {
    /// What is held (a lock's key, an election's name, a task's id).
    pub key: &'a str,
    /// The grant's fencing token (a leadership's term).
    pub fence: u64,
    /// The TTL a renewal extends the lease by.
    pub ttl: Duration,
    /// When the granting request was sent (local monotonic time).
    pub requested: Instant,
}

/// A source of grants a [`Guard`] can keep: renew one, release one. Object
/// safe traits implement it for their trait object (`dyn Lock`, ...).
#[async_trait]
pub trait Renew: Send + Sync {
    /// What is held (a lock handle, a permit, a leadership, a claim).
    type Held: Clone + Send + Sync + fmt::Debug + 'static;
    /// What renewing or releasing can fail with.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Extend the lease of `held` by its TTL from now, if it is still held.
    async fn renew_grant(&self, held: &Self::Held) -> Result<(), Self::Error>;

    /// Give `held` back.
    async fn release_grant(&self, held: Self::Held) -> Result<(), Self::Error>;

    /// The lease of `held`.
    fn lease(held: &Self::Held) -> Lease<'_>;

    /// The error the lost signal carries when the local deadline of `held`
    /// passed before a renewal was confirmed.
    fn expired(held: &Self::Held) -> Self::Error;

    /// Called once when a guard loses its grant: `None` when the local
    /// deadline passed, else the renewal's error (for metrics).
    fn note_loss(error: Option<&Self::Error>) {
        let _ = error;
    }
}

/// A receiver of a guard's lost signal: `None` while the grant is held,
/// then the reason once it is lost. Clone it into the tasks doing the
/// protected work and `select!` on `changed()` / `wait_for(Option::is_some)`.
pub type LostSignalOf<E> = watch::Receiver<Option<Arc<E>>>;

/// A held grant that renews itself in the background (see the
/// [module docs](self) for the contract).
pub struct Guard<R: Renew + ?Sized + 'static> {
    source: Arc<R>,
    /// `Some` until released (taken by `release` or `drop`).
    held: Option<R::Held>,
    /// Kept here so the signal never reads as "closed" while the guard lives.
    lost: watch::Sender<Option<Arc<R::Error>>>,
    renewals: Arc<AtomicU64>,
    /// The local lease estimate, moved by each confirmed renewal.
    valid_until: Arc<Mutex<Instant>>,
    task: Option<JoinHandle<()>>,
}

impl<R: Renew + ?Sized + 'static> fmt::Debug for Guard<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guard")
            .field("held", &self.held)
            .field("lost", &self.is_lost())
            .field("renewals", &self.renewals())
            .finish_non_exhaustive()
    }
}

impl<R: Renew + ?Sized + 'static> Guard<R> {
    /// Guard `held`, just granted by `source` (must run inside a tokio runtime).
    pub fn new(source: Arc<R>, held: R::Held, options: GuardOptions) -> Self {
        let lease = R::lease(&held);
        let every = options
            .renew_every
            .unwrap_or(lease.ttl / 3)
            .max(Duration::from_millis(1));
        let (lost, _) = watch::channel(None);
        let renewals = Arc::new(AtomicU64::new(0));
        let valid_until = Arc::new(Mutex::new(later(lease.requested, lease.ttl)));
        let task = tokio::spawn(renew_loop(
            source.clone(),
            held.clone(),
            every,
            lost.clone(),
            renewals.clone(),
            valid_until.clone(),
        ));
        Guard {
            source,
            held: Some(held),
            lost,
            renewals,
            valid_until,
            task: Some(task),
        }
    }

    /// The guarded grant.
    pub fn held(&self) -> &R::Held {
        self.held
            .as_ref()
            .expect("a guard's grant is only taken when the guard is consumed")
    }

    /// What is held: a lock's key, an election's name, a task's id.
    pub fn key(&self) -> &str {
        R::lease(self.held()).key
    }

    /// The fencing token of this grant (a leadership's term): pass it with
    /// every protected write.
    pub fn fence(&self) -> u64 {
        R::lease(self.held()).fence
    }

    /// Whether the grant is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Until when the lease surely lasts, in local monotonic time: the
    /// request time of the last confirmed grant or renewal plus the TTL.
    pub fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the grant is surely still held right now: not known lost,
    /// and before [`Guard::valid_until`]. Check it right before each
    /// protected step: the lost signal is sent by a background task and can
    /// lag behind (after a pause, say), this check cannot.
    pub fn is_valid(&self) -> bool {
        !self.is_lost() && Instant::now() < self.valid_until()
    }

    /// Wait until the grant is lost, and say why (never returns while it is held).
    pub async fn lost(&self) -> Arc<R::Error> {
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
    pub fn lost_signal(&self) -> LostSignalOf<R::Error> {
        self.lost.subscribe()
    }

    /// Successful background renewals so far.
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::Relaxed)
    }

    /// Stop renewing (waiting out a renewal in flight) and hand back the
    /// source and the grant without releasing it: for a last step of the
    /// grant's own (a board claim's `complete`).
    pub async fn into_parts(mut self) -> (Arc<R>, R::Held) {
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
        let held = self.held.take().expect("taken once");
        (self.source.clone(), held)
    }

    /// Stop renewing, then release the grant. Its source's error (a lock's
    /// `Lost`, a board's `LeaseLost`) when it was lost meanwhile.
    pub async fn release(mut self) -> Result<(), R::Error> {
        if let Some(task) = self.task.take() {
            task.abort();
            // Wait until no renewal is in flight, so none lands after the release.
            let _ = task.await;
        }
        let held = self.held.take().expect("released once");
        self.source.release_grant(held).await
    }
}

impl<R: Renew + ?Sized + 'static> Drop for Guard<R> {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(held) = self.held.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let source = self.source.clone();
                runtime.spawn(async move {
                    // Best effort: if this fails the lease expires on its own.
                    if let Err(error) = source.release_grant(held).await {
                        tracing::debug!(%error, "release of a dropped guard failed");
                    }
                });
            }
        }
    }
}

async fn renew_loop<R: Renew + ?Sized + 'static>(
    source: Arc<R>,
    held: R::Held,
    every: Duration,
    lost: watch::Sender<Option<Arc<R::Error>>>,
    renewals: Arc<AtomicU64>,
    shared_valid_until: Arc<Mutex<Instant>>,
) {
    let lease = R::lease(&held);
    // Our own estimate of when the lease runs out, in local monotonic time,
    // counted from when the grant was requested (not answered): past it we
    // no longer know that we hold the grant, whatever the store says later.
    let mut valid_until = later(lease.requested, lease.ttl);
    let lose = |error: Option<R::Error>| {
        R::note_loss(error.as_ref());
        let error = error.unwrap_or_else(|| R::expired(&held));
        lost.send_replace(Some(Arc::new(error)));
    };
    loop {
        tokio::time::sleep_until(later(Instant::now(), every).min(valid_until)).await;
        let sent = Instant::now();
        if sent >= valid_until {
            return lose(None);
        }
        match tokio::time::timeout_at(valid_until, source.renew_grant(&held)).await {
            Ok(Ok(())) => {
                renewals.fetch_add(1, Ordering::Relaxed);
                valid_until = later(sent, lease.ttl);
                *shared_valid_until.lock().unwrap_or_else(|e| e.into_inner()) = valid_until;
            }
            Ok(Err(error)) => return lose(Some(error)),
            Err(_) => return lose(None),
        }
    }
}
