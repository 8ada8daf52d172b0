//! A read-write lock with leases and fencing tokens (guide: docs/locks.md;
//! contract: the `rwlock` conformance suite).
//!
//! # Contract
//!
//! An [`RwLock`] grants a key to **many readers or one writer** at a time,
//! each for a TTL:
//!
//! - [`RwLock::try_read`] / [`RwLock::try_write`] answer `Ok(Some(handle))`
//!   when granted, `Ok(None)` when the key is held in a conflicting mode
//!   (contention is not a failure), `Err` when the store is broken or the
//!   input is bad ([`LockError::Invalid`]).
//! - Every grant, read or write, carries a **fence**: per key, strictly
//!   increasing across readers and writers, never reset. A writer's fence is
//!   greater than that of every holder granted before it, so a downstream
//!   that keeps the highest fence it saw refuses a stale writer.
//! - [`RwLock::renew`] extends one holder's lease and checks it still holds
//!   it; [`RwLock::release`] frees it. A stale handle (expired, released)
//!   gets [`LockError::Lost`] and changes nothing.
//! - **Writer preference.** A writer waiting in [`RwLock::write`] enters a
//!   FIFO queue kept in the record; while any live writer is queued, new
//!   readers are refused (readers already inside keep their leases until
//!   they release or expire), and writers are granted in queue order. So a
//!   stream of readers cannot starve a writer. [`RwLock::try_write`] does not
//!   queue: it succeeds only when nobody holds the key and nobody is queued.
//! - **Expired holders do not block**: a lease that ran out is ignored (and
//!   dropped from the record at the next write); a queued writer that died
//!   or was cancelled stops blocking readers when its queue entry's lease
//!   (its TTL, refreshed while it waits) runs out.
//!
//! # Boundary
//!
//! [`GenericRwLock`] decides through the [`CasEngine`](crate::CasEngine) over any backend, so
//! it is exactly as atomic as the store. One record per key
//! (`<prefix><key>`, default `rwlock/`) holds the fence counter, the live
//! holders and the queued writers: its size is bounded by the number of live
//! holders and waiters. The record is never deleted, so the fence survives.
//! Expiry is judged with the adapter's [`Clock`](coord_backend::Clock), with the same caveat as
//! [`crate::lock`]: skewed clocks can end a lease early, the fence still
//! orders holders.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use coord_adapters::rwlock::{GenericRwLock, RwLock};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let rw = GenericRwLock::new(Arc::new(SingleProcessMemoryBackend::new("demo")?));
//! let ttl = Duration::from_secs(30);
//! let r1 = rw.try_read("config", ttl).await?.expect("free");
//! let r2 = rw.try_read("config", ttl).await?.expect("readers share");
//! assert!(rw.try_write("config", ttl).await?.is_none()); // readers inside
//! rw.release(r1).await?;
//! rw.release(r2).await?;
//! let w = rw.try_write("config", ttl).await?.expect("free again");
//! assert!(w.fence() > 2);
//! # rw.release(w).await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use coord_backend::Backend;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::cas::{
    record_kind, record_options, whole_millis, CasStats, LeaseRecord, Nonce, RecordSpace, Verdict,
};
use crate::lock::{inspect_status, validate_lock_input, LockError, LockHandle, LostReason};
use crate::mint_token;
use crate::wake::WaitError;

/// Whether a holder reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RwMode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

impl RwMode {
    /// `read` or `write` (also the `mode` label of the metrics).
    pub fn label(self) -> &'static str {
        match self {
            RwMode::Read => "read",
            RwMode::Write => "write",
        }
    }
}

impl std::fmt::Display for RwMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Proof of holding a key in one mode, returned by the grants of an
/// [`RwLock`]. Hand it back unchanged to [`RwLock::renew`] / [`RwLock::release`].
/// Its `Debug` output leaves out the token (a credential).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RwHandle {
    mode: RwMode,
    lease: LockHandle,
}

impl RwHandle {
    /// A handle, for [`RwLock`] implementations only (same rules as [`LockHandle::new`]).
    pub fn new(mode: RwMode, lease: LockHandle) -> Self {
        RwHandle { mode, lease }
    }

    /// Read or write.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// The key.
    pub fn key(&self) -> &str {
        self.lease.key()
    }

    /// The fencing token: strictly greater than that of every earlier grant of this key.
    pub fn fence(&self) -> u64 {
        self.lease.fence()
    }

    /// The TTL the grant was taken with.
    pub fn ttl(&self) -> Duration {
        self.lease.ttl()
    }

