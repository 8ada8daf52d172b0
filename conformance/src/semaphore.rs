//! The semaphore suite: the contract of
//! [`coord_adapters::lock::Semaphore`].
//!
//! Every check is a plain `async fn` over a [`SemEnv`]: a factory of
//! semaphore clients and the `ManualClock` they judge leases with.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`permit_race`]: of 12 clients racing for 3 permits, exactly 3 get one;
//! - [`never_more_than_n`]: racing acquire/release loops never have more than N holders inside;
//! - [`permits_come_back_after_ttl`]: a dead holder's permit is free once its lease ran out,
//!   not before; its holder can then neither renew nor release;
//! - [`permit_fences_increase`]: every permit's fence is above every earlier one's, across
//!   release and expiry;
//! - [`release_frees_one`]: a release frees exactly one permit; renew extends the lease;
//! - [`waiting_acquire`]: `acquire` gets a permit once one is released, and times out otherwise;
//! - [`semaphore_bad_input`]: empty key, zero TTL, 0 permits and a permit count other than the
//!   holders' are typed errors and change nothing;
//! - [`waiters_are_served_in_order`]: freed permits go to waiters in the order they began to
//!   wait (the semaphore keeps a line: [`Semaphore::queued`]);
//! - [`try_acquire_never_jumps_the_line`]: with a waiter in line, `try_acquire` is refused
//!   even right after a release;
//! - [`timed_out_waiter_leaves_the_line`]: a waiter that gives up leaves no place behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::{LockError, Permit, Semaphore, WaitOptions};

use crate::clients::{granted, key, lost, refused, ClientEnv, ClientFactory, Ctx};
use crate::{ensure, CheckResult, Failure};

/// Makes a new client of the semaphore under test.
pub type SemaphoreFactory = ClientFactory<dyn Semaphore, LockError>;

/// What a semaphore check runs against (see [`ClientEnv`]).
pub type SemEnv = ClientEnv<dyn Semaphore, LockError>;

const LONG: Duration = Duration::from_secs(3_600);
const SHORT: Duration = Duration::from_secs(2);

/// Of 12 clients racing `try_acquire` for 3 permits, exactly 3 get one.
pub async fn permit_race(env: SemEnv) -> CheckResult {
    let k = key("race");
    let barrier = Arc::new(tokio::sync::Barrier::new(12));
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let sem = env.client().await?;
        let (k, barrier) = (k.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            sem.try_acquire(&k, 3, LONG).await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        if let Some(p) = task
            .await
            .ctx("racer panicked")?
            .ctx("racing try_acquire")?
        {
            winners.push(p);
        }
    }
    ensure!(
        winners.len() == 3,
        "{} of 12 racers got one of 3 permits",
        winners.len()
    );
    let mut fences: Vec<u64> = winners.iter().map(Permit::fence).collect();
    fences.sort_unstable();
    fences.dedup();
    ensure!(fences.len() == 3, "two permits share a fence: {fences:?}");
    Ok(())
}

