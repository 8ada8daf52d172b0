//! Leader election with a fencing term (guide: docs/locks.md; contract: the
//! `election` conformance suite).
//!
//! # Contract
//!
//! An [`Election`] keeps at most one live leader per election name:
//!
//! - [`Election::campaign`] waits until the caller leads and returns a
//!   [`Leadership`] with a **term**: per election, strictly increasing with
//!   every new leader, allocated in the same atomic step as the win, never
//!   reset. Pass the term to whatever the leader drives and let that side
//!   refuse a lower one: a paused old leader is then harmless even if it
//!   does not yet know it lost.
//!   [`Election::try_campaign`] is the non-waiting form.
//! - [`Election::renew`] extends the leader's lease and checks it still
//!   leads; [`Election::proclaim`] changes the value it announces (only the
//!   current leader, with the current term); [`Election::resign`] steps down.
//!   A leader whose lease expired, or that was replaced or resigned, gets
//!   [`ElectionError::Lost`] from all three and nothing changes.
//! - A leader whose lease expired is replaced by the next campaign.
//! - [`Election::leader`] returns the live leader (candidate id, value,
//!   term, lease expiry) or `None`; [`Election::observe`] waits until that
//!   answer differs from the one the caller last saw ([`Observer`] keeps the
//!   last one for you).
//!
//! # Boundary
//!
//! [`GenericElection`] decides through the [`CasEngine`](crate::CasEngine) over any backend:
//! one record per election (`<prefix><name>`, default `election/`) holds the
//! term counter and the current leader. Expiry is judged with the adapter's
//! [`Clock`](coord_backend::Clock) (same caveats as [`crate::lock`]). Waiting calls sleep through
//! [`Wake`](crate::wake::Wake): a store's change notifications when it has them, else a
//! fallback poll.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use coord_adapters::election::{Election, GenericElection};
//! use coord_memory::SingleProcessMemoryBackend;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let election = GenericElection::new(Arc::new(SingleProcessMemoryBackend::new("demo")?));
//! let ttl = Duration::from_secs(10);
//! let lead = election.campaign("scheduler", "node-a", "10.0.0.1:80", ttl, Duration::from_secs(1)).await?;
//! election.proclaim(&lead, "10.0.0.1:81").await?;
//! let seen = election.leader("scheduler").await?.expect("a leader");
//! assert_eq!((seen.candidate.as_str(), seen.term), ("node-a", lead.term()));
//! election.resign(lead).await?;
//! assert!(election.leader("scheduler").await?.is_none());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use coord_backend::{Backend, Error, InvalidInput};
use serde::{Deserialize, Serialize};

use crate::cas::{
    record_kind, record_options, whole_millis, CasStats, LeaseRecord, Nonce, RecordSpace, Verdict,
};
use crate::grant::{grant_accessors, Grant};
use crate::lock::LostReason;
use crate::rwlock::fallback_pause;
use crate::wake::{Deadline, WaitError};

/// Errors of [`Election`] operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionError {
    /// This leadership is over (expired, replaced, resigned): stop acting as
    /// leader. Nothing was changed.
    #[error("leadership of {name:?} lost: {reason}")]
    Lost {
        /// The election.
        name: String,
        /// What happened.
        reason: LostReason,
    },
    /// A waiting call gave up.
    #[error("timed out after {waited:?} waiting in election {name:?}")]
    Timeout {
        /// The election.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// Refused before touching the store (empty name or candidate id, NUL
    /// bytes, TTL under one millisecond); nothing changed.
    #[error("invalid election input: {0}")]
    Invalid(InvalidInput),
    /// The store failed (unreachable, indeterminate, malformed record).
    /// Do not assume you lead.
    #[error("election store error: {0}")]
    Store(Error),
}

impl ElectionError {
    /// Whether this is [`ElectionError::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, ElectionError::Lost { .. })
    }
}

crate::wake::store_errors!(ElectionError, waits);

