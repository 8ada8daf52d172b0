//! The rwlock and election suites on the in-process memory store, and proof
//! that each goes red on deliberately broken variants (a check that cannot
//! fail is a defect).
//!
//! The broken variants wrap the generic adapters with one bug switched on at
//! a time; with no bug switched on the wrappers pass every check (tested
//! below), so a red check is caused by the bug, not by the wrapper.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use coord_adapters::election::{
    Election, ElectionError, ElectionOptions, GenericElection, LeaderInfo, Leadership,
};
use coord_adapters::lock::{async_trait, LockError, LockHandle};
use coord_adapters::mint_token;
use coord_adapters::rwlock::{GenericRwLock, RwHandle, RwLock, RwLockOptions, RwMode, RwStatus};
use coord_conformance::election::{self as election_suite, ElectionEnv};
use coord_conformance::rwlock::{self as rwlock_suite, RwEnv};

mod common;

use common::{all_pass, memory, red_on_each_bug, Red};

// ---------------------------------------------------------------------------
// Broken read-write locks

#[derive(Clone, Copy, Debug, Default)]
struct RwBugs {
    /// A refused try_write hands out a write grant anyway (beside readers).
    writer_beside_readers: bool,
    /// `write` retries try_write instead of queueing: readers starve it.
    no_writer_preference: bool,
    /// renew answers Ok whatever the handle.
    renew_ignores_the_holder: bool,
}

#[derive(Debug)]
struct BuggyRw {
    inner: GenericRwLock,
    bugs: RwBugs,
}

impl BuggyRw {
    fn env(bugs: RwBugs) -> RwEnv {
        RwEnv::over_backends(memory(), "buggy_rw", move |backend, clock| {
            let options = RwLockOptions::default().with_clock(clock);
            let inner = GenericRwLock::with_options(backend, options);
            Arc::new(BuggyRw { inner, bugs }) as Arc<dyn RwLock>
        })
    }
}

#[async_trait]
impl RwLock for BuggyRw {
    async fn try_read(&self, key: &str, ttl: Duration) -> Result<Option<RwHandle>, LockError> {
        self.inner.try_read(key, ttl).await
    }

    async fn try_write(&self, key: &str, ttl: Duration) -> Result<Option<RwHandle>, LockError> {
        let answer = self.inner.try_write(key, ttl).await?;
        if answer.is_none() && self.bugs.writer_beside_readers {
            let lease = LockHandle::new(key, mint_token(), u64::MAX, ttl, SystemTime::now() + ttl);
            return Ok(Some(RwHandle::new(RwMode::Write, lease)));
        }
        Ok(answer)
    }

