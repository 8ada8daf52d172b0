//! The fair lock suite: the contract of a FIFO lock such as
//! [`coord_adapters::lock::FairLock`] — everything a [`Lock`] promises, plus
//! hand-over in request order through the waiting
//! [`LockExt::lock_with`] (which calls [`Lock::wait_lock`]).
//!
//! Every check is a plain `async fn` over a [`FairEnv`]: a factory of lock
//! clients, a probe saying how many waiters are queued for a key, and the
//! `ManualClock` the lock judges leases with.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`fair_mutual_exclusion`]: workers doing unprotected read-increment-write under the
//!   waiting lock reach the exact total, and fences strictly increase in grant order;
//! - [`fifo_order`]: waiters queued one after another get the lock in that order;
//! - [`try_lock_never_jumps_the_queue`]: with a live waiter in line, `try_lock` is refused
//!   even when the lock was just released;
//! - [`timed_out_waiter_leaves_no_hole`]: a waiter that times out leaves the queue: the
//!   lock is free for anyone at once after the holder releases;
//! - [`dead_holder_and_ticket_expire`]: a holder that never releases and a waiter that died
//!   in line block the queue only until their leases run out; the next waiter gets the lock
//!   with a higher fence;
//! - [`fair_fences_increase`]: fences strictly increase across release, waiting grant and
//!   expiry takeover; a stale handle can neither renew nor release;
//! - [`fair_bad_input`]: empty key / zero TTL are typed errors on every call;
//! - [`hand_over_wakes_the_next_waiter`]: a release wakes the waiter it hands
//!   the lock to (one with no fallback poll before its timeout gets it), in a
//!   fresh namespace and again after a reclaim (from which etcd deletes for
//!   real), also a waiter handed the lock before its first ticket renewal;
//! - [`release_reaches_a_live_waiter_behind_many_dead`]: a release with more
//!   dead waiters ahead of a live one than one decision reads still hands
//!   the lock to (and wakes) the live one.
//!
//! The last two need a lock that wakes its waiters: over a store without
//! change notifications they pass vacuously, with a note (its waiters poll).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use coord_adapters::lock::{
    FairLock, FairLockOptions, Lock, LockError, LockExt, LockHandle, WaitOptions,
};
use coord_backend::{Backend, Error, InvalidInput, ManualClock, ReclaimOptions};

use crate::clients::{granted as held, key, lost, refused, Ctx};
use crate::lock::{lock_factory, LockFactory};
use crate::{ensure, unique_namespace, BackendFactory, BoxFuture, CheckResult, Failure};

/// Says how many waiters are queued for a key (live or not).
pub type QueueProbe =
    Arc<dyn Fn(String) -> BoxFuture<'static, Result<usize, LockError>> + Send + Sync>;

/// Build a [`QueueProbe`] from an async closure.
pub fn queue_probe<F, Fut>(probe: F) -> QueueProbe
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<usize, LockError>> + Send + 'static,
{
    Arc::new(move |key| Box::pin(probe(key)))
}

/// Opens a client of the store under the lock (its namespace).
pub type StoreProbe =
    Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Backend>, Error>> + Send + Sync>;

/// What a fair lock check runs against. The lock must start empty.
#[derive(Clone)]
pub struct FairEnv {
    /// Makes clients of the lock under test.
    pub make: LockFactory,
    /// How many waiters are queued for a key.
    pub queued: QueueProbe,
    /// The clock the lock judges leases with; checks move it.
    pub clock: Arc<ManualClock>,
    /// The store under the lock, for the checks whose promise depends on
    /// it: a hand-over wakes the next waiter only over a store with change
    /// notifications, and a reclaim changes how etcd deletes. `None`: a
    /// lock with no store behind it (a double), which wakes its waiters
    /// itself and has nothing to reclaim.
    pub store: Option<StoreProbe>,
}