/// A held leadership that renews itself in the background (the
/// [`Guard`](crate::guard::Guard) of an [`Election`]; see [`crate::guard`]).
/// Its [`fence`](crate::guard::Guard::fence) is the term.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::election::{Election, GenericElection, LeadershipGuard};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let election: Arc<dyn Election> =
///     Arc::new(GenericElection::new(Arc::new(SingleProcessMemoryBackend::new("demo")?)));
/// let lead = LeadershipGuard::campaign(&election, "ingest", "node-a", "10.0.0.7:80",
///     Duration::from_secs(10), Duration::from_secs(1)).await?;
/// assert_eq!(lead.fence(), lead.leadership().term());
/// lead.release().await?; // resigns
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub type LeadershipGuard = crate::guard::Guard<dyn Election>;

#[async_trait]
impl<'a> crate::guard::Renew for dyn Election + 'a {
    type Held = Leadership;
    type Error = ElectionError;

    async fn renew_grant(&self, held: &Leadership) -> Result<(), ElectionError> {
        self.renew(held).await
    }

    /// Releasing a leadership resigns it.
    async fn release_grant(&self, held: Leadership) -> Result<(), ElectionError> {
        self.resign(held).await
    }

    fn lease(held: &Leadership) -> crate::guard::Lease<'_> {
        crate::guard::Lease {
            key: held.name(),
            fence: held.term(),
            ttl: held.ttl(),
            requested: held.requested_instant(),
        }
    }

    fn expired(held: &Leadership) -> ElectionError {
        ElectionError::Lost {
            name: held.name().to_owned(),
            reason: LostReason::Expired,
        }
    }
}

impl crate::guard::Guard<dyn Election> {
    /// Become leader of `name` now if nobody leads, and guard it.
    pub async fn try_campaign(
        election: &Arc<dyn Election>,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Self>, ElectionError> {
        Ok(election
            .try_campaign(name, candidate, value, ttl)
            .await?
            .map(|l| Self::new(election.clone(), l, crate::guard::GuardOptions::default())))
    }

    /// Wait up to `timeout` to lead `name` (see [`Election::campaign`]), and guard it.
    pub async fn campaign(
        election: &Arc<dyn Election>,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Self, ElectionError> {
        let leadership = election
            .campaign(name, candidate, value, ttl, timeout)
            .await?;
        Ok(Self::new(
            election.clone(),
            leadership,
            crate::guard::GuardOptions::default(),
        ))
    }

    /// The guarded leadership (for [`Election::proclaim`]).
    pub fn leadership(&self) -> &Leadership {
        self.held()
    }
}

/// The checks every implementation runs first: a non-empty election name
/// and candidate id without NUL bytes, and a TTL of at least 1 ms.
pub fn validate_election_input(
    name: &str,
    candidate: &str,
    ttl: Duration,
) -> Result<(), ElectionError> {
    for (what, s) in [("election name", name), ("candidate id", candidate)] {
        if s.is_empty() {
            return Err(ElectionError::Invalid(if what == "election name" {
                InvalidInput::EmptyKey
            } else {
                InvalidInput::Argument("candidate id must not be empty".into())
            }));
        }
        if s.contains('\0') {
            return Err(ElectionError::Invalid(InvalidInput::NulByte(s.to_owned())));
        }
    }
    if ttl < Duration::from_millis(1) {
        return Err(ElectionError::Invalid(InvalidInput::Argument(format!(
            "election ttl must be at least 1 ms, got {ttl:?}"
        ))));
    }
    Ok(())
}

/// The live leader of an election, as [`Election::leader`] reports it.
/// Its `Debug` output leaves the announced value out (record values stay out of logs).
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderInfo {
    /// The election.
    pub name: String,
    /// The leader's candidate id.
    pub candidate: String,
    /// The value it announces (e.g. its address), set by campaign or proclaim.
    pub value: String,
    /// Its term (fencing token).
    pub term: u64,
    /// When its lease ends unless renewed.
    pub expires_at: SystemTime,
}

impl LeaderInfo {
    /// A leader description, for [`Election`] implementations.
    pub fn new(
        name: impl Into<String>,
        candidate: impl Into<String>,
        value: impl Into<String>,
        term: u64,
        expires_at: SystemTime,
    ) -> Self {
        LeaderInfo {
            name: name.into(),
            candidate: candidate.into(),
            value: value.into(),
            term,
            expires_at,
        }
    }
}

impl Debug for LeaderInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderInfo")
            .field("name", &self.name)
            .field("candidate", &self.candidate)
            .field("term", &self.term)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Proof of leading, returned by [`Election::campaign`]. Hand it back
/// unchanged to renew / proclaim / resign. `Debug` leaves the token out.
#[derive(Clone, PartialEq, Eq)]
pub struct Leadership {
    name: String,
    candidate: String,
    term: u64,
    grant: Grant,
}

impl Leadership {
    /// A leadership, for [`Election`] implementations only: `token` fresh
    /// and random per win, `term` following the rules of the module docs.
    pub fn new(
        name: impl Into<String>,
        candidate: impl Into<String>,
        token: impl Into<String>,
        term: u64,
        ttl: Duration,
        expires_at: SystemTime,
    ) -> Self {
        Leadership {
            name: name.into(),
            candidate: candidate.into(),
            term,
            grant: Grant::new(token.into(), ttl, expires_at),
        }
    }

    grant_accessors!("this leadership");

    /// The election.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// This leader's candidate id.
    pub fn candidate(&self) -> &str {
        &self.candidate
    }

    /// The fencing term: strictly greater than every earlier leader's.
    pub fn term(&self) -> u64 {
        self.term
    }
}

impl Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.name)
            .field("candidate", &self.candidate)
            .field("term", &self.term)
            .field("ttl", &self.grant.ttl)
            .finish_non_exhaustive()
    }
}

