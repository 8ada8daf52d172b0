//! The rwlock suite: the contract of [`coord_adapters::rwlock::RwLock`].
//!
//! Every check is a plain `async fn` over an [`RwEnv`]: a factory of clients
//! (each call a separate client, as another process would hold) and the
//! `ManualClock` they judge expiry with, so expiry checks never sleep.
//! [`rwlock_tests!`](crate::rwlock_tests) runs them on
//! [`GenericRwLock`](coord_adapters::rwlock::GenericRwLock)s over a store; call them directly to check another
//! implementation.
//!
//! What the suite pins down (one bullet per check):
//!
//! - [`readers_share`]: several readers hold at once; a writer is refused beside them;
//! - [`writer_excludes`]: a writer excludes readers and other writers;
//! - [`exclusion_race`]: racing readers and writers never overlap a writer
//!   with anyone, and every write is counted exactly once;
//! - [`fences_increase`]: fences strictly increase across readers, writers, release and expiry;
//! - [`writer_not_starved`]: once a writer waits, new readers are refused and
//!   the writer gets the key when the readers inside leave (writer preference);
//! - [`expired_holders_dont_block`]: expired readers, writers and queued writers block nobody;
//! - [`stale_holder_refused`]: a released or expired handle can neither renew
//!   nor release, and changes nothing;
//! - [`renew_extends`]: a renewal keeps a holder past its first TTL;
//! - [`holders_bounded`]: the record keeps only live holders (released and expired ones go);
//! - [`rwlock_bad_input`]: empty key / zero TTL are typed errors.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_adapters::lock::LockError;
use coord_adapters::rwlock::{RwHandle, RwLock, RwMode};

use crate::clients::{granted, key, lost, refused, ClientEnv, ClientFactory, Ctx};
use crate::{ensure, joined, BoxFuture, CheckResult, Failure};

/// Makes a new client of the read-write lock under test.
pub type RwFactory = ClientFactory<dyn RwLock, LockError>;

/// What a read-write lock check runs against (see [`ClientEnv`]).
pub type RwEnv = ClientEnv<dyn RwLock, LockError>;

const TTL: Duration = Duration::from_secs(3_600);
const SHORT: Duration = Duration::from_millis(1_500);
const WAIT: Duration = Duration::from_secs(30);
/// How long a writer that started waiting may take to hold new readers back
/// (a few round trips; generous for loaded machines).
const QUEUED_WITHIN: Duration = Duration::from_secs(10);

/// Three readers (separate clients) hold one key at once; a writer is
/// refused while any of them is inside, and granted once all left.
pub async fn readers_share(env: RwEnv) -> CheckResult {
    let k = key("share");
    let mut readers = Vec::new();
    for i in 0..3 {
        let client = env.client().await?;
        let h = granted(client.try_read(&k, TTL).await, &format!("reader {i}"))?;
        ensure!(
            h.mode() == RwMode::Read,
            "reader {i} got mode {:?}",
            h.mode()
        );
        readers.push((client, h));
    }
    let writer = env.client().await?;
    for (client, h) in readers {
        refused(writer.try_write(&k, TTL).await, "a writer beside readers")?;
        client.release(h).await.ctx("releasing a reader")?;
    }
    let w = granted(
        writer.try_write(&k, TTL).await,
        "a writer after the readers left",
    )?;
    ensure!(w.mode() == RwMode::Write, "writer got mode {:?}", w.mode());
    writer.release(w).await.ctx("releasing the writer")
}

/// A writer excludes readers and writers until it releases.
pub async fn writer_excludes(env: RwEnv) -> CheckResult {
    let k = key("excl");
    let a = env.client().await?;
    let b = env.client().await?;
    let w = granted(a.try_write(&k, TTL).await, "first writer")?;
    refused(b.try_read(&k, TTL).await, "a reader beside a writer")?;
    refused(b.try_write(&k, TTL).await, "a second writer")?;
    a.release(w).await.ctx("releasing the writer")?;
    let r = granted(b.try_read(&k, TTL).await, "a reader after the writer left")?;
    b.release(r).await.ctx("releasing the reader")
}