impl fmt::Debug for FairEnv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairEnv")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl FairEnv {
    /// An environment for any fair lock implementation (no store: see [`FairEnv::store`]).
    pub fn new(make: LockFactory, queued: QueueProbe, clock: Arc<ManualClock>) -> Self {
        FairEnv {
            make,
            queued,
            clock,
            store: None,
        }
    }

    /// The same environment, with the store under the lock.
    pub fn with_store(mut self, store: StoreProbe) -> Self {
        self.store = Some(store);
        self
    }

    /// [`FairLock`]s over backends from `factory` (one fresh namespace named
    /// after `label`), all judging leases with one shared `ManualClock`.
    pub fn generic(factory: BackendFactory, label: &str) -> Self {
        let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
        let namespace = unique_namespace(label);
        let make_fair = {
            let (factory, namespace, clock) = (factory.clone(), namespace.clone(), clock.clone());
            move || {
                let (factory, namespace, clock) =
                    (factory.clone(), namespace.clone(), clock.clone());
                async move {
                    let backend = factory(namespace).await?;
                    let options = FairLockOptions::default().with_clock(clock);
                    Ok::<_, LockError>(FairLock::with_options(backend, options))
                }
            }
        };
        let make = {
            let make_fair = make_fair.clone();
            lock_factory(move || {
                let made = make_fair();
                async move { Ok(Arc::new(made.await?) as Arc<dyn Lock>) }
            })
        };
        let queued = queue_probe(move |key| {
            let made = make_fair();
            async move {
                let lock = made.await?;
                Ok(lock.status(&key).await?.map_or(0, |s| s.waiting.len()))
            }
        });
        let store: StoreProbe = Arc::new(move || factory(namespace.clone()));
        FairEnv::new(make, queued, clock).with_store(store)
    }

    async fn client(&self) -> Result<Arc<dyn Lock>, Failure> {
        (self.make)().await.ctx("making a lock client")
    }

    /// A client of the store under the lock, when it has one; `Err(())`:
    /// its store offers no change notifications, so its waiters poll and a
    /// check of wake-ups has nothing to check (noted on stderr).
    async fn waking_store(
        &self,
        case: &str,
    ) -> Result<Result<Option<Arc<dyn Backend>>, ()>, Failure> {
        let Some(open) = &self.store else {
            return Ok(Ok(None));
        };
        let store = open().await.ctx("opening the store")?;
        if store.changes().is_none() {
            eprintln!(
                "NOTE: fair_lock::{case}: {} offers no change notifications (its waiters \
                 poll); nothing to check",
                store.store_name()
            );
            return Ok(Err(()));
        }
        Ok(Ok(Some(store)))
    }

    /// Wait (real time, bounded) until `n` waiters are queued for `key`.
    async fn until_queued(&self, key: &str, n: usize) -> CheckResult {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let queued = (self.queued)(key.to_owned())
                .await
                .ctx("probing the queue")?;
            if queued == n {
                return Ok(());
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "{queued} waiters queued for {key:?} after {PATIENCE:?}, expected {n}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Longest real wait for something that must happen (a grant, a queue
/// change); the checks never wait for time to pass otherwise.
const PATIENCE: Duration = Duration::from_secs(20);
/// A lease that never runs out during a check (the clock is manual).
const LONG: Duration = Duration::from_secs(3_600);
/// A lease the checks let run out.
const SHORT: Duration = Duration::from_secs(2);

/// Wait with a short fallback poll, so a lock without notifications still
/// hands over quickly.
fn patient() -> WaitOptions {
    WaitOptions::with_timeout(PATIENCE)
        .with_backoff(Duration::from_millis(2), Duration::from_millis(20))
}

/// Wait with no fallback poll before [`PATIENCE`] has passed twice (a
/// waiter also looks once at its timeout): within [`PATIENCE`], such a
/// waiter gets the lock only when something wakes it.
fn woken_only() -> WaitOptions {
    WaitOptions::with_timeout(PATIENCE * 2).with_backoff(PATIENCE * 4, PATIENCE * 4)
}

/// The lock `waiting` (a waiter with [`woken_only`]) got within [`PATIENCE`]:
/// it was woken. A generous bound, as for every grant the checks wait for
/// (a missed wake-up fails, a slow one does not).
async fn woken(
    mut waiting: tokio::task::JoinHandle<Result<LockHandle, LockError>>,
    what: &str,
) -> Result<LockHandle, Failure> {
    match tokio::time::timeout(PATIENCE, &mut waiting).await {
        Ok(answer) => answer.ctx("waiter panicked")?.ctx(what),
        Err(_) => {
            waiting.abort();
            Err(Failure::new(format!(
                "{what}: no grant within {PATIENCE:?} (the waiter polls no sooner): it was not woken"
            )))
        }
    }
}

/// 5 workers, each 8 times: wait for the lock, read a shared counter, yield,
/// write it back plus one, release. The total is exact, and the fences seen
/// inside the critical section strictly increase.
pub async fn fair_mutual_exclusion(env: FairEnv) -> CheckResult {
    let k = key("mutex");
    let counter = Arc::new(AtomicU64::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let (workers, rounds) = (5u64, 8u64);
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let lock = env.client().await?;
        let (k, counter, fences) = (k.clone(), counter.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let handle = lock.lock_with(&k, LONG, &patient()).await.ctx("lock")?;
                fences.lock().expect("fences").push(handle.fence());
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(seen + 1, Ordering::SeqCst);
                lock.release(handle).await.ctx("release")?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await.ctx("worker panicked")??;
    }
    let total = counter.load(Ordering::SeqCst);
    ensure!(
        total == workers * rounds,
        "{total} increments survived of {}: two holders were inside at once",
        workers * rounds
    );
    let fences = fences.lock().expect("fences").clone();
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences in grant order do not strictly increase: {fences:?}"
    );
    Ok(())
}

/// A holder holds; 5 waiters queue one after another (each seen queued
/// before the next starts); the holder releases; each waiter releases as
/// soon as it holds. They get the lock in the order they queued.
pub async fn fifo_order(env: FairEnv) -> CheckResult {
    let k = key("fifo");
    let holder = env.client().await?;
    let first = held(holder.try_lock(&k, LONG).await, "first try_lock")?;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let lock = env.client().await?;
        let (k2, order) = (k.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let handle = lock.lock_with(&k2, LONG, &patient()).await.ctx("waiter")?;
            order.lock().expect("order").push(i);
            lock.release(handle).await.ctx("waiter releases")
        }));
        env.until_queued(&k, i + 1).await?;
    }
    holder.release(first).await.ctx("holder releases")?;
    for task in tasks {
        task.await.ctx("waiter panicked")??;
    }
    let order = order.lock().expect("order").clone();
    ensure!(
        order == vec![0, 1, 2, 3, 4],
        "waiters queued in order 0..5 got the lock in order {order:?}"
    );
    Ok(())
}

