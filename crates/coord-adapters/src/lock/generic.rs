//! [`GenericLock`]: the lock decided over the three primitives of any backend.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use coord_backend::Backend;
use serde::{Deserialize, Serialize};

use super::{inspect_status, validate_lock_input, Lock, LockError, LockHandle, LostReason};
use crate::cas::{
    record_kind, record_options, whole_millis, CasStats, LeaseRecord, Nonce, RecordSpace, Verdict,
};
use crate::telemetry;
use crate::wake::Wake;

record_options! {
    /// Options of a [`GenericLock`].
    pub struct LockOptions, prefix "lock/" {}
}

/// A [`Lock`] over any [`Backend`]: one record per key (`<prefix><key>`)
/// holding the fence counter and the current holder, decided through the
/// [`CasEngine`](crate::CasEngine).
///
/// Costs, once the engine has seen the key: an uncontended `try_lock`,
/// `renew` or `release` is one txn (one round trip). A `try_lock` that finds
/// the lock held costs one assert-only txn (a remembered "held" is confirmed
/// before it is reported). The record is never deleted, so the fence
/// survives release; one record per key ever locked stays in the store.
///
/// With `coord_memory::SingleProcessMemoryBackend` this is the memory lock:
/// exclusive within one process only.
#[derive(Clone, Debug)]
pub struct GenericLock {
    space: RecordSpace,
}

/// What is stored under `<prefix><key>`.
#[derive(Serialize, Deserialize)]
struct LockRecord {
    /// The fence of the latest grant (0 = never granted).
    fence: u64,
    /// The current holder, if any (its lease may have expired).
    holder: Option<LeaseRecord>,
    /// Fresh per write, so an indeterminate txn can be told apart from someone
    /// else's identical write (see the CAS engine).
    nonce: Nonce,
}

record_kind!(LockRecord, "a lock record");

impl std::fmt::Debug for LockRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockRecord")
            .field("fence", &self.fence)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

impl GenericLock {
    /// A lock over `backend` with default options (system clock, prefix `lock/`).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, LockOptions::default())
    }

    /// A lock over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: LockOptions) -> Self {
        GenericLock {
            space: options.space(backend),
        }
    }

    /// Store calls made so far (for tests and benchmarks).
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    /// Why `handle` does not hold the lock described by `record` (None = it holds a live lease).
    fn why_not_held(
        handle: &LockHandle,
        record: Option<&LockRecord>,
        now: u64,
    ) -> Option<LostReason> {
        let Some(record) = record else {
            return Some(LostReason::NotHeld);
        };
        LostReason::judge(handle, record.holder.as_ref(), record.fence, now)
    }
}

#[async_trait]
impl Lock for GenericLock {
    #[tracing::instrument(name = "lock.try_lock", skip_all, fields(
        key = %key, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        validate_lock_input(key, ttl)?;
        let offer = self.space.offer(ttl);
        let answer = self
            .space
            .decide_record(key, |record: Option<LockRecord>| {
                let fence = record.as_ref().map_or(0, |r| r.fence);
                let held = record
                    .as_ref()
                    .and_then(|r| r.holder.as_ref())
                    .is_some_and(|h| h.is_live(offer.now));
                if held {
                    return Ok(Verdict::Keep(None));
                }
                let granted = LockRecord {
                    fence: fence + 1,
                    holder: Some(LeaseRecord {
                        token: offer.token.clone(),
                        expires_ms: offer.expires_ms,
                    }),
                    nonce: Nonce::default(),
                };
                let handle = LockHandle::offered(key, &offer, fence + 1, ttl);
                Ok(Verdict::Write(granted, Some(handle)))
            })
            .await;
        if let Ok(Some(handle)) = &answer {
            tracing::Span::current().record("fence", handle.fence());
            telemetry::lock_acquired();
        }
        answer
    }

    async fn watch_key(&self, key: &str) -> Wake {
        self.space.watch(key).await
    }

    #[tracing::instrument(name = "lock.renew", skip_all, fields(
        key = %handle.key, store = self.space.store_name(), fence = handle.fence,
    ))]
    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        validate_lock_input(&handle.key, handle.ttl())?;
        let now = self.space.now_millis();
        let renewed = self
            .space
            .decide_record(&handle.key, |record: Option<LockRecord>| {
                if let Some(reason) = Self::why_not_held(handle, record.as_ref(), now) {
                    return Err(LockError::lost(handle.key(), reason));
                }
                let mut renewed = record.expect("held implies a record");
                if let Some(holder) = renewed.holder.as_mut() {
                    holder.extend(now.saturating_add(whole_millis(handle.ttl())));
                }
                Ok(Verdict::Write(renewed, ()))
            })
            .await;
        super::renewed(renewed)
    }

    #[tracing::instrument(name = "lock.release", skip_all, fields(
        key = %handle.key, store = self.space.store_name(), fence = handle.fence,
    ))]
    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        validate_lock_input(&handle.key, handle.ttl())?;
        let now = self.space.now_millis();
        self.space
            .decide_record(&handle.key, |record: Option<LockRecord>| {
                if let Some(reason) = Self::why_not_held(&handle, record.as_ref(), now) {
                    return Err(LockError::lost(handle.key(), reason));
                }
                let record = record.expect("held implies a record");
                // The record stays: its fence counter must survive the release.
                let released = LockRecord {
                    fence: record.fence,
                    holder: None,
                    nonce: Nonce::default(),
                };
                Ok(Verdict::Write(released, ()))
            })
            .await
    }
}

