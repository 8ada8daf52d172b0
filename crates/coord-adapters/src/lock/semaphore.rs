//! [`Semaphore`]: up to N holders per key at once, each with its own
//! fencing token and lease; [`GenericSemaphore`] decides it over the three
//! primitives of any backend.
//!
//! # Contract
//!
//! - [`Semaphore::try_acquire`] grants a permit when fewer than `permits`
//!   unexpired permits are held for the key: `Ok(Some(permit))`; otherwise
//!   `Ok(None)` (contention is not a failure).
//! - Every permit carries a fence: per key, strictly increasing across all
//!   permits of the semaphore, allocated in the grant's txn and never reset.
//! - A permit expires after its TTL unless renewed: a dead holder's permit
//!   comes back by itself. [`Semaphore::renew`] and [`Semaphore::release`]
//!   act only for the permit's own holder while its lease is live; a stale
//!   permit gets [`LockError::Lost`] and nothing changes.
//! - Every caller of one key must pass the same `permits`: a different
//!   number while permits are held is [`LockError::Invalid`].
//!
//! The trait's provided [`Semaphore::acquire`] is **not fair**: it watches
//! the key (change notifications when the store has them), tries, then
//! sleeps until a change or the backoff (the fallback poll).
//! [`GenericSemaphore`] overrides it with a **line** (first come, first
//! served, like Curator's `InterProcessSemaphoreV2`): a waiting `acquire`
//! takes a place at the end of the key's line, and a freed permit goes to
//! the first waiters in line, as many as there are free permits. A waiter's
//! place has a lease of the permit's TTL, renewed while it waits (from half
//! of it on): one that gives up leaves the line at once; one that dies or
//! pauses past its lease loses its place, blocking the line until then and
//! never longer. [`Semaphore::try_acquire`] never jumps the line: it grants
//! only while the free permits outnumber the live waiters. At most
//! [`MAX_WAITERS`] places are kept per key; a waiter beyond them polls until
//! a place is free.
//!
//! # Record
//!
//! `<prefix><key>` (prefix `sem/` by default) holds the fence counter, the
//! number of permits, the permits currently granted (at most `permits` of
//! them) and the line (at most [`MAX_WAITERS`] places); expired permits and
//! places are dropped by every write, so storage is bounded.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use coord_backend::{Backend, InvalidInput};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::wait::wait_for;
use super::{inspect_status, validate_lock_input, LockError, LockHandle, LostReason, WaitOptions};
use crate::cas::space::LeaseOffer;
use crate::cas::{
    record_kind, record_options, whole_millis, CasStats, LeaseRecord, Nonce, RecordSpace, Verdict,
};
use crate::mint_token;
use crate::wake::{WaitError, Wake};

/// A permit of a [`Semaphore`]: the same shape as a lock's handle (key,
/// secret token, fence, TTL, expiry). Treat it as opaque.
pub type Permit = LockHandle;