    /// When the lease granted at acquisition expires (renewals extend the stored lease).
    pub fn expires_at(&self) -> SystemTime {
        self.lease.expires_at()
    }

    /// The lease underneath (key, token, fence, TTL), for implementations.
    pub fn lease(&self) -> &LockHandle {
        &self.lease
    }

    /// When the granting request was sent (local monotonic time): the lease
    /// is surely over at this instant plus the TTL.
    pub fn requested_instant(&self) -> Instant {
        self.lease.requested_instant()
    }
}

/// A held read or write lock that renews itself in the background (the
/// [`Guard`](crate::guard::Guard) of an [`RwLock`]; see [`crate::guard`]).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::rwlock::{GenericRwLock, RwGuard, RwLock};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let rw: Arc<dyn RwLock> = Arc::new(GenericRwLock::new(Arc::new(SingleProcessMemoryBackend::new("demo")?)));
/// let reading = RwGuard::try_read(&rw, "catalog", Duration::from_secs(30)).await?.expect("no writer");
/// assert!(RwGuard::try_write(&rw, "catalog", Duration::from_secs(30)).await?.is_none());
/// reading.release().await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub type RwGuard = crate::guard::Guard<dyn RwLock>;

#[async_trait]
impl<'a> crate::guard::Renew for dyn RwLock + 'a {
    type Held = RwHandle;
    type Error = LockError;

    async fn renew_grant(&self, held: &RwHandle) -> Result<(), LockError> {
        self.renew(held).await
    }

    async fn release_grant(&self, held: RwHandle) -> Result<(), LockError> {
        self.release(held).await
    }

    fn lease(held: &RwHandle) -> crate::guard::Lease<'_> {
        crate::guard::Lease {
            key: held.key(),
            fence: held.fence(),
            ttl: held.ttl(),
            requested: held.requested_instant(),
        }
    }

    fn expired(held: &RwHandle) -> LockError {
        LockError::lost(held.key(), LostReason::Expired)
    }
}

impl crate::guard::Guard<dyn RwLock> {
    /// Take `key` for reading if no writer holds it or waits, and guard it.
    pub async fn try_read(
        rw: &Arc<dyn RwLock>,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Self>, LockError> {
        Ok(rw
            .try_read(key, ttl)
            .await?
            .map(|h| Self::new(rw.clone(), h, crate::guard::GuardOptions::default())))
    }

    /// Take `key` for writing if nobody holds it, and guard it.
    pub async fn try_write(
        rw: &Arc<dyn RwLock>,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<Self>, LockError> {
        Ok(rw
            .try_write(key, ttl)
            .await?
            .map(|h| Self::new(rw.clone(), h, crate::guard::GuardOptions::default())))
    }

    /// The guarded handle.
    pub fn handle(&self) -> &RwHandle {
        self.held()
    }
}

/// A read-write lock service; see the [module docs](self) for the contract
/// (checked by `coord_conformance::rwlock`). Object safe.
#[async_trait]
pub trait RwLock: Send + Sync + Debug {
    /// Take `key` for reading if no writer holds it and none is queued.
    async fn try_read(&self, key: &str, ttl: Duration) -> Result<Option<RwHandle>, LockError>;

    /// Take `key` for writing if nobody holds it and no writer is queued.
    async fn try_write(&self, key: &str, ttl: Duration) -> Result<Option<RwHandle>, LockError>;

    /// Wait up to `timeout` to read `key` ([`LockError::Timeout`] after it).
    async fn read(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RwHandle, LockError>;

    /// Wait up to `timeout` to write `key`, queued (see the module docs);
    /// [`LockError::Timeout`] after it, leaving the queue.
    async fn write(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RwHandle, LockError>;

    /// Extend the lease of `handle` by its TTL from now, if it still holds.
    async fn renew(&self, handle: &RwHandle) -> Result<(), LockError>;

    /// Give the grant up; a stale handle gets [`LockError::Lost`], nothing changes.
    async fn release(&self, handle: RwHandle) -> Result<(), LockError>;

    /// What the store holds for `key` (inspection only, never a basis for a
    /// decision); `Ok(None)` when the key was never granted.
    async fn status(&self, key: &str) -> Result<Option<RwStatus>, LockError>;
}

/// One holder as shown by [`RwLock::status`] (no token: it is a credential).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwHolderStatus {
    /// Read or write.
    pub mode: RwMode,
    /// The fence of its grant.
    pub fence: u64,
    /// When its lease ends.
    pub expires_at: SystemTime,
    /// Whether its lease is unexpired now, by the adapter's clock.
    pub live: bool,
}

/// What the store holds for one read-write lock key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RwStatus {
    /// The key, without the record prefix.
    pub key: String,
    /// The fence of the latest grant.
    pub fence: u64,
    /// The holders in the record (expired ones stay until the next write).
    pub holders: Vec<RwHolderStatus>,
    /// Live writers queued in [`RwLock::write`].
    pub queued_writers: usize,
}

record_options! {
    /// Options of a [`GenericRwLock`].
    pub struct RwLockOptions, prefix "rwlock/" {
        /// Longest sleep of a waiting call between two attempts when no change
        /// notification wakes it (the fallback poll; default 250 ms).
        pub max_poll: Duration = Duration::from_millis(250), set by with_max_poll,
    }
}

/// What is stored under `<prefix><key>`.
#[derive(Serialize, Deserialize, Default)]
struct RwRecord {
    /// The fence of the latest grant (0 = never granted).
    fence: u64,
    /// Current holders (at most one writer, and then no reader).
    holders: Vec<RwHolder>,
    /// Writers waiting in `write`, first come first served.
    #[serde(default)]
    queue: Vec<Queued>,
    /// Fresh per write (see the CAS engine on indeterminate txns).
    nonce: Nonce,
}

record_kind!(RwRecord, "a read-write lock record");

#[derive(Serialize, Deserialize, Clone)]
struct RwHolder {
    mode: RwMode,
    fence: u64,
    #[serde(flatten)]
    lease: LeaseRecord,
}

#[derive(Serialize, Deserialize, Clone)]
struct Queued {
    token: String,
    expires_ms: u64,
}

impl Debug for RwRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RwRecord")
            .field("fence", &self.fence)
            .field("holders", &self.holders.len())
            .field("queue", &self.queue.len())
            .finish_non_exhaustive()
    }
}

