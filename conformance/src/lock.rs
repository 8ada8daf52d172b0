//! The lock suite: the contract of [`coord_adapters::lock::Lock`],
//! plus the waiting `lock` and the renewing [`LockGuard`] on top of it.
//!
//! Every check is a plain `async fn` over a [`LockEnv`]: a factory of lock
//! clients (each call is a separate client, as another process would have)
//! and a [`TimeControl`] saying how the check makes time pass:
//!
//! - [`TimeControl::Manual`]: the lock judges expiry with a `ManualClock` the
//!   check moves (the generic adapter: [`LockEnv::generic`], used by
//!   [`lock_tests!`](crate::lock_tests));
//! - [`TimeControl::Real`]: the lock judges time itself (e.g. on the server,
//!   as native Redis locks do); the check sleeps past short TTLs
//!   ([`native_lock_tests!`](crate::native_lock_tests));
//! - [`TimeControl::NeverExpires`]: the lock has no TTL (PostgreSQL advisory
//!   locks); the checks about expiry print `SKIPPED` and pass.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`try_lock_race`]: of N clients racing `try_lock` on one key, exactly one gets it;
//! - [`mutual_exclusion`]: racing acquire/release loops never have two holders inside at once;
//! - [`fence_increases`]: fences strictly increase across release and across expiry takeover;
//! - [`expiry_follows_time`]: not takeable before the TTL, takeable after;
//! - [`stale_handle_refused`]: a stale handle can neither renew nor release, and changes nothing;
//! - [`renew_extends`]: a renewal moves the expiry to a TTL from now;
//! - [`release_then_relock`]: a released key is free for everyone, once;
//! - [`lock_bad_input`]: empty key / zero TTL are typed errors and change nothing;
//! - [`waiting_lock_acquires_after_release`] / [`waiting_lock_times_out`]: the waiting `lock`;
//! - [`guard_renews`], [`guard_signals_lost`], [`guard_stops_after_release`]: the guard.
//!
//! Keys are random per run, so the suite can run against a persistent server.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::{
    async_trait, GenericLock, GuardOptions, Lock, LockError, LockExt, LockGuard, LockHandle,
    LockOptions,
};
use coord_backend::ManualClock;

use crate::clients::{granted as held, key, lost, refused, ClientFactory, Ctx};
use crate::{ensure, unique_namespace, BackendFactory, BoxFuture, CheckResult, Failure};

/// Makes a new client of the lock under test (each call: a separate client
/// of the same lock service, as another process would hold).
pub type LockFactory = ClientFactory<dyn Lock, LockError>;

/// Build a [`LockFactory`] from an async closure.
pub use crate::clients::client_factory as lock_factory;

/// How the checks make time pass for the lock under test.
#[derive(Clone, Debug)]
pub enum TimeControl {
    /// The lock judges expiry with this clock; checks move it.
    Manual(Arc<ManualClock>),
    /// The lock judges time itself; checks sleep. `ttl` is the short TTL the
    /// checks use: long enough for several round trips to the store
    /// (e.g. 1 s for a local Redis).
    Real {
        /// The short TTL the checks take locks with.
        ttl: Duration,
    },
    /// The lock has no TTL (held until released or the session ends);
    /// checks about expiry are skipped.
    NeverExpires,
}

/// What a lock check runs against.
#[derive(Clone)]
pub struct LockEnv {
    /// Makes clients of the lock under test.
    pub make: LockFactory,
    /// How time passes for it.
    pub time: TimeControl,
}

impl fmt::Debug for LockEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockEnv")
            .field("time", &self.time)
            .finish_non_exhaustive()
    }
}

impl LockEnv {
    /// An environment for any lock implementation.
    pub fn new(make: LockFactory, time: TimeControl) -> Self {
        LockEnv { make, time }
    }

    /// [`GenericLock`]s over backends from `factory` (one fresh namespace,
    /// named after `label`), all judging expiry with one shared `ManualClock`.
    pub fn generic(factory: BackendFactory, label: &str) -> Self {
        let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
        let namespace = unique_namespace(label);
        let lock_clock = clock.clone();
        let make = lock_factory(move || {
            let factory = factory.clone();
            let namespace = namespace.clone();
            let clock = lock_clock.clone();
            async move {
                let backend = factory(namespace).await?;
                let options = LockOptions::default().with_clock(clock);
                Ok(Arc::new(GenericLock::with_options(backend, options)) as Arc<dyn Lock>)
            }
        });
        LockEnv::new(make, TimeControl::Manual(clock))
    }