    async fn read(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RwHandle, LockError> {
        self.inner.read(key, ttl, timeout).await
    }

    async fn write(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<RwHandle, LockError> {
        if !self.bugs.no_writer_preference {
            return self.inner.write(key, ttl, timeout).await;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(handle) = self.inner.try_write(key, ttl).await? {
                return Ok(handle);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(LockError::Timeout {
                    key: key.to_owned(),
                    waited: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn renew(&self, handle: &RwHandle) -> Result<(), LockError> {
        if self.bugs.renew_ignores_the_holder {
            return Ok(());
        }
        self.inner.renew(handle).await
    }

    async fn release(&self, handle: RwHandle) -> Result<(), LockError> {
        if handle.fence() == u64::MAX {
            return Ok(()); // a forged grant of `writer_beside_readers`
        }
        self.inner.release(handle).await
    }

    async fn status(&self, key: &str) -> Result<Option<RwStatus>, LockError> {
        self.inner.status(key).await
    }
}

// ---------------------------------------------------------------------------
// Broken elections

#[derive(Clone, Copy, Debug, Default)]
struct ElectionBugs {
    /// A refused campaign hands out a leadership anyway.
    second_leader: bool,
    /// Every leadership reports term 1.
    term_not_bumped: bool,
    /// renew and proclaim answer Ok whatever the leadership.
    renew_ignores_the_leader: bool,
}

#[derive(Debug)]
struct BuggyElection {
    inner: GenericElection,
    bugs: ElectionBugs,
}

impl BuggyElection {
    fn env(bugs: ElectionBugs) -> ElectionEnv {
        ElectionEnv::over_backends(memory(), "buggy_election", move |backend, clock| {
            let options = ElectionOptions::default().with_clock(clock);
            let inner = GenericElection::with_options(backend, options);
            Arc::new(BuggyElection { inner, bugs }) as Arc<dyn Election>
        })
    }

    fn report(&self, won: Leadership) -> Leadership {
        if !self.bugs.term_not_bumped {
            return won;
        }
        with_term(&won, 1)
    }

    /// The leadership the inner adapter knows (the buggy term undone).
    async fn real(&self, leadership: &Leadership) -> Leadership {
        if !self.bugs.term_not_bumped {
            return leadership.clone();
        }
        let term = match self.inner.status(leadership.name()).await {
            Ok(Some(status)) => status.term,
            _ => 1,
        };
        with_term(leadership, term)
    }
}

/// `leadership` as it would read with another term.
fn with_term(leadership: &Leadership, term: u64) -> Leadership {
    Leadership::new(
        leadership.name(),
        leadership.candidate(),
        leadership.token(),
        term,
        leadership.ttl(),
        leadership.expires_at(),
    )
}

#[async_trait]
impl Election for BuggyElection {
    async fn try_campaign(
        &self,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
    ) -> Result<Option<Leadership>, ElectionError> {
        match self.inner.try_campaign(name, candidate, value, ttl).await? {
            Some(won) => Ok(Some(self.report(won))),
            None if self.bugs.second_leader => Ok(Some(Leadership::new(
                name,
                candidate,
                mint_token(),
                1,
                ttl,
                SystemTime::now() + ttl,
            ))),
            None => Ok(None),
        }
    }

    async fn campaign(
        &self,
        name: &str,
        candidate: &str,
        value: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<Leadership, ElectionError> {
        let won = self
            .inner
            .campaign(name, candidate, value, ttl, timeout)
            .await?;
        Ok(self.report(won))
    }

    async fn renew(&self, leadership: &Leadership) -> Result<(), ElectionError> {
        if self.bugs.renew_ignores_the_leader {
            return Ok(());
        }
        self.inner.renew(&self.real(leadership).await).await
    }

    async fn proclaim(&self, leadership: &Leadership, value: &str) -> Result<(), ElectionError> {
        if self.bugs.renew_ignores_the_leader {
            return Ok(());
        }
        self.inner
            .proclaim(&self.real(leadership).await, value)
            .await
    }

    async fn resign(&self, leadership: Leadership) -> Result<(), ElectionError> {
        self.inner.resign(self.real(&leadership).await).await
    }

    async fn leader(&self, name: &str) -> Result<Option<LeaderInfo>, ElectionError> {
        self.inner.leader(name).await
    }

    async fn observe(
        &self,
        name: &str,
        last: Option<&LeaderInfo>,
        timeout: Duration,
    ) -> Result<Option<LeaderInfo>, ElectionError> {
        self.inner.observe(name, last, timeout).await
    }
}

// ---------------------------------------------------------------------------
// The wrappers without bugs pass: the reds below come from the bugs.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bug_free_wrappers_pass_every_check() {
    let bug_free = || BuggyRw::env(RwBugs::default());
    all_pass(rwlock_suite::checks(), bug_free, "bug-free BuggyRw, rwlock").await;
    let bug_free = || BuggyElection::env(ElectionBugs::default());
    all_pass(
        election_suite::checks(),
        bug_free,
        "bug-free BuggyElection, election",
    )
    .await;
}

// ---------------------------------------------------------------------------
// Each suite goes red on each bug of its wrapper.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rwlock_suite_red_on_each_bug() {
    let beside = ["readers_share", "writer_excludes"];
    let reds: &[Red<'_, RwBugs>] = &[
        (|b| b.writer_beside_readers = true, &beside),
        (|b| b.no_writer_preference = true, &["writer_not_starved"]),
        (
            |b| b.renew_ignores_the_holder = true,
            &["stale_holder_refused"],
        ),
    ];
    red_on_each_bug(&rwlock_suite::checks(), BuggyRw::env, reds).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn election_suite_red_on_each_bug() {
    let terms = ["term_increases", "resign_hands_over"];
    let stale = ["expired_leader_replaced", "proclaim_only_by_leader"];
    let reds: &[Red<'_, ElectionBugs>] = &[
        (|b| b.second_leader = true, &["one_leader_race"]),
        (|b| b.term_not_bumped = true, &terms),
        (|b| b.renew_ignores_the_leader = true, &stale),
    ];
    red_on_each_bug(&election_suite::checks(), BuggyElection::env, reds).await;
}