/// 8 clients loop try_acquire → inside → release on 2 permits: never more
/// than 2 inside at once, and someone got in.
pub async fn never_more_than_n(env: SemEnv) -> CheckResult {
    let k = key("n");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let sem = env.client().await?;
        let (k, inside, most) = (k.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..15 {
                if let Some(p) = sem.try_acquire(&k, 2, LONG).await.ctx("try_acquire")? {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    sem.release(p).await.ctx("release")?;
                } else {
                    tokio::task::yield_now().await;
                }
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await.ctx("worker panicked")??;
    }
    let most = most.load(Ordering::SeqCst);
    ensure!(most <= 2, "{most} holders of 2 permits were inside at once");
    ensure!(
        most >= 1,
        "nobody ever got a permit: the check proved nothing"
    );
    Ok(())
}

/// Two holders take both permits with a short lease and die; the permits
/// are refused until the leases run out, then granted again; the dead
/// holders can neither renew nor release.
pub async fn permits_come_back_after_ttl(env: SemEnv) -> CheckResult {
    let k = key("ttl");
    let (dead, next) = (env.client().await?, env.client().await?);
    let a = granted(dead.try_acquire(&k, 2, SHORT).await, "first permit")?;
    let b = granted(dead.try_acquire(&k, 2, SHORT).await, "second permit")?;
    env.clock.advance(SHORT - Duration::from_millis(1));
    refused(
        next.try_acquire(&k, 2, LONG).await,
        "a third permit before the leases ran out",
    )?;
    env.clock.advance(Duration::from_millis(2));
    let c = granted(
        next.try_acquire(&k, 2, LONG).await,
        "a permit after the leases ran out",
    )?;
    let d = granted(
        next.try_acquire(&k, 2, LONG).await,
        "the second expired permit",
    )?;
    refused(next.try_acquire(&k, 2, LONG).await, "a third permit")?;
    lost(dead.renew(&a).await, "renew of an expired permit")?;
    lost(dead.release(b).await, "release of an expired permit")?;
    next.release(c).await.ctx("release")?;
    next.release(d).await.ctx("release")
}

/// Every permit's fence is above every earlier one's: across release and expiry.
pub async fn permit_fences_increase(env: SemEnv) -> CheckResult {
    let k = key("fence");
    let sem = env.client().await?;
    let mut fences = Vec::new();
    let a = granted(sem.try_acquire(&k, 2, SHORT).await, "a")?;
    let b = granted(sem.try_acquire(&k, 2, SHORT).await, "b")?;
    fences.extend([a.fence(), b.fence()]);
    sem.release(a).await.ctx("release a")?;
    let c = granted(sem.try_acquire(&k, 2, SHORT).await, "c after a release")?;
    fences.push(c.fence());
    env.clock.advance(SHORT + Duration::from_millis(1));
    let d = granted(sem.try_acquire(&k, 2, SHORT).await, "d after expiry")?;
    let e = granted(sem.try_acquire(&k, 2, SHORT).await, "e after expiry")?;
    fences.extend([d.fence(), e.fence()]);
    ensure!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "permit fences in grant order do not strictly increase: {fences:?}"
    );
    Ok(())
}

/// A release frees exactly one permit; a renewal moves the lease to a TTL
/// from now (the permit outlives its first lease).
pub async fn release_frees_one(env: SemEnv) -> CheckResult {
    let k = key("release");
    let sem = env.client().await?;
    let a = granted(sem.try_acquire(&k, 2, SHORT).await, "a")?;
    let b = granted(sem.try_acquire(&k, 2, SHORT).await, "b")?;
    sem.release(a.clone()).await.ctx("release a")?;
    lost(sem.release(a).await, "a second release of a")?;
    let c = granted(sem.try_acquire(&k, 2, SHORT).await, "c after one release")?;
    refused(sem.try_acquire(&k, 2, SHORT).await, "a third permit")?;
    env.clock.advance(SHORT / 2);
    sem.renew(&b).await.ctx("renew b")?;
    env.clock.advance(SHORT / 2 + Duration::from_millis(1));
    // c expired, b was renewed: one permit is free, not two.
    let d = granted(
        sem.try_acquire(&k, 2, SHORT).await,
        "d in place of expired c",
    )?;
    refused(
        sem.try_acquire(&k, 2, SHORT).await,
        "a permit while b (renewed) and d hold",
    )?;
    lost(sem.renew(&c).await, "renew of expired c")?;
    sem.release(b).await.ctx("release renewed b")?;
    sem.release(d).await.ctx("release d")
}