/// Six clients, each doing eight waiting acquisitions (every third a write)
/// on one key: a writer is never inside with anyone, readers do overlap only
/// with readers, and the count of writes made inside is exact.
pub async fn exclusion_race(env: RwEnv) -> CheckResult {
    let k = key("race");
    let readers_in = Arc::new(AtomicUsize::new(0));
    let writers_in = Arc::new(AtomicUsize::new(0));
    let writes = Arc::new(AtomicU64::new(0));
    let workers = 6;
    let rounds = 8;
    let mut tasks = Vec::new();
    for w in 0..workers {
        let client = env.client().await?;
        let (k, readers_in, writers_in, writes) = (
            k.clone(),
            readers_in.clone(),
            writers_in.clone(),
            writes.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let write = (w + round) % 3 == 0;
                let h = if write {
                    client.write(&k, TTL, WAIT).await
                } else {
                    client.read(&k, TTL, WAIT).await
                }
                .ctx("waiting acquisition")?;
                if write {
                    let others = writers_in.fetch_add(1, Ordering::SeqCst);
                    let readers = readers_in.load(Ordering::SeqCst);
                    ensure!(
                        others == 0 && readers == 0,
                        "a writer (fence {}) entered beside {others} writer(s) and {readers} reader(s)",
                        h.fence()
                    );
                    // Not atomic on purpose: only exclusion makes the total exact.
                    let seen = writes.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    writes.store(seen + 1, Ordering::SeqCst);
                    writers_in.fetch_sub(1, Ordering::SeqCst);
                } else {
                    readers_in.fetch_add(1, Ordering::SeqCst);
                    let writers = writers_in.load(Ordering::SeqCst);
                    ensure!(
                        writers == 0,
                        "a reader (fence {}) entered beside a writer",
                        h.fence()
                    );
                    tokio::task::yield_now().await;
                    readers_in.fetch_sub(1, Ordering::SeqCst);
                }
                client.release(h).await.ctx("release")?;
            }
            Ok::<usize, Failure>((0..rounds).filter(|r| (w + r) % 3 == 0).count())
        }));
    }
    let mut expected = 0u64;
    for task in tasks {
        expected += joined(task, "worker").await?? as u64;
    }
    let total = writes.load(Ordering::SeqCst);
    ensure!(
        total == expected,
        "{total} writes counted, {expected} made: two writers overlapped"
    );
    Ok(())
}

/// Fences strictly increase across readers and writers, across release and
/// across an expiry takeover.
pub async fn fences_increase(env: RwEnv) -> CheckResult {
    let k = key("fence");
    let a = env.client().await?;
    let b = env.client().await?;
    let mut last = 0u64;
    let mut step = |h: &RwHandle, what: &str| -> CheckResult {
        ensure!(
            h.fence() > last,
            "{what}: fence {} not above the previous {last}",
            h.fence()
        );
        last = h.fence();
        Ok(())
    };
    let r1 = granted(a.try_read(&k, TTL).await, "reader 1")?;
    step(&r1, "reader 1")?;
    let r2 = granted(b.try_read(&k, TTL).await, "reader 2")?;
    step(&r2, "reader 2")?;
    a.release(r1).await.ctx("release")?;
    b.release(r2).await.ctx("release")?;
    let w = granted(a.try_write(&k, SHORT).await, "writer")?;
    step(&w, "writer after readers")?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    let w2 = granted(
        b.try_write(&k, TTL).await,
        "writer taking over an expired one",
    )?;
    step(&w2, "writer after expiry")?;
    b.release(w2).await.ctx("release")?;
    let r3 = granted(a.try_read(&k, TTL).await, "reader after the writers")?;
    step(&r3, "reader after a writer")?;
    a.release(r3).await.ctx("release")
}