/// What the store holds for one lock key (read-only inspection, see
/// [`GenericLock::status`]). Never carries the holder's token: that is a
/// credential.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStatus {
    /// The key, without the adapter's record prefix.
    pub key: String,
    /// The fence of the latest grant (strictly increasing per key, kept across releases).
    pub fence: u64,
    /// When the current holder's lease ends; `None` when nobody holds the
    /// lock (released, or never granted).
    pub expires_at: Option<SystemTime>,
    /// Whether a holder's lease is unexpired now, by the adapter's clock.
    pub live: bool,
}

impl GenericLock {
    /// The prefix of this lock's records in the backend's namespace (`lock/` by default).
    pub fn key_prefix(&self) -> &str {
        self.space.prefix()
    }

    /// What the store holds for `key`: one consistent read, for inspection
    /// only (never a basis for a decision). `Ok(None)`: never locked.
    pub async fn status(&self, key: &str) -> Result<Option<LockStatus>, LockError> {
        let status = inspect_status::<LockRecord>(&self.space, key).await?;
        Ok(status.map(|(record, now)| LockStatus {
            key: key.to_owned(),
            fence: record.fence,
            expires_at: record.holder.as_ref().map(LeaseRecord::expires_at),
            live: record.holder.as_ref().is_some_and(|h| h.is_live(now)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cas::CasOptions;
    use coord_backend::{BackendExt, Error, InvalidInput, ManualClock};
    use coord_memory::SingleProcessMemoryBackend;
    use std::time::UNIX_EPOCH;

    fn lock_with_clock(backend: Arc<dyn Backend>, clock: Arc<ManualClock>) -> GenericLock {
        GenericLock::with_options(backend, LockOptions::default().with_clock(clock))
    }

    /// `key` taken by `lock` for `ttl` (it must be free).
    async fn taken(lock: &GenericLock, key: &str, ttl: Duration) -> LockHandle {
        lock.try_lock(key, ttl).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn uncontended_lock_and_release_cost_one_round_trip_each_once_warm() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("lk").unwrap());
        let lock = GenericLock::new(backend);
        let ttl = Duration::from_secs(10);
        // Warm-up: the key is new, so even this costs one txn each.
        let h = lock.try_lock("job", ttl).await.unwrap().unwrap();
        lock.release(h).await.unwrap();
        let warm = lock.stats();
        assert_eq!(warm.round_trips(), 2);

        let h = lock.try_lock("job", ttl).await.unwrap().unwrap();
        assert_eq!(lock.stats().round_trips() - warm.round_trips(), 1);
        lock.renew(&h).await.unwrap();
        assert_eq!(lock.stats().round_trips() - warm.round_trips(), 2);
        lock.release(h).await.unwrap();
        let after = lock.stats();
        assert_eq!(after.round_trips() - warm.round_trips(), 3);
        assert_eq!(after.rejections, 0);
    }

    #[tokio::test]
    async fn a_waiting_lock_waits_through_contention() {
        use crate::lock::LockExt;
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("lk").unwrap());
        let holder = GenericLock::new(backend.clone());
        let held = taken(&holder, "k", Duration::from_secs(30)).await;
        // A waiter that gives up at its first rejected txn: its cold cache
        // guesses wrong, which is contention to wait through, not a failure.
        let cas = CasOptions {
            max_attempts: 1,
            ..CasOptions::default()
        };
        let waiter = GenericLock::with_options(backend, LockOptions::default().with_cas(cas));
        let release = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            holder.release(held).await
        });
        let got = waiter
            .lock("k", Duration::from_secs(30), Duration::from_secs(20))
            .await;
        assert!(got.is_ok(), "the waiter gave up: {got:?}");
        release.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn release_keeps_the_fence_counter_in_the_record() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("lk").unwrap());
        let lock = GenericLock::new(backend.clone());
        let h = taken(&lock, "a", Duration::from_secs(5)).await;
        assert_eq!(h.fence(), 1);
        lock.release(h).await.unwrap();
        let stored = backend.get("lock/a").await.unwrap();
        let record: LockRecord = serde_json::from_slice(&stored.value.unwrap()).unwrap();
        assert_eq!(record.fence, 1);
        assert!(record.holder.is_none());
    }