/// `acquire` waits until a permit is released (then gets it), and times
/// out while every permit stays held.
pub async fn waiting_acquire(env: SemEnv) -> CheckResult {
    let k = key("wait");
    let (holder, waiter) = (env.client().await?, env.client().await?);
    let a = granted(holder.try_acquire(&k, 1, LONG).await, "the only permit")?;
    let timed_out = waiter
        .acquire(
            &k,
            1,
            LONG,
            &WaitOptions::with_timeout(Duration::from_millis(100)),
        )
        .await;
    ensure!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "acquire while the permit is held: expected Timeout, got {timed_out:?}"
    );
    let k2 = k.clone();
    let waiting = tokio::spawn(async move {
        let wait = WaitOptions::with_timeout(Duration::from_secs(20))
            .with_backoff(Duration::from_millis(2), Duration::from_millis(20));
        waiter.acquire(&k2, 1, LONG, &wait).await
    });
    holder.release(a).await.ctx("release")?;
    let p = waiting
        .await
        .ctx("waiter panicked")?
        .ctx("waiting acquire")?;
    holder.release(p).await.ctx("release by another client")
}

/// Bad input is [`LockError::Invalid`] and changes nothing.
pub async fn semaphore_bad_input(env: SemEnv) -> CheckResult {
    let sem = env.client().await?;
    let k = key("bad");
    for (what, answer) in [
        ("empty key", sem.try_acquire("", 2, LONG).await),
        ("zero ttl", sem.try_acquire(&k, 2, Duration::ZERO).await),
        ("zero permits", sem.try_acquire(&k, 0, LONG).await),
    ] {
        ensure!(
            matches!(answer, Err(LockError::Invalid(_))),
            "{what}: expected Invalid, got {answer:?}"
        );
    }
    let a = granted(sem.try_acquire(&k, 2, LONG).await, "first permit")?;
    ensure!(
        a.fence() == 1,
        "bad input changed the fence: first permit has {}",
        a.fence()
    );
    let other = sem.try_acquire(&k, 3, LONG).await;
    ensure!(
        matches!(other, Err(LockError::Invalid(_))),
        "3 permits while held with 2: expected Invalid, got {other:?}"
    );
    let b = granted(sem.try_acquire(&k, 2, LONG).await, "second permit")?;
    refused(sem.try_acquire(&k, 2, LONG).await, "a third of 2 permits")?;
    ensure!(
        b.fence() == 2,
        "the refused call changed the fence: {}",
        b.fence()
    );
    Ok(())
}

/// Waits long enough for anything but a lost wake-up, polling fast.
fn patient() -> WaitOptions {
    WaitOptions::with_timeout(Duration::from_secs(30))
        .with_backoff(Duration::from_millis(2), Duration::from_millis(20))
}