/// With a live waiter in line, `try_lock` is refused, also right after the
/// holder released; the waiter then gets the lock.
pub async fn try_lock_never_jumps_the_queue(env: FairEnv) -> CheckResult {
    let k = key("nojump");
    let (holder, waiter, jumper) = (
        env.client().await?,
        env.client().await?,
        env.client().await?,
    );
    let h = held(holder.try_lock(&k, LONG).await, "first try_lock")?;
    let h_fence = h.fence();
    let k2 = k.clone();
    let waiting = tokio::spawn(async move { waiter.lock_with(&k2, LONG, &patient()).await });
    env.until_queued(&k, 1).await?;
    refused(jumper.try_lock(&k, LONG).await, "try_lock while held")?;
    holder.release(h).await.ctx("holder releases")?;
    refused(
        jumper.try_lock(&k, LONG).await,
        "try_lock right after the release, with a waiter in line",
    )?;
    let got = waiting.await.ctx("waiter panicked")?.ctx("waiter")?;
    ensure!(
        got.fence() == h_fence + 1,
        "the waiter in line got fence {}, expected the next grant after {h_fence} (someone jumped the queue)",
        got.fence()
    );
    jumper.release(got).await.ctx("release by handle")
}

/// A waiter that times out leaves the queue: once the holder releases, the
/// lock is free for anyone at once (no ticket of the quitter blocks it).
pub async fn timed_out_waiter_leaves_no_hole(env: FairEnv) -> CheckResult {
    let k = key("nohole");
    let (holder, quitter, next) = (
        env.client().await?,
        env.client().await?,
        env.client().await?,
    );
    let h = held(holder.try_lock(&k, LONG).await, "first try_lock")?;
    let quit = quitter
        .lock_with(
            &k,
            LONG,
            &WaitOptions::with_timeout(Duration::from_millis(100)),
        )
        .await;
    ensure!(
        matches!(quit, Err(LockError::Timeout { .. })),
        "a waiter behind a live holder: expected Timeout, got {quit:?}"
    );
    env.until_queued(&k, 0).await?;
    holder.release(h).await.ctx("holder releases")?;
    let again = held(
        next.try_lock(&k, LONG).await,
        "try_lock after the release, the only waiter having timed out",
    )?;
    next.release(again).await.ctx("release")
}