/// A counting semaphore with fencing tokens (see the [module docs](self)).
/// Object safe.
#[async_trait]
pub trait Semaphore: Send + Sync + std::fmt::Debug {
    /// Take one of `permits` permits of `key` for `ttl` if one is free.
    ///
    /// Bad input ([`LockError::Invalid`]): empty key, TTL under 1 ms,
    /// `permits` of 0, or another `permits` than the live holders used.
    async fn try_acquire(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>, LockError>;

    /// Extend the permit's lease by its TTL from now, if it is still held.
    async fn renew(&self, permit: &Permit) -> Result<(), LockError>;

    /// Give the permit back. A stale permit gets [`LockError::Lost`].
    async fn release(&self, permit: Permit) -> Result<(), LockError>;

    /// How many waiters stand in `key`'s line now (one read). `Ok(None)`:
    /// this implementation keeps no line (the default; waiting is not fair).
    async fn queued(&self, key: &str) -> Result<Option<usize>, LockError> {
        let _ = key;
        Ok(None)
    }

    /// A watch on the key's record (default: none, waiters poll).
    async fn watch_key(&self, key: &str) -> Wake {
        let _ = key;
        Wake::polling()
    }

    /// Wait for a permit until `wait.timeout` ([`LockError::Timeout`]):
    /// watch, try, then sleep until a change or the backoff. Not fair.
    async fn acquire(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<Permit, LockError> {
        validate_lock_input(key, ttl)?;
        wait_for(key, wait, self.watch_key(key), || {
            self.try_acquire(key, permits, ttl)
        })
        .await
    }
}

record_options! {
    /// Options of a [`GenericSemaphore`].
    pub struct SemaphoreOptions, prefix "sem/" {}
}

/// A [`Semaphore`] over any [`Backend`]: one record per key, decided
/// through the [`CasEngine`](crate::CasEngine). Uncontended acquire, renew and release cost
/// one txn each once the engine has seen the key.
#[derive(Clone, Debug)]
pub struct GenericSemaphore {
    space: RecordSpace,
}

/// Places kept in one key's line (see the module docs).
pub const MAX_WAITERS: usize = 64;

#[derive(Serialize, Deserialize, Default)]
struct SemRecord {
    fence: u64,
    permits: u32,
    holders: Vec<SemHolder>,
    /// The line, first come first; absent in records of earlier versions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    waiters: Vec<SemWaiter>,
    nonce: Nonce,
}

record_kind!(SemRecord, "a semaphore record");

/// One place in a key's line: the waiting call's id and its place's lease.
#[derive(Serialize, Deserialize, Clone)]
struct SemWaiter {
    id: String,
    expires_ms: u64,
}

/// What one attempt of a waiting `acquire` got.
enum Attempt {
    Granted(Permit),
    /// In line (or polling, when the line is full) until the next attempt.
    Waiting,
}

#[derive(Serialize, Deserialize, Clone)]
struct SemHolder {
    fence: u64,
    #[serde(flatten)]
    lease: LeaseRecord,
}

/// What the store holds for one semaphore key (see
/// [`GenericSemaphore::status`]). Never carries a token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreStatus {
    /// The key.
    pub key: String,
    /// The fence of the latest permit.
    pub fence: u64,
    /// How many permits the holders asked for.
    pub permits: u32,
    /// The permits recorded (expired ones stay until the next write).
    pub holders: Vec<PermitStatus>,
    /// How many waiters stand in line with a live place.
    pub waiting: usize,
}

/// One permit in a [`SemaphoreStatus`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitStatus {
    /// The permit's fence.
    pub fence: u64,
    /// When its lease ends.
    pub expires_at: SystemTime,
    /// Whether its lease is unexpired now.
    pub live: bool,
}

/// A semaphore needs at least one permit.
fn validate_permits(permits: u32) -> Result<(), LockError> {
    if permits == 0 {
        return Err(LockError::Invalid(InvalidInput::Argument(
            "a semaphore needs at least 1 permit".into(),
        )));
    }
    Ok(())
}

/// The permit `offer` makes for `key` and `ttl` beside the live `holders`
/// and `waiters` of `record`: the record to write and the permit, with the
/// next fence.
fn grant(
    record: &SemRecord,
    mut holders: Vec<SemHolder>,
    waiters: Vec<SemWaiter>,
    permits: u32,
    (key, ttl, offer): (&str, Duration, &LeaseOffer),
) -> (SemRecord, Permit) {
    let fence = record.fence + 1;
    holders.push(SemHolder {
        fence,
        lease: LeaseRecord::new(offer.token.clone(), offer.expires_ms),
    });
    let granted = SemRecord {
        fence,
        permits,
        holders,
        waiters,
        nonce: Nonce::default(),
    };
    (granted, Permit::offered(key, offer, fence, ttl))
}

impl SemRecord {
    /// This record's live permits and places, less the permit `token` and
    /// the place `id`, with a fresh nonce: what a write that frees keeps.
    fn pruned(self, now: u64, token: Option<&str>, id: Option<&str>) -> SemRecord {
        SemRecord {
            holders: self
                .holders
                .into_iter()
                .filter(|h| h.lease.is_live(now) && Some(h.lease.token.as_str()) != token)
                .collect(),
            waiters: self
                .waiters
                .into_iter()
                .filter(|w| w.expires_ms > now && Some(w.id.as_str()) != id)
                .collect(),
            nonce: Nonce::default(),
            ..self
        }
    }
}