/// An election service; see the [module docs](self) for the contract
/// (checked by `coord_conformance::election`). Object safe.
#[async_trait]
pub trait Election: Send + Sync + Debug {
    /// Become leader of `name` now if nobody leads (`Ok(None)`: someone does).
    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>, ElectionError>;

    /// Wait up to `timeout` to become leader of `name` ([`ElectionError::Timeout`] after it).
    ///
    /// Leadership belongs to one win (its token), not to a candidate id: a
    /// second campaign with the id of the live leader waits like any other.
    async fn campaign(
        &self,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Leadership, ElectionError>;

    /// Extend the lease by its TTL from now, if `leadership` still leads.
    async fn renew(&self, leadership: &Leadership) -> Result<(), ElectionError>;

    /// Announce `value` instead, if `leadership` still leads.
    async fn proclaim(&self, leadership: &Leadership, value: &str) -> Result<(), ElectionError>;

    /// Step down (the term counter stays), if `leadership` still leads.
    async fn resign(&self, leadership: Leadership) -> Result<(), ElectionError>;

    /// The live leader of `name`, or `None`.
    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>, ElectionError>;

    /// Wait up to `timeout` until the answer of [`Election::leader`] differs
    /// from `last` (another leader, another value, or no leader), and return
    /// it; [`ElectionError::Timeout`] when it did not change.
    async fn observe(
        &self,
        name: &str,
        last: Option<&LeaderInfo>,
        timeout: Duration,
    ) -> Result<Option<LeaderInfo>, ElectionError>;
}

/// A loop of [`Election::observe`] calls that remembers what it last saw:
/// each [`Observer::next`] returns the next change.
#[derive(Debug)]
pub struct Observer {
    election: Arc<dyn Election>,
    name: String,
    last: Option<LeaderInfo>,
}

impl Observer {
    /// Observe `name`, starting from its current leader.
    pub async fn start(election: Arc<dyn Election>, name: &str) -> Result<Self, ElectionError> {
        let last = election.leader(name).await?;
        Ok(Observer {
            election,
            name: name.to_owned(),
            last,
        })
    }