impl RwRecord {
    /// Drop expired holders and queue entries: the record stays bounded by
    /// the live ones.
    fn prune(&mut self, now: u64) {
        self.holders.retain(|h| h.lease.is_live(now));
        self.queue.retain(|q| q.expires_ms > now);
    }
}

/// An [`RwLock`] over any [`Backend`], decided through the [`CasEngine`](crate::CasEngine).
#[derive(Clone, Debug)]
pub struct GenericRwLock {
    space: RecordSpace,
    max_poll: Duration,
}

/// The outcome of one grant decision.
enum Grant {
    Granted(RwHandle),
    Refused,
}

/// The fallback pause of a waiting call after `attempts` refusals: 5 ms
/// doubling up to `max`, half fixed and half random so waiters spread out.
pub(crate) fn fallback_pause(attempts: u32, max: Duration) -> Duration {
    let cap = Duration::from_millis(5)
        .saturating_mul(1u32 << attempts.min(16))
        .min(max.max(Duration::from_millis(1)));
    cap / 2 + (cap / 2).mul_f64(crate::jitter::unit())
}

impl GenericRwLock {
    /// A read-write lock over `backend` with default options.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, RwLockOptions::default())
    }

    /// A read-write lock over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: RwLockOptions) -> Self {
        GenericRwLock {
            space: options.space(backend),
            max_poll: options.max_poll,
        }
    }

    /// The record prefix (`rwlock/` by default).
    pub fn key_prefix(&self) -> &str {
        self.space.prefix()
    }

    /// Store calls made so far.
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    /// One grant decision. `queued`: the token of this caller's queue entry
    /// when it waits in `write` (a refused waiting writer joins or refreshes
    /// the queue in the same txn).
    async fn attempt(
        &self,
        key: &str,
        ttl: Duration,
        mode: RwMode,
        queued: Option<&str>,
    ) -> Result<Grant, LockError> {
        validate_lock_input(key, ttl)?;
        let offer = self.space.offer(ttl);
        let answer: Result<Grant, LockError> = self
            .space
            .decide_record(key, |record: Option<RwRecord>| {
                let mut record = record.unwrap_or_default();
                record.prune(offer.now);
                let first_in_queue = record.queue.first().map(|q| q.token.as_str());
                let free = match mode {
                    RwMode::Read => {
                        record.queue.is_empty()
                            && record.holders.iter().all(|h| h.mode == RwMode::Read)
                    }
                    RwMode::Write => {
                        record.holders.is_empty()
                            && (first_in_queue.is_none() || first_in_queue == queued)
                    }
                };
                if !free {
                    let Some(waiter) = queued else {
                        return Ok(Verdict::Keep(Grant::Refused));
                    };
                    // Join the queue, or refresh an entry past half its lease.
                    match record.queue.iter_mut().find(|q| q.token == waiter) {
                        Some(q)
                            if q.expires_ms >= offer.now.saturating_add(whole_millis(ttl) / 2) =>
                        {
                            return Ok(Verdict::Keep(Grant::Refused));
                        }
                        Some(q) => q.expires_ms = offer.expires_ms,
                        None => record.queue.push(Queued {
                            token: waiter.to_owned(),
                            expires_ms: offer.expires_ms,
                        }),
                    }
                    return Ok(Verdict::Write(record, Grant::Refused));
                }
                if let Some(waiter) = queued {
                    record.queue.retain(|q| q.token != waiter);
                }
                record.fence += 1;
                record.holders.push(RwHolder {
                    mode,
                    fence: record.fence,
                    lease: LeaseRecord::new(offer.token.clone(), offer.expires_ms),
                });
                let handle = LockHandle::offered(key, &offer, record.fence, ttl);
                Ok(Verdict::Write(
                    record,
                    Grant::Granted(RwHandle::new(mode, handle)),
                ))
            })
            .await;
        if answer.as_ref().is_err_and(|e| e.is_indeterminate()) {
            self.withdraw(key, &offer.token, queued).await;
        }
        answer
    }

    /// Withdraw the grant offered with `token` (and the queue entry of
    /// `queued`) after an indeterminate attempt: it may have landed, or may
    /// still land, and nobody would know of it until its lease ran out.
    async fn withdraw(&self, key: &str, token: &str, queued: Option<&str>) {
        let now = self.space.now_millis();
        let withdrawn: Result<(), LockError> = self
            .space
            .decide_record(key, |record: Option<RwRecord>| {
                // Written even when nothing here is ours: the write moves
                // the record on, so a copy of the grant still in flight can
                // no longer apply.
                let mut record = record.unwrap_or_default();
                record.holders.retain(|h| h.lease.token != token);
                record.queue.retain(|q| Some(q.token.as_str()) != queued);
                record.prune(now);
                Ok(Verdict::Write(record, ()))
            })
            .await;
        if let Err(error) = withdrawn {
            tracing::debug!(%error, "could not withdraw a grant made in doubt: it expires with its lease");
        }
    }

    /// Leave the write queue (best effort: an entry left behind expires).
    async fn leave_queue(&self, key: &str, waiter: &str) -> Result<(), LockError> {
        self.space
            .decide_record(key, |record: Option<RwRecord>| {
                let Some(mut record) = record else {
                    return Ok(Verdict::Keep(()));
                };
                if !record.queue.iter().any(|q| q.token == waiter) {
                    return Ok(Verdict::Keep(()));
                }
                record.queue.retain(|q| q.token != waiter);
                Ok(Verdict::Write(record, ()))
            })
            .await
    }

    /// One attempt without waiting (`try_read`, `try_write`).
    async fn try_once(
        &self,
        key: &str,
        ttl: Duration,
        mode: RwMode,
    ) -> Result<Option<RwHandle>, LockError> {
        match self.attempt(key, ttl, mode, None).await? {
            Grant::Granted(handle) => {
                crate::telemetry::rwlock_acquired(mode.label());
                Ok(Some(handle))
            }
            Grant::Refused => Ok(None),
        }
    }

    async fn wait(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
        mode: RwMode,
    ) -> Result<RwHandle, LockError> {
        validate_lock_input(key, ttl)?;
        let started = Instant::now();
        let deadline = crate::wake::later(started, timeout);
        // Watch first, read second, wait third (see `Wake`).
        let mut wake = self.space.watch(key).await;
        let waiter = (mode == RwMode::Write).then(mint_token);
        let mut attempts = 0u32;
        loop {
            let answer = self.attempt(key, ttl, mode, waiter.as_deref()).await;
            match answer {
                Ok(Grant::Granted(handle)) => {
                    crate::telemetry::rwlock_acquired(mode.label());
                    return Ok(handle);
                }
                Ok(Grant::Refused) => {}
                // Contention (every txn lost its race) is no failure: wait on.
                Err(error) if error.is_contention() => {}
                Err(error) => {
                    if let Some(waiter) = &waiter {
                        let _ = self.leave_queue(key, waiter).await;
                    }
                    return Err(error);
                }
            }
            let now = Instant::now();
            if now >= deadline {
                if let Some(waiter) = &waiter {
                    // Leave the queue so readers are not held up by a writer
                    // that gave up; if this fails the entry expires.
                    if let Err(error) = self.leave_queue(key, waiter).await {
                        tracing::debug!(%error, "could not leave the write queue; it expires");
                    }
                }
                return Err(LockError::Timeout {
                    key: key.to_owned(),
                    waited: now - started,
                });
            }
            attempts += 1;
            // A queued writer refreshes its queue entry when it polls: poll
            // well inside its TTL so the entry never lapses while it waits.
            let max = self.max_poll.min(ttl / 4).max(Duration::from_millis(1));
            if let Err(refused) = wake
                .until((now + fallback_pause(attempts, max)).min(deadline))
                .await
            {
                if let Some(waiter) = &waiter {
                    let _ = self.leave_queue(key, waiter).await;
                }
                return Err(refused.into());
            }
        }
    }

    /// Why `handle` does not hold a live grant in `record` (None = it does).
    fn why_not_held(handle: &RwHandle, record: Option<&RwRecord>, now: u64) -> Option<LostReason> {
        let holder = record.and_then(|r| {
            r.holders
                .iter()
                .find(|h| h.lease.token == handle.lease.token() && h.mode == handle.mode)
        });
        LostReason::of_grant(holder.map(|h| &h.lease), now)
    }

    /// Renew (`Some(now)`) or release (`None`) the grant of `handle`.
    async fn change_holder(&self, handle: &RwHandle, renew: bool) -> Result<(), LockError> {
        validate_lock_input(handle.key(), handle.ttl())?;
        let now = self.space.now_millis();
        self.space
            .decide_record(handle.key(), |record: Option<RwRecord>| {
                if let Some(reason) = Self::why_not_held(handle, record.as_ref(), now) {
                    return Err(LockError::lost(handle.key(), reason));
                }
                let mut record = record.expect("held implies a record");
                let token = handle.lease.token();
                if renew {
                    for h in record.holders.iter_mut().filter(|h| h.lease.token == token) {
                        h.lease
                            .extend(now.saturating_add(whole_millis(handle.ttl())));
                    }
                } else {
                    record.holders.retain(|h| h.lease.token != token);
                }
                record.prune(now);
                Ok(Verdict::Write(record, ()))
            })
            .await
    }
}