impl GenericSemaphore {
    /// A semaphore over `backend` with default options (system clock, prefix `sem/`).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, SemaphoreOptions::default())
    }

    /// A semaphore over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: SemaphoreOptions) -> Self {
        GenericSemaphore {
            space: options.space(backend),
        }
    }

    /// Store calls made so far.
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    /// The prefix of this semaphore's records (`sem/` by default).
    pub fn key_prefix(&self) -> &str {
        self.space.prefix()
    }

    /// Why `permit` is not held in `record` (None = held, lease live).
    fn why_not_held(permit: &Permit, record: &SemRecord, now: u64) -> Option<LostReason> {
        let grant = record
            .holders
            .iter()
            .find(|h| h.lease.token == permit.token());
        LostReason::of_grant(grant.map(|h| &h.lease), now)
    }

    /// What the store holds for `key` (one read, for inspection only).
    /// `Ok(None)`: never used.
    pub async fn status(&self, key: &str) -> Result<Option<SemaphoreStatus>, LockError> {
        let status = inspect_status::<SemRecord>(&self.space, key).await?;
        Ok(status.map(|(record, now)| SemaphoreStatus {
            key: key.to_owned(),
            fence: record.fence,
            permits: record.permits,
            holders: record
                .holders
                .iter()
                .map(|h| PermitStatus {
                    fence: h.fence,
                    expires_at: h.lease.expires_at(),
                    live: h.lease.is_live(now),
                })
                .collect(),
            waiting: record.waiters.iter().filter(|w| w.expires_ms > now).count(),
        }))
    }

    /// One attempt of a waiting `acquire` by the waiter `id`: a permit if
    /// `id` is among the first waiters in line for the free permits (or
    /// there is room for everyone in line and it); otherwise its place in
    /// line, taken or renewed when due.
    async fn attempt(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        id: &str,
    ) -> Result<Attempt, LockError> {
        let offer = self.space.offer(ttl);
        let answer = self
            .space
            .decide_record(key, |record: Option<SemRecord>| {
                let record = record.unwrap_or_default();
                let (holders, mut waiters) = Self::live(&record, permits, offer.now)?;
                let free = (permits as usize).saturating_sub(holders.len());
                let place = waiters.iter().position(|w| w.id == id);
                let served = match place {
                    Some(i) => i < free,
                    None => waiters.len() < free,
                };
                if served {
                    waiters.retain(|w| w.id != id);
                    let (granted, permit) =
                        grant(&record, holders, waiters, permits, (key, ttl, &offer));
                    return Ok(Verdict::Write(granted, Attempt::Granted(permit)));
                }
                let renew_from = offer.now.saturating_add(whole_millis(ttl) / 2);
                match place {
                    // In line, with enough lease left: nothing to write.
                    Some(i) if waiters[i].expires_ms > renew_from => {
                        return Ok(Verdict::Keep(Attempt::Waiting))
                    }
                    Some(i) => waiters[i].expires_ms = offer.expires_ms,
                    None if waiters.len() >= MAX_WAITERS => {
                        return Ok(Verdict::Keep(Attempt::Waiting))
                    }
                    None => waiters.push(SemWaiter {
                        id: id.to_owned(),
                        expires_ms: offer.expires_ms,
                    }),
                }
                let queued = SemRecord {
                    holders,
                    waiters,
                    nonce: Nonce::default(),
                    ..record
                };
                Ok(Verdict::Write(queued, Attempt::Waiting))
            })
            .await;
        self.withdraw_if_unknown(key, &answer, &offer.token, Some(id))
            .await;
        answer
    }

    /// After `answer`, withdraw the permit offered with `token` (and the
    /// place of waiter `id`) when the answer is indeterminate: the grant may
    /// have landed, or may still land, and nobody would know of it until
    /// its lease ran out. The caller still gets the error.
    async fn withdraw_if_unknown<T>(
        &self,
        key: &str,
        answer: &Result<T, LockError>,
        token: &str,
        id: Option<&str>,
    ) {
        let Err(error) = answer else { return };
        if !error.is_indeterminate() {
            return;
        }
        let now = self.space.now_millis();
        let withdrawn: Result<(), LockError> = self
            .space
            .decide_record(key, |record: Option<SemRecord>| {
                // Written even when nothing here is ours: the write moves
                // the record on, so a copy of the grant still in flight can
                // no longer apply.
                let record = record.unwrap_or_default();
                Ok(Verdict::Write(record.pruned(now, Some(token), id), ()))
            })
            .await;
        if let Err(error) = withdrawn {
            tracing::debug!(%error, "could not withdraw a permit granted in doubt: it expires with its lease");
        }
    }

    /// The waiter `id` gives up: its place goes (nothing to do when it has none).
    async fn leave(&self, key: &str, id: &str) -> Result<(), LockError> {
        let now = self.space.now_millis();
        self.space
            .decide_record(key, |record: Option<SemRecord>| {
                let record = record.unwrap_or_default();
                if !record.waiters.iter().any(|w| w.id == id) {
                    return Ok(Verdict::Keep(()));
                }
                let left = record.pruned(now, None, Some(id));
                Ok(Verdict::Write(left, ()))
            })
            .await
    }

    /// The live permits and places of `record`, or why `permits` is refused.
    fn live(
        record: &SemRecord,
        permits: u32,
        now: u64,
    ) -> Result<(Vec<SemHolder>, Vec<SemWaiter>), LockError> {
        let holders: Vec<SemHolder> = record
            .holders
            .iter()
            .filter(|h| h.lease.is_live(now))
            .cloned()
            .collect();
        if !holders.is_empty() && record.permits != permits {
            return Err(LockError::Invalid(InvalidInput::Argument(format!(
                "semaphore is held with {} permits, not {permits}",
                record.permits
            ))));
        }
        let waiters = record
            .waiters
            .iter()
            .filter(|w| w.expires_ms > now)
            .cloned()
            .collect();
        Ok((holders, waiters))
    }
}