    /// What was seen last.
    pub fn last(&self) -> Option<&LeaderInfo> {
        self.last.as_ref()
    }

    /// Wait up to `timeout` for the next change.
    pub async fn next(&mut self, timeout: Duration) -> Result<Option<LeaderInfo>, ElectionError> {
        let seen = self
            .election
            .observe(&self.name, self.last.as_ref(), timeout)
            .await?;
        self.last = seen.clone();
        Ok(seen)
    }
}

record_options! {
    /// Options of a [`GenericElection`].
    pub struct ElectionOptions, prefix "election/" {
        /// Longest sleep of a waiting call between two attempts when no change
        /// notification wakes it (the fallback poll; default 250 ms).
        pub max_poll: Duration = Duration::from_millis(250), set by with_max_poll,
    }
}

/// What is stored under `<prefix><name>`.
#[derive(Serialize, Deserialize, Default)]
struct ElectionRecord {
    /// The term of the latest win (0 = never won).
    term: u64,
    /// The current leader, if any (its lease may have expired).
    leader: Option<LeaderRecord>,
    /// Fresh per write (see the CAS engine on indeterminate txns).
    nonce: Nonce,
}

record_kind!(ElectionRecord, "an election record");

#[derive(Serialize, Deserialize)]
struct LeaderRecord {
    candidate: String,
    value: String,
    #[serde(flatten)]
    lease: LeaseRecord,
}

impl Debug for ElectionRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElectionRecord")
            .field("term", &self.term)
            .field("leader", &self.leader.as_ref().map(|l| &l.candidate))
            .finish_non_exhaustive()
    }
}

/// An [`Election`] over any [`Backend`], decided through the [`CasEngine`](crate::CasEngine).
#[derive(Clone, Debug)]
pub struct GenericElection {
    space: RecordSpace,
    max_poll: Duration,
}

/// What a leader-changing decision does once ownership is checked.
enum Change<'a> {
    Renew,
    Proclaim(&'a str),
    Resign,
}