/// Polls [`Semaphore::queued`] until `n` waiters stand in `key`'s line (10 s at most).
async fn until_queued(sem: &Arc<dyn Semaphore>, key: &str, n: usize) -> CheckResult {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match sem.queued(key).await.ctx("queued")? {
            None => return Err(Failure::new(
                "the semaphore keeps no line: its waiting acquire is not first come, first served",
            )),
            Some(queued) if queued == n => return Ok(()),
            Some(queued) => ensure!(
                tokio::time::Instant::now() < deadline,
                "{queued} waiters in line after 10 s, expected {n}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

type Waiting = tokio::task::JoinHandle<Result<Permit, LockError>>;

/// A waiting `acquire` of one of `permits` permits of `key` by a new client.
async fn start_waiting(
    env: &SemEnv,
    key: &str,
    permits: u32,
    wait: WaitOptions,
) -> Result<Waiting, Failure> {
    let sem = env.client().await?;
    let key = key.to_owned();
    Ok(tokio::spawn(async move {
        sem.acquire(&key, permits, LONG, &wait).await
    }))
}

/// Freed permits go to the waiters in the order they began to wait.
pub async fn waiters_are_served_in_order(env: SemEnv) -> CheckResult {
    let holder = env.client().await?;
    let k = key("line");
    let mut held = vec![
        granted(holder.try_acquire(&k, 2, LONG).await, "permit a")?,
        granted(holder.try_acquire(&k, 2, LONG).await, "permit b")?,
    ];
    let mut waiting: Vec<Option<Waiting>> = Vec::new();
    for i in 0..4 {
        waiting.push(Some(start_waiting(&env, &k, 2, patient()).await?));
        until_queued(&holder, &k, i + 1).await?;
    }
    for turn in 0..4 {
        // One permit free at a time: exactly the first in line may take it.
        holder.release(held.remove(0)).await.ctx("release")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let served = loop {
            if let Some(i) = waiting
                .iter()
                .position(|w| w.as_ref().is_some_and(|w| w.is_finished()))
            {
                break i;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "turn {turn}: no waiter got the freed permit within 20 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let permit = waiting[served]
            .take()
            .expect("finished")
            .await
            .ctx("waiter panicked")?
            .ctx("waiting acquire")?;
        ensure!(
            served == turn,
            "turn {turn}: the permit went to the waiter who came {} (0 = first)",
            served
        );
        held.push(permit);
    }
    for permit in held {
        holder.release(permit).await.ctx("release at the end")?;
    }
    Ok(())
}

/// With a waiter in line, `try_acquire` is refused, also right after a
/// release: the freed permit is the waiter's.
pub async fn try_acquire_never_jumps_the_line(env: SemEnv) -> CheckResult {
    let holder = env.client().await?;
    let other = env.client().await?;
    let k = key("nojump");
    let a = granted(holder.try_acquire(&k, 1, LONG).await, "permit a")?;
    let waiter = start_waiting(&env, &k, 1, patient()).await?;
    until_queued(&holder, &k, 1).await?;
    holder.release(a).await.ctx("release")?;
    // The waiter either holds the permit already or still stands in line.
    refused(
        other.try_acquire(&k, 1, LONG).await,
        "try_acquire right after a release, with a waiter in line",
    )?;
    let p = waiter
        .await
        .ctx("waiter panicked")?
        .ctx("the waiter's acquire")?;
    refused(
        other.try_acquire(&k, 1, LONG).await,
        "try_acquire while the waiter holds it",
    )?;
    holder.release(p).await.ctx("release by another client")
}

/// A waiter that times out leaves the line: afterwards nobody stands in it
/// and a freed permit is free for anyone.
pub async fn timed_out_waiter_leaves_the_line(env: SemEnv) -> CheckResult {
    let holder = env.client().await?;
    let k = key("leaves");
    let a = granted(holder.try_acquire(&k, 1, LONG).await, "permit a")?;
    let short = WaitOptions::with_timeout(Duration::from_millis(300))
        .with_backoff(Duration::from_millis(2), Duration::from_millis(20));
    let timed_out = start_waiting(&env, &k, 1, short)
        .await?
        .await
        .ctx("waiter panicked")?;
    ensure!(
        matches!(timed_out, Err(LockError::Timeout { .. })),
        "a waiter while the permit is held: expected Timeout, got {timed_out:?}"
    );
    until_queued(&holder, &k, 0).await?;
    holder.release(a).await.ctx("release")?;
    let b = granted(
        holder.try_acquire(&k, 1, LONG).await,
        "try_acquire after the waiter gave up",
    )?;
    holder.release(b).await.ctx("release")
}

crate::__define_suite! {$
    /// The semaphore suite's one list of cases (see [`crate::__define_suite!`]).
    __semaphore_suite "semaphore";
    checks(SemEnv);
    /// Every case of the semaphore suite, over [`GenericSemaphore`](coord_adapters::lock::GenericSemaphore)s on a
    /// backend factory with a `ManualClock` (see [`SemEnv::generic`]).
    cases;
    /// Expand the semaphore suite into one `#[tokio::test]` per case, over
    /// [`GenericSemaphore`](coord_adapters::lock::GenericSemaphore)s on a [`BackendFactory`](crate::BackendFactory) expression (or an
    /// `Option<BackendFactory>`, `None` = skipped).
    semaphore_tests(semaphore);
    permit_race,
    never_more_than_n,
    permits_come_back_after_ttl,
    permit_fences_increase,
    release_frees_one,
    waiting_acquire,
    semaphore_bad_input,
    waiters_are_served_in_order,
    try_acquire_never_jumps_the_line,
    timed_out_waiter_leaves_the_line,
}