    async fn client(&self) -> Result<Arc<dyn Lock>, Failure> {
        (self.make)().await.ctx("making a lock client")
    }

    fn expires(&self) -> bool {
        !matches!(self.time, TimeControl::NeverExpires)
    }

    /// The TTL of locks that checks let expire.
    fn short_ttl(&self) -> Duration {
        match self.time {
            TimeControl::Real { ttl } => ttl,
            _ => Duration::from_millis(1_500),
        }
    }

    /// The TTL of locks that must not expire during a check.
    fn long_ttl(&self) -> Duration {
        match self.time {
            TimeControl::Real { ttl } => (ttl * 60).max(Duration::from_secs(60)),
            _ => Duration::from_secs(3_600),
        }
    }

    /// Let `d` pass for the lock (less than a TTL: the lock must stay held).
    async fn pass(&self, d: Duration) {
        match &self.time {
            TimeControl::Manual(clock) => clock.advance(d),
            _ => tokio::time::sleep(d).await,
        }
    }

    /// Let a lock taken with `ttl` (or last renewed with it) expire.
    async fn expire(&self, ttl: Duration) {
        match &self.time {
            TimeControl::Manual(clock) => clock.advance(ttl + Duration::from_millis(1)),
            // Margin for the round trips between the grant and the check.
            _ => tokio::time::sleep(ttl + ttl / 2 + Duration::from_millis(100)).await,
        }
    }
}

/// A named check of this suite, runnable against any [`LockEnv`].
#[derive(Clone)]
pub struct LockCase {
    /// The check's name (also its test name).
    pub name: &'static str,
    /// Run the check.
    pub run: fn(LockEnv) -> BoxFuture<'static, CheckResult>,
}

impl fmt::Debug for LockCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockCase(lock::{})", self.name)
    }
}

fn skipped(check: &str) -> CheckResult {
    eprintln!("SKIPPED: lock::{check}: the lock under test does not expire");
    Ok(())
}

/// Of 16 clients racing `try_lock` on one free key, exactly one gets it.
pub async fn try_lock_race(env: LockEnv) -> CheckResult {
    let k = key("race");
    let workers = 16;
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let ttl = env.long_ttl();
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let lock = env.client().await?;
        let barrier = barrier.clone();
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let answer = lock.try_lock(&k, ttl).await;
            (lock, answer)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (lock, answer) = task.await.ctx("racer panicked")?;
        // A store error is a failure, never a loser.
        if let Some(handle) = answer.ctx("racing try_lock")? {
            winners.push((lock, handle));
        }
    }
    ensure!(
        winners.len() == 1,
        "{} of {workers} racing try_locks got the lock (expected exactly 1)",
        winners.len()
    );
    let (lock, handle) = winners.pop().expect("one winner");
    lock.release(handle).await.ctx("winner releases")
}