/// A holder that never releases and a waiter that dies in line (its task is
/// aborted: its ticket stays) block the next waiter only until their leases
/// run out; the next waiter then gets the lock with a higher fence, and the
/// dead ticket is gone.
pub async fn dead_holder_and_ticket_expire(env: FairEnv) -> CheckResult {
    let k = key("dead");
    let (holder, dying, next) = (
        env.client().await?,
        env.client().await?,
        env.client().await?,
    );
    let h = held(holder.try_lock(&k, SHORT).await, "first try_lock")?;
    let k2 = k.clone();
    let doomed = tokio::spawn(async move { dying.lock_with(&k2, SHORT, &patient()).await });
    env.until_queued(&k, 1).await?;
    doomed.abort();
    let _ = doomed.await;
    let k3 = k.clone();
    let waiting = tokio::spawn(async move { next.lock_with(&k3, LONG, &patient()).await });
    env.until_queued(&k, 2).await?;
    // Neither lease has run out: the waiter must still be waiting.
    let probe = env.client().await?;
    refused(
        probe.try_lock(&k, LONG).await,
        "try_lock while both leases live",
    )?;
    ensure!(
        !waiting.is_finished(),
        "the waiter got the lock while the holder's lease was live"
    );
    env.clock.advance(SHORT + Duration::from_millis(1));
    let got = waiting
        .await
        .ctx("waiter panicked")?
        .ctx("waiter after the leases ran out")?;
    ensure!(
        got.fence() > h.fence(),
        "fence {} after a dead holder's {} is not higher",
        got.fence(),
        h.fence()
    );
    env.until_queued(&k, 0).await?;
    lost(holder.release(h).await, "the dead holder's release")?;
    probe.release(got).await.ctx("release by handle")
}

/// Fences strictly increase across try_lock, release, a waiting grant and
/// an expiry takeover; a stale handle can neither renew nor release.
pub async fn fair_fences_increase(env: FairEnv) -> CheckResult {
    let k = key("fence");
    let (a, b) = (env.client().await?, env.client().await?);
    let h1 = held(a.try_lock(&k, SHORT).await, "first try_lock")?;
    a.release(h1.clone()).await.ctx("release")?;
    let h2 = b
        .lock_with(&k, SHORT, &patient())
        .await
        .ctx("waiting lock")?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    let h3 = held(a.try_lock(&k, SHORT).await, "take over after expiry")?;
    let fences = [h1.fence(), h2.fence(), h3.fence()];
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fences {fences:?} do not strictly increase"
    );
    lost(b.renew(&h2).await, "renew of a taken-over handle")?;
    lost(b.release(h2).await, "release of a taken-over handle")?;
    lost(a.release(h1).await, "release of a released handle")?;
    a.renew(&h3).await.ctx("the holder renews")?;
    a.release(h3).await.ctx("the holder releases")
}

/// Empty key and zero TTL are [`LockError::Invalid`] on `try_lock` and on
/// the waiting `lock`.
pub async fn fair_bad_input(env: FairEnv) -> CheckResult {
    let lock = env.client().await?;
    let k = key("bad");
    let cases: [(&str, Duration); 2] = [("", LONG), (k.as_str(), Duration::ZERO)];
    for (key, ttl) in cases {
        let tried = lock.try_lock(key, ttl).await;
        ensure!(
            matches!(tried, Err(LockError::Invalid(_))),
            "try_lock({key:?}, {ttl:?}): expected Invalid, got {tried:?}"
        );
        let waited = lock.lock_with(key, ttl, &patient()).await;
        ensure!(
            matches!(waited, Err(LockError::Invalid(_))),
            "lock({key:?}, {ttl:?}): expected Invalid, got {waited:?}"
        );
    }
    let nul = lock.try_lock("a\0b", LONG).await;
    ensure!(
        matches!(nul, Err(LockError::Invalid(InvalidInput::NulByte(_)))),
        "a key with a NUL byte: expected Invalid(NulByte), got {nul:?}"
    );
    env.until_queued(&k, 0).await?;
    let h = held(lock.try_lock(&k, LONG).await, "try_lock after bad input")?;
    ensure!(
        h.fence() == 1,
        "bad input changed the fence: first grant has {}",
        h.fence()
    );
    lock.release(h).await.ctx("release")
}