    #[tokio::test]
    async fn malformed_record_is_reported_and_left_alone() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("lk").unwrap());
        backend
            .put_if(
                "lock/x",
                coord_backend::Version::MISSING,
                b"not json".to_vec(),
            )
            .await
            .unwrap();
        let lock = GenericLock::new(backend.clone());
        let err = lock
            .try_lock("x", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LockError::Store(Error::MalformedRecord { .. })),
            "{err:?}"
        );
        assert_eq!(
            backend.get("lock/x").await.unwrap().value.unwrap(),
            b"not json"
        );
    }

    #[tokio::test]
    async fn a_stale_cache_never_reports_held_or_free_wrongly() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("lk").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        let a = lock_with_clock(backend.clone(), clock.clone());
        let b = lock_with_clock(backend.clone(), clock.clone());
        let ttl = Duration::from_secs(5);
        let h = a.try_lock("k", ttl).await.unwrap().unwrap();
        // b has never seen the key: its guess "missing" is refuted by the txn.
        assert!(b.try_lock("k", ttl).await.unwrap().is_none());
        a.release(h).await.unwrap();
        // b remembers "held": the confirmation txn refutes it and b takes the lock.
        let hb = b.try_lock("k", ttl).await.unwrap().unwrap();
        assert_eq!(hb.fence(), 2);
    }

    #[tokio::test]
    async fn expired_holder_cannot_renew_even_before_a_takeover() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("lk").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        let lock = lock_with_clock(backend, clock.clone());
        let h = taken(&lock, "k", Duration::from_millis(100)).await;
        clock.advance(Duration::from_millis(100));
        let err = lock.renew(&h).await.unwrap_err();
        assert!(
            matches!(
                err,
                LockError::Lost {
                    reason: LostReason::Expired,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn status_reads_fence_and_lease_without_the_token() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("st").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000));
        let lock = lock_with_clock(backend, clock.clone());
        assert_eq!(lock.key_prefix(), "lock/");
        assert_eq!(lock.status("never").await.unwrap(), None);
        assert!(matches!(
            lock.status("").await,
            Err(LockError::Invalid(InvalidInput::EmptyKey))
        ));

        let ttl = Duration::from_secs(10);
        let h = lock.try_lock("job", ttl).await.unwrap().unwrap();
        let held = lock.status("job").await.unwrap().unwrap();
        assert_eq!((held.key.as_str(), held.fence, held.live), ("job", 1, true));
        assert_eq!(
            held.expires_at,
            Some(UNIX_EPOCH + Duration::from_millis(11_000))
        );
        assert!(
            !format!("{held:?}").contains(h.token()),
            "no token in Debug"
        );

        clock.advance(Duration::from_secs(10));
        let expired = lock.status("job").await.unwrap().unwrap();
        assert!(!expired.live && expired.expires_at.is_some());

        let h = lock.try_lock("job", ttl).await.unwrap().unwrap();
        lock.release(h).await.unwrap();
        let free = lock.status("job").await.unwrap().unwrap();
        assert_eq!((free.fence, free.expires_at, free.live), (2, None, false));
    }
}