impl GenericElection {
    /// An election service over `backend` with default options.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, ElectionOptions::default())
    }

    /// An election service over `backend` with `options`.
    pub fn with_options(backend: Arc<dyn Backend>, options: ElectionOptions) -> Self {
        GenericElection {
            space: options.space(backend),
            max_poll: options.max_poll,
        }
    }

    /// The record prefix (`election/` by default).
    pub fn key_prefix(&self) -> &str {
        self.space.prefix()
    }

    /// Store calls made so far.
    pub fn stats(&self) -> CasStats {
        self.space.stats()
    }

    fn live_leader(name: &str, record: &ElectionRecord, now: u64) -> Option<LeaderInfo> {
        record
            .leader
            .as_ref()
            .filter(|l| l.lease.is_live(now))
            .map(|l| {
                LeaderInfo::new(
                    name,
                    l.candidate.clone(),
                    l.value.clone(),
                    record.term,
                    l.lease.expires_at(),
                )
            })
    }

    async fn change(
        &self,
        leadership: &Leadership,
        change: Change<'_>,
    ) -> Result<(), ElectionError> {
        validate_election_input(&leadership.name, &leadership.candidate, leadership.ttl())?;
        let now = self.space.now_millis();
        self.space
            .decide_record(&leadership.name, |record: Option<ElectionRecord>| {
                let lost = |reason| ElectionError::Lost {
                    name: leadership.name.clone(),
                    reason,
                };
                let Some(mut record) = record else {
                    return Err(lost(LostReason::NotHeld));
                };
                let ours = record.term == leadership.term
                    && record
                        .leader
                        .as_ref()
                        .is_some_and(|l| l.lease.token == leadership.token());
                if !ours {
                    let reason = if record.term > leadership.term {
                        LostReason::TakenOver
                    } else {
                        LostReason::NotHeld
                    };
                    return Err(lost(reason));
                }
                let leader = record.leader.as_mut().expect("ours implies a leader");
                if !leader.lease.is_live(now) {
                    return Err(lost(LostReason::Expired));
                }
                match &change {
                    Change::Renew => {
                        leader
                            .lease
                            .extend(now.saturating_add(whole_millis(leadership.ttl())));
                    }
                    Change::Proclaim(value) => leader.value = (*value).to_owned(),
                    Change::Resign => record.leader = None,
                }
                Ok(Verdict::Write(record, ()))
            })
            .await
    }

    /// Step down from the win offered with `token` after an indeterminate
    /// campaign: it may have landed, or may still land, and nobody would
    /// know of the leader until its lease ran out. The term it took stays
    /// taken (terms never go back).
    async fn withdraw(&self, name: &str, token: &str) {
        let withdrawn: Result<(), ElectionError> = self
            .space
            .decide_record(name, |record: Option<ElectionRecord>| {
                // Written even when nothing here is ours: the write moves
                // the record on, so a copy of the win still in flight can
                // no longer apply.
                let mut record = record.unwrap_or_default();
                if record
                    .leader
                    .as_ref()
                    .is_some_and(|l| l.lease.token == token)
                {
                    record.leader = None;
                }
                Ok(Verdict::Write(record, ()))
            })
            .await;
        if let Err(error) = withdrawn {
            tracing::debug!(%error, "could not withdraw a win made in doubt: it expires with its lease");
        }
    }

    async fn read_leader(&self, name: &str) -> Result<Option<LeaderInfo>, ElectionError> {
        validate_election_input(name, "-", Duration::from_millis(1))?;
        let Some(record) = self.space.inspect::<ElectionRecord>(name).await? else {
            return Ok(None);
        };
        Ok(Self::live_leader(name, &record, self.space.now_millis()))
    }

    /// What the store holds for `name`, in one consistent read, for
    /// inspection only: the latest term granted (0 = never won) and the
    /// live leader. `Ok(None)`: no record (never campaigned).
    pub async fn status(&self, name: &str) -> Result<Option<ElectionStatus>, ElectionError> {
        validate_election_input(name, "-", Duration::from_millis(1))?;
        let Some(record) = self.space.inspect::<ElectionRecord>(name).await? else {
            return Ok(None);
        };
        Ok(Some(ElectionStatus {
            name: name.to_owned(),
            term: record.term,
            leader: Self::live_leader(name, &record, self.space.now_millis()),
        }))
    }
}

/// What the store holds for one election (see [`GenericElection::status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ElectionStatus {
    /// The election.
    pub name: String,
    /// The latest term granted (0 = never won); kept across resignations.
    pub term: u64,
    /// The live leader, if any.
    pub leader: Option<LeaderInfo>,
}

/// `answer`, counted in `coord_election_lost_total` when it says the
/// leadership is over.
fn lost_counted(answer: Result<(), ElectionError>) -> Result<(), ElectionError> {
    if let Err(ElectionError::Lost { reason, .. }) = &answer {
        crate::telemetry::election_lost(reason.label());
    }
    answer
}

#[async_trait]
impl Election for GenericElection {
    #[tracing::instrument(name = "election.try_campaign", skip_all, fields(name = %name))]
    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>, ElectionError> {
        validate_election_input(name, candidate, ttl)?;
        let offer = self.space.offer(ttl);
        let won: Result<Option<Leadership>, ElectionError> = self
            .space
            .decide_record(name, |record: Option<ElectionRecord>| {
                let mut record = record.unwrap_or_default();
                if record
                    .leader
                    .as_ref()
                    .is_some_and(|l| l.lease.is_live(offer.now))
                {
                    return Ok(Verdict::Keep(None));
                }
                record.term += 1;
                record.leader = Some(LeaderRecord {
                    candidate: candidate.to_owned(),
                    value: value.to_owned(),
                    lease: LeaseRecord::new(offer.token.clone(), offer.expires_ms),
                });
                let won = Leadership::new(
                    name,
                    candidate,
                    offer.token.clone(),
                    record.term,
                    ttl,
                    offer.expires_at(),
                )
                .requested_at(offer.sent);
                Ok(Verdict::Write(record, Some(won)))
            })
            .await;
        if won.as_ref().is_err_and(|e| e.is_indeterminate()) {
            self.withdraw(name, &offer.token).await;
        }
        if let Ok(Some(_)) = &won {
            crate::telemetry::election_won();
        }
        won
    }