/// Writer preference: with a reader inside, a writer waiting in `write`
/// makes new readers wait; when the reader inside leaves, the writer gets
/// the key although readers keep trying.
pub async fn writer_not_starved(env: RwEnv) -> CheckResult {
    let k = key("starve");
    let inside = env.client().await?;
    let first = granted(inside.try_read(&k, TTL).await, "first reader")?;
    let writer = env.client().await?;
    let wk = k.clone();
    let waiting = tokio::spawn(async move { writer.write(&wk, TTL, WAIT).await });

    // A stream of readers: each takes the key if it can and hands it back
    // quickly, so without writer preference readers would always be inside.
    let stream_client = env.client().await?;
    let mut refused_at = None;
    let started = tokio::time::Instant::now();
    while started.elapsed() < QUEUED_WITHIN {
        match stream_client.try_read(&k, TTL).await.ctx("stream reader")? {
            Some(h) => stream_client
                .release(h)
                .await
                .ctx("stream reader release")?,
            None => {
                refused_at = Some(started.elapsed());
                break;
            }
        }
        ensure!(
            !waiting.is_finished(),
            "the waiting writer returned (granted or failed) while a reader was inside"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    ensure!(
        refused_at.is_some(),
        "new readers were still let in {QUEUED_WITHIN:?} after a writer started waiting: writers starve"
    );
    inside
        .release(first)
        .await
        .ctx("releasing the first reader")?;
    let w = joined(waiting, "writer").await?.ctx("the waiting writer")?;
    ensure!(w.mode() == RwMode::Write, "writer got {:?}", w.mode());
    refused(
        stream_client.try_read(&k, TTL).await,
        "a reader beside the granted writer",
    )?;
    let client = env.client().await?;
    client.release(w).await.ctx("releasing the writer")
}

/// Expired holders block nobody: an expired reader lets a writer in, an
/// expired writer lets readers in, and a writer that queued and then was
/// cancelled stops holding readers back once its TTL is over.
pub async fn expired_holders_dont_block(env: RwEnv) -> CheckResult {
    let k = key("expired");
    let a = env.client().await?;
    let b = env.client().await?;
    let _r = granted(a.try_read(&k, SHORT).await, "short reader")?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    let w = granted(
        b.try_write(&k, SHORT).await,
        "writer over an expired reader",
    )?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    let r = granted(a.try_read(&k, TTL).await, "reader over an expired writer")?;
    ensure!(r.fence() > w.fence(), "fence went back");

    // A writer queues behind the reader, then is cancelled mid-wait.
    let cancelled = env.client().await?;
    let ck = k.clone();
    let queued = tokio::spawn(async move { cancelled.write(&ck, SHORT, WAIT).await });
    let started = tokio::time::Instant::now();
    loop {
        match b.try_read(&k, TTL).await.ctx("probe reader")? {
            None => break, // the writer is queued
            Some(probe) => b.release(probe).await.ctx("probe release")?,
        }
        ensure!(
            started.elapsed() < WAIT,
            "a waiting writer never held new readers back"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    queued.abort();
    let _ = queued.await;
    a.release(r).await.ctx("release")?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    granted(
        b.try_read(&k, TTL).await,
        "reader after the cancelled writer's TTL",
    )?;
    Ok(())
}

/// A released handle and an expired handle can neither renew nor release,
/// and a stale release does not free the current holder.
pub async fn stale_holder_refused(env: RwEnv) -> CheckResult {
    let k = key("stale");
    let a = env.client().await?;
    let b = env.client().await?;
    let r = granted(a.try_read(&k, TTL).await, "reader")?;
    a.release(r.clone()).await.ctx("first release")?;
    lost(a.release(r.clone()).await, "second release of a reader")?;
    lost(a.renew(&r).await, "renew of a released reader")?;

    let w = granted(a.try_write(&k, SHORT).await, "writer")?;
    env.clock.advance(SHORT + Duration::from_millis(1));
    lost(a.renew(&w).await, "renew of an expired writer")?;
    let w2 = granted(b.try_write(&k, TTL).await, "writer after expiry")?;
    lost(a.renew(&w).await, "renew of a taken-over writer")?;
    lost(a.release(w).await, "release of a taken-over writer")?;
    refused(
        a.try_read(&k, TTL).await,
        "a reader: the new writer must still hold",
    )?;
    b.renew(&w2).await.ctx("renew by the current writer")?;
    b.release(w2).await.ctx("release by the current writer")
}

/// Renewing before expiry keeps a holder past its first TTL.
pub async fn renew_extends(env: RwEnv) -> CheckResult {
    let k = key("renew");
    let a = env.client().await?;
    let b = env.client().await?;
    let w = granted(a.try_write(&k, SHORT).await, "writer")?;
    for round in 0..3 {
        env.clock.advance(SHORT * 3 / 4);
        a.renew(&w).await.ctx(&format!("renew {round}"))?;
    }
    refused(
        b.try_read(&k, TTL).await,
        "a reader beside a renewed writer",
    )?;
    a.release(w).await.ctx("release")
}

/// The record holds only live holders: after 20 read/release cycles, and
/// after expired readers are followed by one grant, the status lists just
/// the live ones.
pub async fn holders_bounded(env: RwEnv) -> CheckResult {
    let k = key("bounded");
    let a = env.client().await?;
    for _ in 0..20 {
        let h = granted(a.try_read(&k, TTL).await, "reader")?;
        a.release(h).await.ctx("release")?;
    }
    for _ in 0..5 {
        granted(a.try_read(&k, SHORT).await, "short reader")?;
    }
    env.clock.advance(SHORT + Duration::from_millis(1));
    let live = granted(a.try_read(&k, TTL).await, "live reader")?;
    let status = a
        .status(&k)
        .await
        .ctx("status")?
        .ok_or_else(|| Failure::new("status: no record after grants"))?;
    ensure!(
        status.holders.len() == 1 && status.holders[0].fence == live.fence(),
        "the record keeps {} holders ({:?}), expected only the live one",
        status.holders.len(),
        status.holders
    );
    ensure!(
        status.fence == live.fence(),
        "status fence {} vs {}",
        status.fence,
        live.fence()
    );
    a.release(live).await.ctx("release")
}

/// Empty key and zero TTL are typed errors.
pub async fn rwlock_bad_input(env: RwEnv) -> CheckResult {
    let a = env.client().await?;
    for (what, answer) in [
        ("try_read with an empty key", a.try_read("", TTL).await),
        ("try_write with an empty key", a.try_write("", TTL).await),
        (
            "try_read with a zero TTL",
            a.try_read("k", Duration::ZERO).await,
        ),
        (
            "try_write with a zero TTL",
            a.try_write("k", Duration::ZERO).await,
        ),
    ] {
        ensure!(
            matches!(answer, Err(LockError::Invalid(_))),
            "{what}: expected Invalid, got {answer:?}"
        );
    }
    let waited = a.write("", TTL, Duration::from_millis(10)).await;
    ensure!(
        matches!(waited, Err(LockError::Invalid(_))),
        "write with an empty key: expected Invalid, got {waited:?}"
    );
    Ok(())
}

crate::__define_suite! {$
    /// The rwlock suite's one list of cases (see [`crate::__define_suite!`]).
    __rwlock_suite "rwlock";
    checks(RwEnv);
    /// Every case of the rwlock suite, over [`GenericRwLock`](coord_adapters::rwlock::GenericRwLock)s on a
    /// backend factory with a `ManualClock` (see [`RwEnv::generic`]).
    cases;
    /// Expand the rwlock suite into one `#[tokio::test]` per case, over
    /// [`GenericRwLock`](coord_adapters::rwlock::GenericRwLock)s on a [`BackendFactory`](crate::BackendFactory) expression (or an
    /// `Option<BackendFactory>`, `None` = skipped).
    rwlock_tests(rwlock);
    readers_share,
    writer_excludes,
    exclusion_race,
    fences_increase,
    writer_not_starved,
    expired_holders_dont_block,
    stale_holder_refused,
    renew_extends,
    holders_bounded,
    rwlock_bad_input,
}

/// One check of the suite, runnable against any [`RwEnv`].
pub type RwEnvCheck = fn(RwEnv) -> BoxFuture<'static, CheckResult>;