/// A holder releases while one waiter waits with no fallback poll within
/// the 20 s the check waits for its grant (and a lease whose first renewal is far off, so its ticket
/// record was never written when it is handed the lock): the hand-over
/// wakes it, it gets the lock with the next fence. Once in a fresh
/// namespace, then again after a reclaim of it (etcd deletes for real from
/// its first reclaim on, and a delete of a key that is not there is no
/// event: a hand-over woken by one sleeps until its poll).
pub async fn hand_over_wakes_the_next_waiter(env: FairEnv) -> CheckResult {
    let Ok(store) = env.waking_store("hand_over_wakes_the_next_waiter").await? else {
        return Ok(());
    };
    for round in ["in a fresh namespace", "after a reclaim"] {
        if round == "after a reclaim" {
            let Some(store) = &store else { break };
            match store.reclaim(&ReclaimOptions::DEFAULT).await {
                Ok(_) => {}
                Err(Error::Unsupported { .. }) => break,
                Err(error) => return Err(Failure::new(format!("reclaim: {error}"))),
            }
        }
        let k = key("wake");
        let (holder, waiter) = (env.client().await?, env.client().await?);
        let h = held(holder.try_lock(&k, LONG).await, "first try_lock")?;
        let k2 = k.clone();
        let waiting = tokio::spawn(async move { waiter.lock_with(&k2, LONG, &woken_only()).await });
        env.until_queued(&k, 1).await?;
        holder.release(h.clone()).await.ctx("holder releases")?;
        let what = format!("{round}: a waiter handed the lock by a release");
        let got = woken(waiting, &what).await?;
        ensure!(
            got.fence() == h.fence() + 1,
            "{round}: the waiter got fence {} after {}",
            got.fence(),
            h.fence()
        );
        holder.release(got).await.ctx("release by handle")?;
    }
    Ok(())
}

/// Dead waiters (their tasks aborted, their leases run out) ahead of a
/// live one, more than a release's decision reads at once (40: the
/// adapter reads 16): the release still hands the lock to the live waiter
/// and wakes it (it has no fallback poll within the 20 s the check waits),
/// and no dead ticket is left in line.
pub async fn release_reaches_a_live_waiter_behind_many_dead(env: FairEnv) -> CheckResult {
    const DEAD: usize = 40;
    let case = "release_reaches_a_live_waiter_behind_many_dead";
    if env.waking_store(case).await?.is_err() {
        return Ok(());
    }
    let k = key("behind");
    let holder = env.client().await?;
    let h = held(holder.try_lock(&k, LONG).await, "first try_lock")?;
    for n in 0..DEAD {
        let dying = env.client().await?;
        let k2 = k.clone();
        let doomed = tokio::spawn(async move { dying.lock_with(&k2, SHORT, &patient()).await });
        env.until_queued(&k, n + 1).await?;
        doomed.abort();
        let _ = doomed.await;
    }
    env.clock.advance(SHORT + Duration::from_millis(1));
    let waiter = env.client().await?;
    let k2 = k.clone();
    let waiting = tokio::spawn(async move { waiter.lock_with(&k2, LONG, &woken_only()).await });
    env.until_queued(&k, DEAD + 1).await?;
    holder.release(h.clone()).await.ctx("holder releases")?;
    let what = format!("a live waiter behind {DEAD} dead ones, after a release");
    let got = woken(waiting, &what).await?;
    ensure!(
        got.fence() == h.fence() + 1,
        "the live waiter got fence {} after {}",
        got.fence(),
        h.fence()
    );
    env.until_queued(&k, 0).await?;
    holder.release(got).await.ctx("release by handle")
}

crate::__define_suite! {$
    /// The fair lock suite's one list of cases (see [`crate::__define_suite!`]).
    __fair_lock_suite "fair_lock";
    checks(FairEnv);
    /// Every case of the fair lock suite, over [`FairLock`]s on a backend
    /// factory with a `ManualClock` (see [`FairEnv::generic`]).
    cases;
    /// Expand the fair lock suite into one `#[tokio::test]` per case, over
    /// [`FairLock`]s on a [`BackendFactory`] expression (or an
    /// `Option<BackendFactory>`, `None` = skipped).
    fair_lock_tests(fair_lock);
    fair_mutual_exclusion,
    fifo_order,
    try_lock_never_jumps_the_queue,
    timed_out_waiter_leaves_no_hole,
    dead_holder_and_ticket_expire,
    fair_fences_increase,
    fair_bad_input,
    hand_over_wakes_the_next_waiter,
    release_reaches_a_live_waiter_behind_many_dead,
}