#[async_trait]
impl Semaphore for GenericSemaphore {
    #[tracing::instrument(name = "semaphore.try_acquire", skip_all, fields(
        key = %key, store = self.space.store_name(), fence = tracing::field::Empty,
    ))]
    async fn try_acquire(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
    ) -> Result<Option<Permit>, LockError> {
        validate_lock_input(key, ttl)?;
        validate_permits(permits)?;
        let offer = self.space.offer(ttl);
        let answer = self
            .space
            .decide_record(key, |record: Option<SemRecord>| {
                let record = record.unwrap_or_default();
                let (live, waiters) = Self::live(&record, permits, offer.now)?;
                // Never ahead of a live waiter in line.
                if live.len() + waiters.len() >= permits as usize {
                    return Ok(Verdict::Keep(None));
                }
                let (granted, permit) = grant(&record, live, waiters, permits, (key, ttl, &offer));
                Ok(Verdict::Write(granted, Some(permit)))
            })
            .await;
        self.withdraw_if_unknown(key, &answer, &offer.token, None)
            .await;
        if let Ok(Some(permit)) = &answer {
            tracing::Span::current().record("fence", permit.fence());
        }
        answer
    }

    #[tracing::instrument(name = "semaphore.renew", skip_all, fields(
        key = %permit.key(), store = self.space.store_name(), fence = permit.fence(),
    ))]
    async fn renew(&self, permit: &Permit) -> Result<(), LockError> {
        validate_lock_input(permit.key(), permit.ttl())?;
        let now = self.space.now_millis();
        let renewed = self
            .space
            .decide_record(permit.key(), |record: Option<SemRecord>| {
                let record = record.unwrap_or_default();
                if let Some(reason) = Self::why_not_held(permit, &record, now) {
                    return Err(LockError::lost(permit.key(), reason));
                }
                let holders = record
                    .holders
                    .iter()
                    .filter(|h| h.lease.is_live(now))
                    .map(|h| {
                        let mut h = h.clone();
                        if h.lease.token == permit.token() {
                            h.lease
                                .extend(now.saturating_add(whole_millis(permit.ttl())));
                        }
                        h
                    })
                    .collect();
                let renewed = SemRecord {
                    holders,
                    nonce: Nonce::default(),
                    ..record
                };
                Ok(Verdict::Write(renewed, ()))
            })
            .await;
        super::renewed(renewed)
    }

    #[tracing::instrument(name = "semaphore.release", skip_all, fields(
        key = %permit.key(), store = self.space.store_name(), fence = permit.fence(),
    ))]
    async fn release(&self, permit: Permit) -> Result<(), LockError> {
        validate_lock_input(permit.key(), permit.ttl())?;
        let now = self.space.now_millis();
        self.space
            .decide_record(permit.key(), |record: Option<SemRecord>| {
                let record = record.unwrap_or_default();
                if let Some(reason) = Self::why_not_held(&permit, &record, now) {
                    return Err(LockError::lost(permit.key(), reason));
                }
                // The record stays, to keep the fence.
                let released = record.pruned(now, Some(permit.token()), None);
                Ok(Verdict::Write(released, ()))
            })
            .await
    }

    async fn watch_key(&self, key: &str) -> Wake {
        self.space.watch(key).await
    }

    async fn queued(&self, key: &str) -> Result<Option<usize>, LockError> {
        Ok(Some(self.status(key).await?.map_or(0, |s| s.waiting)))
    }

    /// Waits in the key's line (see the module docs): watch, take a place,
    /// then try again on every change, on the backoff (the fallback poll),
    /// and before the place's lease needs renewing. A call that gives up
    /// (timeout, error) leaves the line.
    #[tracing::instrument(name = "semaphore.acquire", skip_all, fields(
        key = %key, store = self.space.store_name(),
    ))]
    async fn acquire(
        &self,
        key: &str,
        permits: u32,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<Permit, LockError> {
        validate_lock_input(key, ttl)?;
        validate_permits(permits)?;
        let started = Instant::now();
        let deadline = wait.deadline_from(started);
        let mut wake = self.watch_key(key).await;
        let id = mint_token();
        let mut refusals = 0u32;
        let outcome = loop {
            match self.attempt(key, permits, ttl, &id).await {
                Ok(Attempt::Granted(permit)) => break Ok(permit),
                Ok(Attempt::Waiting) => {}
                // Contention (every txn lost its race) is no failure: wait on.
                Err(e) if e.is_contention() => {}
                Err(e) => break Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                break Err(LockError::Timeout {
                    key: key.to_owned(),
                    waited: now - started,
                });
            }
            refusals += 1;
            // A third of the TTL at most: the place is renewed from half of it on.
            let pause = wait.pause(refusals).min(ttl / 3);
            if let Err(refused) = wake
                .until(crate::wake::later(now, pause).min(deadline))
                .await
            {
                break Err(refused.into());
            }
        };
        if outcome.is_err() {
            // Best effort: a place left behind runs out with its lease.
            if let Err(error) = self.leave(key, &id).await {
                tracing::debug!(%error, "a semaphore waiter could not leave the line");
            }
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_backend::ManualClock;
    use coord_memory::SingleProcessMemoryBackend;

    #[tokio::test]
    async fn permits_count_expire_and_keep_increasing_fences() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("sm").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000));
        let sem = GenericSemaphore::with_options(
            backend,
            SemaphoreOptions::default().with_clock(clock.clone()),
        );
        let ttl = Duration::from_millis(100);
        let a = sem.try_acquire("s", 2, ttl).await.unwrap().unwrap();
        let b = sem.try_acquire("s", 2, ttl).await.unwrap().unwrap();
        assert!(sem.try_acquire("s", 2, ttl).await.unwrap().is_none());
        assert!(matches!(
            sem.try_acquire("s", 3, ttl).await,
            Err(LockError::Invalid(_))
        ));
        sem.release(a).await.unwrap();
        let c = sem.try_acquire("s", 2, ttl).await.unwrap().unwrap();
        assert!(c.fence() > b.fence());
        clock.advance(ttl);
        assert!(sem.renew(&b).await.unwrap_err().is_lost());
        let d = sem.try_acquire("s", 2, ttl).await.unwrap().unwrap();
        let status = sem.status("s").await.unwrap().unwrap();
        assert_eq!(
            (status.fence, status.permits, status.holders.len()),
            (4, 2, 1)
        );
        assert_eq!(status.holders[0].fence, d.fence());
    }
}