#[async_trait]
impl RwLock for GenericRwLock {
    #[tracing::instrument(name = "rwlock.try_read", skip_all, fields(key = %key))]
    async fn try_read(&self, key: &str, ttl: Duration) -> Result<Option<RwHandle>, LockError> {
        self.try_once(key, ttl, RwMode::Read).await
    }

    #[tracing::instrument(name = "rwlock.try_write", skip_all, fields(key = %key))]
    async fn try_write(&self, key: &str, ttl: Duration) -> Result<Option<RwHandle>, LockError> {
        self.try_once(key, ttl, RwMode::Write).await
    }

    #[tracing::instrument(name = "rwlock.read", skip_all, fields(key = %key))]
    async fn read(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RwHandle, LockError> {
        self.wait(key, ttl, timeout, RwMode::Read).await
    }

    #[tracing::instrument(name = "rwlock.write", skip_all, fields(key = %key))]
    async fn write(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RwHandle, LockError> {
        self.wait(key, ttl, timeout, RwMode::Write).await
    }

    #[tracing::instrument(name = "rwlock.renew", skip_all, fields(key = %handle.key(), fence = handle.fence()))]
    async fn renew(&self, handle: &RwHandle) -> Result<(), LockError> {
        let renewed = self.change_holder(handle, true).await;
        if let Err(LockError::Lost { reason, .. }) = &renewed {
            crate::telemetry::rwlock_lost(reason.label());
        }
        renewed
    }

    #[tracing::instrument(name = "rwlock.release", skip_all, fields(key = %handle.key(), fence = handle.fence()))]
    async fn release(&self, handle: RwHandle) -> Result<(), LockError> {
        self.change_holder(&handle, false).await
    }

    async fn status(&self, key: &str) -> Result<Option<RwStatus>, LockError> {
        let status = inspect_status::<RwRecord>(&self.space, key).await?;
        Ok(status.map(|(record, now)| RwStatus {
            key: key.to_owned(),
            fence: record.fence,
            holders: record
                .holders
                .iter()
                .map(|h| RwHolderStatus {
                    mode: h.mode,
                    fence: h.fence,
                    expires_at: h.lease.expires_at(),
                    live: h.lease.is_live(now),
                })
                .collect(),
            queued_writers: record.queue.iter().filter(|q| q.expires_ms > now).count(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_backend::{BackendExt, ManualClock};
    use coord_memory::SingleProcessMemoryBackend;

    fn rw(backend: Arc<dyn Backend>, clock: Arc<ManualClock>) -> GenericRwLock {
        GenericRwLock::with_options(backend, RwLockOptions::default().with_clock(clock))
    }

    /// An engine that gives up at the first rejected txn: every race lost
    /// is `ConflictRetriesExhausted`, which a waiting call must wait through.
    fn one_try() -> crate::cas::CasOptions {
        crate::cas::CasOptions {
            max_attempts: 1,
            ..crate::cas::CasOptions::default()
        }
    }

    #[tokio::test]
    async fn waiting_calls_wait_through_contention() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("rw").unwrap());
        let holder = GenericRwLock::new(backend.clone());
        let reader = holder
            .try_read("k", Duration::from_secs(30))
            .await
            .unwrap()
            .unwrap();
        // Its cache has never seen the key: its first txn is rejected, and with
        // one try that is contention, not an answer.
        let writer =
            GenericRwLock::with_options(backend, RwLockOptions::default().with_cas(one_try()));
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            holder.release(reader).await
        });
        let ttl = Duration::from_secs(30);
        let written = writer.write("k", ttl, Duration::from_secs(20)).await;
        assert!(written.is_ok(), "the writer gave up: {written:?}");
        release.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn record_holds_only_live_holders_and_keeps_the_fence() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("rw").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        let lock = rw(backend.clone(), clock.clone());
        let ttl = Duration::from_secs(5);
        for _ in 0..10 {
            let h = lock.try_read("k", ttl).await.unwrap().unwrap();
            lock.release(h).await.unwrap();
        }
        let _expiring = lock.try_read("k", ttl).await.unwrap().unwrap();
        clock.advance(ttl);
        let w = lock.try_write("k", ttl).await.unwrap().unwrap();
        assert_eq!(w.fence(), 12);
        let stored = backend.get("rwlock/k").await.unwrap().value.unwrap();
        let record: RwRecord = serde_json::from_slice(&stored).unwrap();
        assert_eq!((record.fence, record.holders.len()), (12, 1));
        assert!(!format!("{record:?}").contains(w.lease().token()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_writer_keeps_its_place_past_its_ttl() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("rw").unwrap());
        // Real time, and a fallback poll far longer than the writer's TTL:
        // only polling inside the TTL keeps its queue entry alive.
        let options = RwLockOptions::default().with_max_poll(Duration::from_secs(30));
        let lock = Arc::new(GenericRwLock::with_options(backend, options));
        let r = lock
            .try_read("k", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        let writer = lock.clone();
        let waiting = tokio::spawn(async move {
            writer
                .write("k", Duration::from_secs(1), Duration::from_secs(60))
                .await
        });
        while lock.status("k").await.unwrap().unwrap().queued_writers == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let queued_at = Instant::now();
        while queued_at.elapsed() < Duration::from_secs(3) {
            let status = lock.status("k").await.unwrap().unwrap();
            assert_eq!(status.queued_writers, 1, "the queue entry lapsed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        lock.release(r).await.unwrap();
        let w = waiting.await.unwrap().unwrap();
        assert_eq!((w.mode(), w.fence()), (RwMode::Write, 2));
    }

    #[tokio::test]
    async fn a_cancelled_waiting_writer_stops_blocking_readers_after_its_ttl() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("rw").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        let lock = rw(backend, clock.clone());
        let ttl = Duration::from_secs(5);
        let r = lock.try_read("k", ttl).await.unwrap().unwrap();
        // The writer queues, then is cancelled without leaving the queue.
        let waiting = tokio::time::timeout(
            Duration::from_millis(50),
            lock.write("k", ttl, Duration::from_secs(60)),
        )
        .await;
        assert!(waiting.is_err(), "the writer must still be waiting");
        assert_eq!(lock.status("k").await.unwrap().unwrap().queued_writers, 1);
        assert!(lock.try_read("k", ttl).await.unwrap().is_none());
        lock.release(r).await.unwrap();
        clock.advance(ttl);
        assert!(lock.try_read("k", ttl).await.unwrap().is_some());
    }
}