    #[tracing::instrument(name = "election.campaign", skip_all, fields(name = %name))]
    async fn campaign(
        &self,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Leadership, ElectionError> {
        validate_election_input(name, candidate, ttl)?;
        let deadline = Deadline::after(timeout);
        let mut wake = self.space.watch(name).await;
        wake.retry(
            deadline,
            |attempts| fallback_pause(attempts, self.max_poll),
            || self.try_campaign(name, candidate, value, ttl),
            |waited| ElectionError::Timeout {
                name: name.to_owned(),
                waited,
            },
        )
        .await
    }

    #[tracing::instrument(name = "election.renew", skip_all, fields(name = %leadership.name, term = leadership.term))]
    async fn renew(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        lost_counted(self.change(leadership, Change::Renew).await)
    }

    #[tracing::instrument(name = "election.proclaim", skip_all, fields(name = %leadership.name, term = leadership.term))]
    async fn proclaim(&self, leadership: &Leadership, value: &str) -> Result<(), ElectionError> {
        lost_counted(self.change(leadership, Change::Proclaim(value)).await)
    }

    #[tracing::instrument(name = "election.resign", skip_all, fields(name = %leadership.name, term = leadership.term))]
    async fn resign(&self, leadership: Leadership) -> Result<(), ElectionError> {
        self.change(&leadership, Change::Resign).await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>, ElectionError> {
        self.read_leader(name).await
    }

    #[tracing::instrument(name = "election.observe", skip_all, fields(name = %name))]
    async fn observe(
        &self,
        name: &str,
        last: Option<&LeaderInfo>,
        timeout: Duration,
    ) -> Result<Option<LeaderInfo>, ElectionError> {
        validate_election_input(name, "-", Duration::from_millis(1))?;
        let deadline = Deadline::after(timeout);
        let mut wake = self.space.watch(name).await;
        wake.retry(
            deadline,
            |attempts| fallback_pause(attempts, self.max_poll),
            || async {
                let now_leader = self.read_leader(name).await?;
                // A renewal moves only the expiry: not a change worth reporting.
                let same = match (&now_leader, last) {
                    (None, None) => true,
                    (Some(a), Some(b)) => {
                        (a.term, &a.candidate, &a.value) == (b.term, &b.candidate, &b.value)
                    }
                    _ => false,
                };
                Ok((!same).then_some(now_leader))
            },
            |waited| ElectionError::Timeout {
                name: name.to_owned(),
                waited,
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use coord_backend::ManualClock;
    use coord_memory::SingleProcessMemoryBackend;

    #[tokio::test]
    async fn resign_keeps_the_term_counter() {
        let backend: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("el").unwrap());
        let clock = Arc::new(ManualClock::at_millis(1_000_000));
        let election =
            GenericElection::with_options(backend, ElectionOptions::default().with_clock(clock));
        let ttl = Duration::from_secs(5);
        let a = election
            .try_campaign("e", "a", "x", ttl)
            .await
            .unwrap()
            .unwrap();
        assert!(!format!("{a:?}").contains(a.token()));
        election.resign(a).await.unwrap();
        let status = election.status("e").await.unwrap().unwrap();
        assert_eq!((status.term, status.leader), (1, None));
        let b = election
            .try_campaign("e", "b", "y", ttl)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(b.term(), 2);
        let seen = election.leader("e").await.unwrap().unwrap();
        assert!(!format!("{seen:?}").contains("\"y\""));
    }
}