/// Racing acquire/release loops of several clients: the number of holders
/// inside the critical section never exceeds one, and no live holder is
/// displaced (its release fails) while nobody's lease expired.
pub async fn mutual_exclusion(env: LockEnv) -> CheckResult {
    let k = key("mutex");
    let ttl = env.long_ttl();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let entries = Arc::new(AtomicUsize::new(0));
    let displaced = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let lock = env.client().await?;
        let (k, inside, most, entries, displaced) = (
            k.clone(),
            inside.clone(),
            most.clone(),
            entries.clone(),
            displaced.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                match lock.try_lock(&k, ttl).await.ctx("try_lock")? {
                    Some(handle) => {
                        let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now_inside, Ordering::SeqCst);
                        entries.fetch_add(1, Ordering::SeqCst);
                        // Stay inside across scheduling points, so overlaps can show.
                        tokio::task::yield_now().await;
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        match lock.release(handle).await {
                            Ok(()) => {}
                            Err(e) if e.is_lost() => {
                                displaced.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(e) => return Err(Failure::new(format!("holder releases: {e}"))),
                        }
                    }
                    None => tokio::task::yield_now().await,
                }
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await.ctx("worker panicked")??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(
        most <= 1,
        "{most} holders were inside the critical section at once"
    );
    let displaced = displaced.load(Ordering::SeqCst);
    ensure!(
        displaced == 0,
        "{displaced} live holders found their unexpired lock gone when releasing it"
    );
    ensure!(
        entries.load(Ordering::SeqCst) > 0,
        "nobody ever got the lock: the check proved nothing"
    );
    Ok(())
}

/// Fences strictly increase: across a release, and across a takeover after expiry.
pub async fn fence_increases(env: LockEnv) -> CheckResult {
    let k = key("fence");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.short_ttl();
    let h1 = held(a.try_lock(&k, ttl).await, "first try_lock")?;
    a.release(h1.clone()).await.ctx("release")?;
    let h2 = held(b.try_lock(&k, ttl).await, "try_lock after release")?;
    ensure!(
        h2.fence() > h1.fence(),
        "fence after release {} is not above the released holder's {}",
        h2.fence(),
        h1.fence()
    );
    if !env.expires() {
        b.release(h2).await.ctx("release")?;
        return Ok(());
    }
    env.expire(ttl).await;
    let h3 = held(a.try_lock(&k, ttl).await, "takeover after expiry")?;
    ensure!(
        h3.fence() > h2.fence(),
        "fence after takeover {} is not above the expired holder's {}",
        h3.fence(),
        h2.fence()
    );
    a.release(h3).await.ctx("release")
}

/// Expiry follows time: a lock is not takeable before its TTL, and is after.
pub async fn expiry_follows_time(env: LockEnv) -> CheckResult {
    if !env.expires() {
        return skipped("expiry_follows_time");
    }
    let k = key("expiry");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.short_ttl();
    let _h = held(a.try_lock(&k, ttl).await, "try_lock")?;
    match &env.time {
        TimeControl::Manual(clock) => clock.advance(ttl - Duration::from_millis(1)),
        _ => tokio::time::sleep(ttl / 3).await,
    }
    refused(b.try_lock(&k, ttl).await, "try_lock before the TTL ran out")?;
    env.expire(ttl).await;
    let hb = held(b.try_lock(&k, ttl).await, "try_lock after the TTL ran out")?;
    b.release(hb).await.ctx("release")
}

/// A stale handle (released, or expired and taken over) can neither renew
/// nor release, gets `LockError::Lost`, and the newer holder keeps the lock.
pub async fn stale_handle_refused(env: LockEnv) -> CheckResult {
    let k = key("stale");
    let (a, b, c) = (
        env.client().await?,
        env.client().await?,
        env.client().await?,
    );
    let ttl = env.long_ttl();
    // Stale by release.
    let h1 = held(a.try_lock(&k, ttl).await, "try_lock")?;
    let stale = h1.clone();
    a.release(h1).await.ctx("release")?;
    let h2 = held(b.try_lock(&k, ttl).await, "try_lock after release")?;
    lost(a.renew(&stale).await, "renew with a released handle")?;
    lost(
        a.release(stale.clone()).await,
        "release with a released handle",
    )?;
    refused(c.try_lock(&k, ttl).await, "try_lock after a stale release")?;
    b.renew(&h2).await.ctx("the newer holder renews")?;
    b.release(h2).await.ctx("the newer holder releases")?;
    if !env.expires() {
        return Ok(());
    }
    // Stale by expiry and takeover.
    let short = env.short_ttl();
    let h3 = held(a.try_lock(&k, short).await, "try_lock")?;
    env.expire(short).await;
    let h4 = held(b.try_lock(&k, ttl).await, "takeover after expiry")?;
    lost(
        a.renew(&h3).await,
        "renew with an expired, taken-over handle",
    )?;
    lost(
        a.release(h3).await,
        "release with an expired, taken-over handle",
    )?;
    refused(c.try_lock(&k, ttl).await, "try_lock after a stale release")?;
    b.renew(&h4).await.ctx("the newer holder renews")?;
    b.release(h4).await.ctx("the newer holder releases")
}

/// A renewal extends the lease to a TTL from the time of the renewal.
pub async fn renew_extends(env: LockEnv) -> CheckResult {
    let k = key("renew");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.short_ttl();
    let h = held(a.try_lock(&k, ttl).await, "try_lock")?;
    if !env.expires() {
        a.renew(&h).await.ctx("renew")?;
        refused(b.try_lock(&k, ttl).await, "try_lock after renew")?;
        return a.release(h).await.ctx("release");
    }
    env.pass(ttl * 2 / 3).await;
    a.renew(&h).await.ctx("renew within the TTL")?;
    env.pass(ttl * 2 / 3).await;
    refused(
        b.try_lock(&k, ttl).await,
        "try_lock past the first TTL but within the renewed one",
    )?;
    a.renew(&h)
        .await
        .ctx("second renew within the renewed TTL")?;
    env.expire(ttl).await;
    lost(a.renew(&h).await, "renew after the renewed TTL ran out")?;
    let hb = held(
        b.try_lock(&k, ttl).await,
        "try_lock after the renewed TTL ran out",
    )?;
    b.release(hb).await.ctx("release")
}

/// After a release the key is free: another client gets it, then the first again.
pub async fn release_then_relock(env: LockEnv) -> CheckResult {
    let k = key("relock");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.long_ttl();
    let h = held(a.try_lock(&k, ttl).await, "try_lock")?;
    refused(b.try_lock(&k, ttl).await, "try_lock while held")?;
    a.release(h.clone()).await.ctx("release")?;
    lost(a.release(h).await, "second release of the same handle")?;
    let hb = held(b.try_lock(&k, ttl).await, "try_lock after release")?;
    refused(
        a.try_lock(&k, ttl).await,
        "try_lock while the other holds it",
    )?;
    b.release(hb).await.ctx("release")?;
    let again = held(
        a.try_lock(&k, ttl).await,
        "try_lock after the other released",
    )?;
    a.release(again).await.ctx("release")
}

/// Empty key and zero TTL are typed errors (`LockError::Invalid`) and change nothing.
pub async fn lock_bad_input(env: LockEnv) -> CheckResult {
    let k = key("bad");
    let a = env.client().await?;
    let ttl = env.long_ttl();
    match a.try_lock("", ttl).await {
        Err(LockError::Invalid(_)) => {}
        other => {
            return Err(Failure::new(format!(
                "empty key: expected Invalid, got {other:?}"
            )))
        }
    }
    match a.try_lock(&k, Duration::ZERO).await {
        Err(LockError::Invalid(_)) => {}
        other => {
            return Err(Failure::new(format!(
                "zero TTL: expected Invalid, got {other:?}"
            )))
        }
    }
    match a.lock("", ttl, Duration::from_millis(10)).await {
        Err(LockError::Invalid(_)) => {}
        other => {
            return Err(Failure::new(format!(
                "waiting lock with an empty key: expected Invalid, got {other:?}"
            )))
        }
    }
    // The refused zero-TTL call must not have taken the key.
    let h = held(a.try_lock(&k, ttl).await, "try_lock after refused calls")?;
    a.release(h).await.ctx("release")
}

/// The waiting `lock` gets the key once its holder releases it.
pub async fn waiting_lock_acquires_after_release(env: LockEnv) -> CheckResult {
    let k = key("wait");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.long_ttl();
    let ha = held(a.try_lock(&k, ttl).await, "try_lock")?;
    let waiter = {
        let k = k.clone();
        tokio::spawn(async move {
            b.lock(&k, ttl, Duration::from_secs(20))
                .await
                .map(|h| (b, h))
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    ensure!(
        !waiter.is_finished(),
        "the waiting lock returned while the key was held"
    );
    let fence_a = ha.fence();
    a.release(ha).await.ctx("release")?;
    let (b, hb) = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .ctx("waiting lock did not return")?
        .ctx("waiter panicked")?
        .ctx("waiting lock after the holder released")?;
    ensure!(
        hb.fence() > fence_a,
        "fence did not increase ({} after {fence_a})",
        hb.fence()
    );
    b.release(hb).await.ctx("release")
}

/// The waiting `lock` gives up with `LockError::Timeout`, no sooner than its timeout.
pub async fn waiting_lock_times_out(env: LockEnv) -> CheckResult {
    let k = key("timeout");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.long_ttl();
    let ha = held(a.try_lock(&k, ttl).await, "try_lock")?;
    let timeout = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    match b.lock(&k, ttl, timeout).await {
        Err(LockError::Timeout { .. }) => {}
        Ok(h) => {
            return Err(Failure::new(format!(
                "waiting lock got a held key (fence {})",
                h.fence()
            )))
        }
        Err(e) => return Err(Failure::new(format!("expected Timeout, got {e}"))),
    }
    ensure!(
        started.elapsed() >= timeout,
        "gave up after {:?}, before its timeout of {timeout:?}",
        started.elapsed()
    );
    a.release(ha).await.ctx("release")
}

async fn wait_for_renewals(guard: &LockGuard, more_than: u64) -> CheckResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while guard.renewals() <= more_than {
        ensure!(
            !guard.is_lost(),
            "guard lost its lock: {:?}",
            guard.lost_signal().borrow().clone()
        );
        ensure!(
            tokio::time::Instant::now() < deadline,
            "guard did not renew within 20 s ({} renewals)",
            guard.renewals()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// The guard renews in the background: it holds the key across several TTLs.
pub async fn guard_renews(env: LockEnv) -> CheckResult {
    let k = key("guard");
    let (a, b) = (env.client().await?, env.client().await?);
    let ttl = env.short_ttl();
    let guard = LockGuard::try_acquire(&a, &k, ttl)
        .await
        .ctx("guard try_acquire")?
        .ok_or_else(|| Failure::new("guard try_acquire: key held elsewhere"))?;
    match &env.time {
        TimeControl::Manual(clock) => {
            // Each step: a renewal lands, then two thirds of a TTL pass.
            for _ in 0..5 {
                wait_for_renewals(&guard, guard.renewals()).await?;
                clock.advance(ttl * 2 / 3);
                refused(b.try_lock(&k, ttl).await, "try_lock while the guard renews")?;
            }
        }
        _ => {
            for _ in 0..6 {
                tokio::time::sleep(ttl / 2).await;
                refused(b.try_lock(&k, ttl).await, "try_lock while the guard renews")?;
            }
        }
    }
    ensure!(!guard.is_lost(), "guard reports lost while renewing");
    ensure!(
        guard.renewals() >= 2,
        "guard renewed only {} times",
        guard.renewals()
    );
    guard.release().await.ctx("guard release")?;
    let hb = held(
        b.try_lock(&k, ttl).await,
        "try_lock after the guard released",
    )?;
    b.release(hb).await.ctx("release")
}

/// The guard's lost signal fires when its lease expires and another holder
/// takes over; the new holder keeps the lock.
pub async fn guard_signals_lost(env: LockEnv) -> CheckResult {
    if !env.expires() {
        return skipped("guard_signals_lost");
    }
    let k = key("guardlost");
    let (a, b, c) = (
        env.client().await?,
        env.client().await?,
        env.client().await?,
    );
    let ttl = env.short_ttl();
    let handle = held(a.try_lock(&k, ttl).await, "try_lock")?;
    let options = match env.time {
        // The clock jumps past the TTL; renewals keep their normal pace.
        TimeControl::Manual(_) => GuardOptions::default(),
        // Renewing too late lets the lease expire in real time.
        _ => GuardOptions::default().with_renew_every(ttl * 3),
    };
    let guard = LockGuard::new(a.clone(), handle, options);
    let signal = guard.lost_signal();
    ensure!(!guard.is_lost(), "guard reports lost right after acquiring");
    env.expire(ttl).await;
    let hb = held(
        b.try_lock(&k, env.long_ttl()).await,
        "takeover after expiry",
    )?;
    ensure!(
        hb.fence() > guard.fence(),
        "takeover fence {} not above the guard's {}",
        hb.fence(),
        guard.fence()
    );
    let reason = tokio::time::timeout(ttl * 4 + Duration::from_secs(20), guard.lost())
        .await
        .ctx("the lost signal did not fire")?;
    ensure!(
        signal.borrow().is_some(),
        "lost() returned but a cloned signal does not show it"
    );
    ensure!(
        reason.is_lost(),
        "the signal fired with an unexpected reason: {reason}"
    );
    lost(guard.release().await, "release of a lost guard")?;
    refused(
        c.try_lock(&k, ttl).await,
        "try_lock after the lost guard released",
    )?;
    b.release(hb).await.ctx("the new holder releases")
}

/// Counts renewals that reach the lock, to see that a guard stopped renewing.
#[derive(Debug)]
struct CountingLock {
    inner: Arc<dyn Lock>,
    renews: AtomicU64,
}

#[async_trait]
impl Lock for CountingLock {
    async fn try_lock(&self, key: &str, ttl: Duration) -> Result<Option<LockHandle>, LockError> {
        self.inner.try_lock(key, ttl).await
    }
    async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.renews.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(handle).await
    }
    async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
        self.inner.release(handle).await
    }
}

/// A released guard stops renewing and frees the key; a dropped guard stops
/// renewing and frees the key too (best effort, in the background).
pub async fn guard_stops_after_release(env: LockEnv) -> CheckResult {
    let (k1, k2) = (key("guardrel"), key("guarddrop"));
    let counting = Arc::new(CountingLock {
        inner: env.client().await?,
        renews: AtomicU64::new(0),
    });
    let a: Arc<dyn Lock> = counting.clone();
    let b = env.client().await?;
    let ttl = env.long_ttl();
    let every = Duration::from_millis(40);
    let options = GuardOptions::default().with_renew_every(every);

    let handle = held(a.try_lock(&k1, ttl).await, "try_lock")?;
    let guard = LockGuard::new(a.clone(), handle, options.clone());
    wait_for_renewals(&guard, 1).await?;
    guard.release().await.ctx("guard release")?;
    let after_release = counting.renews.load(Ordering::SeqCst);
    tokio::time::sleep(every * 5).await;
    let later = counting.renews.load(Ordering::SeqCst);
    ensure!(
        later == after_release,
        "the guard renewed {} more times after release",
        later - after_release
    );
    let hb = held(
        b.try_lock(&k1, ttl).await,
        "try_lock after the guard released",
    )?;
    b.release(hb).await.ctx("release")?;

    let handle = held(a.try_lock(&k2, ttl).await, "try_lock")?;
    let guard = LockGuard::new(a.clone(), handle, options);
    wait_for_renewals(&guard, 0).await?;
    drop(guard);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let hb = loop {
        if let Some(hb) = b.try_lock(&k2, ttl).await.ctx("try_lock after drop")? {
            break hb;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "a dropped guard's lock was not released within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after_drop = counting.renews.load(Ordering::SeqCst);
    tokio::time::sleep(every * 5).await;
    ensure!(
        counting.renews.load(Ordering::SeqCst) == after_drop,
        "a dropped guard kept renewing"
    );
    b.release(hb).await.ctx("release")
}

crate::__define_suite! {$
    /// The lock suite's one list of cases (see [`crate::__define_suite!`]).
    __lock_suite "lock";
    /// Every case of the lock suite, over [`GenericLock`]s on a backend
    /// factory with a `ManualClock` (see [`LockEnv::generic`]).
    cases;
    /// Expand the lock suite into one `#[tokio::test]` per case, over
    /// [`GenericLock`]s on a [`BackendFactory`] expression (evaluated once per test;
    /// it may also be an `Option<BackendFactory>`, `None` = skipped).
    lock_tests(lock);
    try_lock_race,
    mutual_exclusion,
    fence_increases,
    expiry_follows_time,
    stale_handle_refused,
    renew_extends,
    release_then_relock,
    lock_bad_input,
    waiting_lock_acquires_after_release,
    waiting_lock_times_out,
    guard_renews,
    guard_signals_lost,
    guard_stops_after_release,
}

/// Every check of the lock suite, runnable against any [`LockEnv`]
/// (native locks: see [`native_lock_tests!`](crate::native_lock_tests)).
pub fn native_cases() -> Vec<LockCase> {
    __lock_suite!(names [crate::__named_checks] (LockEnv => LockCase;))
}

/// Run the check called `name` against `env`, panicking with its failure (for `#[test]`s).
pub async fn run_native_case(name: &str, env: LockEnv) {
    let case = native_cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no lock check named {name}"));
    if let Err(failure) = (case.run)(env).await {
        panic!("lock::{name} failed: {failure}");
    }
}

/// Expand the lock suite into one `#[tokio::test]` per case for any lock
/// implementation: the expression gives a [`LockEnv`] (or an
/// `Option<LockEnv>`, `None` = the server is not configured: skipped) and is
/// evaluated once per test.
///
/// ```ignore
/// coord_conformance::native_lock_tests!(
///     coord_conformance::server_env("COORD_TEST_REDIS_URL").map(|url| LockEnv::new(
///         coord_conformance::lock::lock_factory(move || { let url = url.clone(); async move { my_redis_lock(&url).await } }),
///         coord_conformance::lock::TimeControl::Real { ttl: std::time::Duration::from_secs(1) },
///     ))
/// );
/// ```
#[macro_export]
macro_rules! native_lock_tests {
    ($env:expr) => {
        $crate::__lock_suite!(names [$crate::__lock_env_cases_as_tests] ($env;));
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __lock_env_cases_as_tests {
    ($env:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let env: ::std::option::Option<$crate::lock::LockEnv> = ($env).into();
                let ::std::option::Option::Some(env) = env else { return };
                $crate::lock::run_native_case(stringify!($name), env).await;
            }
        )*
    };
}
