//! The changes suite: the contract of a store's optional change
//! notifications ([`coord_backend::Changes`]).
//!
//! Notifications are wake-ups, never facts, so the suite asserts liveness
//! only: a watch that began before a change is woken by it, within a
//! generous bound ([`WAKE_BOUND`]; a missed wake-up fails, a slow one never
//! does). It never asserts that something did *not* wake a watch (spurious
//! wake-ups are allowed). A store whose [`coord_backend::Backend::changes`]
//! is `None` passes every case vacuously, with a note on stderr: its waiters
//! poll.
//!
//! Every change is made by a **second client** from the factory (another
//! connection, as another process would hold), so a store that only tells
//! its own connection fails. One bullet per check:
//!
//! - [`put_by_another_client_wakes`]: a put under the prefix wakes a watch begun before it;
//! - [`delete_wakes`]: so does a delete;
//! - [`rejected_txn_leaves_watch_working`]: a rejected txn may wake it or not, and the watch
//!   still reports the next applied write;
//! - [`prefix_is_literal`]: a watch on `a/` is woken by `a/x`, one on `""` by anything, and a
//!   prefix made of pattern characters (`%_*?[{`) by a key under it;
//! - [`changes_fold_and_watch_keeps_working`]: several changes before `changed()` fold into at
//!   least one wake-up, and the same watch reports a later change;
//! - [`dropped_watches_release`]: many watches dropped (some mid-wait) leave the store working
//!   and a new watch working;
//! - [`absent_keys_wake_when_written_also_after_reclaim`]: in a fresh namespace and again after
//!   a reclaim, a put of a key that is not there (never written; deleted, its tombstone
//!   reclaimed) wakes a watch, and so does a delete of a live key.
//!
//! What the suite does **not** ask for: that a delete of a key that is not
//! there (never written, or already deleted) wakes a watch. etcd after a
//! reclaim deletes for real, and a delete of nothing is no event there. No
//! adapter relies on it: a waiter is woken by a key that is written (the
//! fair lock's hand-over writes the ticket it hands the lock to).

use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Assert, Backend, ChangeWatch, Error, Mutation, ReclaimOptions, Version};

use crate::{ensure, unique_namespace, BackendFactory, CheckResult, Failure};

/// How long a watch may take to report a change before the check fails.
/// Generous on purpose: this is a liveness check, not a speed assertion.
pub const WAKE_BOUND: Duration = Duration::from_secs(10);

/// Two clients of one fresh namespace, the watcher and the writer; or
/// `None` (with a note) when the store offers no change notifications, so
/// the check `case` has nothing to check.
async fn clients(
    factory: &BackendFactory,
    label: &str,
    case: &str,
) -> Result<Option<(Arc<dyn Backend>, Arc<dyn Backend>)>, Failure> {
    let namespace = unique_namespace(label);
    let watcher = factory(namespace.clone()).await?;
    if watcher.changes().is_none() {
        eprintln!(
            "NOTE: changes::{case}: {} offers no change notifications (its waiters poll); \
             nothing to check",
            watcher.store_name()
        );
        return Ok(None);
    }
    let writer = factory(namespace).await?;
    Ok(Some((watcher, writer)))
}

/// A watch on `prefix` (the store offers notifications: see [`clients`]).
async fn watch(backend: &Arc<dyn Backend>, prefix: &str) -> Result<Box<dyn ChangeWatch>, Failure> {
    let changes = backend
        .changes()
        .ok_or_else(|| Failure::new("the store stopped offering change notifications"))?;
    Ok(changes.watch(prefix).await?)
}

/// Wait for the next wake-up of `watch`, failing after [`WAKE_BOUND`].
async fn woken(watch: &mut Box<dyn ChangeWatch>, what: &str) -> CheckResult {
    match tokio::time::timeout(WAKE_BOUND, watch.changed()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(Failure::new(format!(
            "{what}: the watch broke instead of reporting it: {error}"
        ))),
        Err(_) => Err(Failure::new(format!(
            "{what}: the watch was not woken within {WAKE_BOUND:?}"
        ))),
    }
}

/// Take every wake-up already pending, until none comes for a while, so the
/// next wake-up is caused by what happens next. (Draining too little can only
/// make a later check pass by accident, never fail by accident.)
async fn drain(watch: &mut Box<dyn ChangeWatch>) -> CheckResult {
    loop {
        match tokio::time::timeout(Duration::from_millis(300), watch.changed()).await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => return Err(Failure::new(format!("the watch broke: {error}"))),
            Err(_) => return Ok(()),
        }
    }
}

async fn put(backend: &Arc<dyn Backend>, key: &str, value: &[u8]) -> CheckResult {
    let out = backend
        .txn(&[], &[Mutation::put(key, value.to_vec())])
        .await?;
    ensure!(out.applied, "an unconditional put of {key} was rejected");
    Ok(())
}

/// A put by another client under the watched prefix wakes a watch begun before it.
pub async fn put_by_another_client_wakes(factory: BackendFactory) -> CheckResult {
    let Some((watcher, writer)) =
        clients(&factory, "changes_put", "put_by_another_client_wakes").await?
    else {
        return Ok(());
    };
    let mut watch = watch(&watcher, "w/").await?;
    put(&writer, "w/k", b"1").await?;
    woken(&mut watch, "a put of w/k by another client").await
}

/// A delete by another client wakes a watch begun before it (a watch begun
/// after the key was created, once that creation was reported).
pub async fn delete_wakes(factory: BackendFactory) -> CheckResult {
    let Some((watcher, writer)) = clients(&factory, "changes_delete", "delete_wakes").await? else {
        return Ok(());
    };
    let mut before_put = watch(&watcher, "d/").await?;
    put(&writer, "d/k", b"1").await?;
    // Once the put was reported, a new watch cannot be woken by it late.
    woken(&mut before_put, "a put of d/k").await?;
    drop(before_put);
    let mut watch = watch(&watcher, "d/").await?;
    let out = writer.txn(&[], &[Mutation::delete("d/k")]).await?;
    ensure!(out.applied, "an unconditional delete was rejected");
    woken(&mut watch, "a delete of d/k by another client").await
}

/// A rejected txn may wake a watch or not (not asserted), and leaves it
/// working: the next applied write is reported.
pub async fn rejected_txn_leaves_watch_working(factory: BackendFactory) -> CheckResult {
    let Some((watcher, writer)) = clients(
        &factory,
        "changes_rejected",
        "rejected_txn_leaves_watch_working",
    )
    .await?
    else {
        return Ok(());
    };
    let mut watch = watch(&watcher, "r/").await?;
    let out = writer
        .txn(
            &[Assert::at("r/k", Version(7))],
            &[Mutation::put("r/k", b"never".to_vec())],
        )
        .await?;
    ensure!(!out.applied, "a txn asserting a missing key at v7 applied");
    put(&writer, "r/other", b"1").await?;
    woken(&mut watch, "a put of r/other after a rejected txn").await
}

/// Prefixes are literal: `a/` is woken by `a/x` (a write elsewhere first does
/// not spoil it), `""` by anything, and a prefix of pattern characters by a
/// key under it.
pub async fn prefix_is_literal(factory: BackendFactory) -> CheckResult {
    let Some((watcher, writer)) = clients(&factory, "changes_prefix", "prefix_is_literal").await?
    else {
        return Ok(());
    };
    let mut under_a = watch(&watcher, "a/").await?;
    let mut everything = watch(&watcher, "").await?;
    let odd_prefix = "p%_*?[{/";
    let mut odd = watch(&watcher, odd_prefix).await?;
    put(&writer, "b/y", b"1").await?;
    put(&writer, "a/x", b"1").await?;
    woken(&mut under_a, "a put of a/x, watched as a/").await?;
    woken(&mut everything, "a put of b/y then a/x, watched as \"\"").await?;
    let odd_key = format!("{odd_prefix}x");
    put(&writer, &odd_key, b"1").await?;
    woken(
        &mut odd,
        &format!("a put of {odd_key:?}, watched as {odd_prefix:?}"),
    )
    .await
}

/// Several changes before `changed()` is called fold into at least one
/// wake-up, and the same watch then reports a later change.
pub async fn changes_fold_and_watch_keeps_working(factory: BackendFactory) -> CheckResult {
    let Some((watcher, writer)) = clients(
        &factory,
        "changes_fold",
        "changes_fold_and_watch_keeps_working",
    )
    .await?
    else {
        return Ok(());
    };
    let mut watch = watch(&watcher, "f/").await?;
    for i in 0..5 {
        put(&writer, &format!("f/{i}"), b"1").await?;
    }
    woken(&mut watch, "five puts under f/ before changed()").await?;
    for round in 0..2 {
        drain(&mut watch).await?;
        put(&writer, "f/later", format!("{round}").as_bytes()).await?;
        woken(
            &mut watch,
            &format!("a later put of f/later (round {round}) on the same watch"),
        )
        .await?;
    }
    Ok(())
}

/// Dropping watches (idle, and in the middle of `changed()`) releases them:
/// nothing hangs or panics, the store keeps working, and a new watch works.
pub async fn dropped_watches_release(factory: BackendFactory) -> CheckResult {
    let Some((watcher, writer)) =
        clients(&factory, "changes_drop", "dropped_watches_release").await?
    else {
        return Ok(());
    };
    for _ in 0..3 {
        let mut watches = Vec::new();
        for _ in 0..16 {
            let w = watch(&watcher, "x/").await?;
            watches.push(w);
        }
        // Half are dropped while waiting, half idle.
        let mut waiting = Vec::new();
        for mut w in watches.drain(..8) {
            waiting.push(tokio::spawn(async move {
                let _ = w.changed().await;
            }));
        }
        for task in &waiting {
            task.abort();
        }
        drop(watches);
        for task in waiting {
            if let Err(error) = task.await {
                ensure!(
                    error.is_cancelled(),
                    "a watch panicked while dropped: {error}"
                );
            }
        }
    }
    let mut fresh = watch(&watcher, "x/").await?;
    put(&writer, "x/k", b"1").await?;
    woken(
        &mut fresh,
        "a put of x/k on a watch made after 48 were dropped",
    )
    .await
}

async fn delete(backend: &Arc<dyn Backend>, key: &str) -> CheckResult {
    let out = backend.txn(&[], &[Mutation::delete(key)]).await?;
    ensure!(out.applied, "an unconditional delete of {key} was rejected");
    Ok(())
}

/// What adapters rely on to wake a waiter, checked in a fresh namespace and
/// again after a reclaim (etcd keeps tombstones until a namespace's first
/// reclaim and deletes for real from then on): a put of a key that is not
/// there wakes a watch begun before it (a key never written; after the
/// reclaim also one whose tombstone the reclaim removed), and so does a
/// delete of a live key. A delete of a key that is not there is made too,
/// but not asserted (see the module docs): it is followed by a put that
/// must still wake the watch. Each round watches anew (a reclaim may end
/// a watch: a broken watch is allowed, its callers poll).
pub async fn absent_keys_wake_when_written_also_after_reclaim(
    factory: BackendFactory,
) -> CheckResult {
    let case = "absent_keys_wake_when_written_also_after_reclaim";
    let Some((watcher, writer)) = clients(&factory, "changes_absent", case).await? else {
        return Ok(());
    };
    for (n, round) in ["in a fresh namespace", "after a reclaim"]
        .into_iter()
        .enumerate()
    {
        if n == 1 {
            match writer.reclaim(&ReclaimOptions::DEFAULT).await {
                Ok(_) => {}
                Err(Error::Unsupported { .. }) => {
                    eprintln!(
                        "NOTE: changes::{case}: {} has no reclaim; checked in a fresh \
                         namespace only",
                        writer.store_name()
                    );
                    return Ok(());
                }
                Err(error) => return Err(Failure::new(format!("reclaim: {error}"))),
            }
        }
        let mut watch = watch(&watcher, "z/").await?;
        let what = |action: &str| format!("{round}: {action}");
        if n == 1 {
            // Deleted before the reclaim, which removed its tombstone.
            put(&writer, "z/gone", b"again").await?;
            woken(
                &mut watch,
                &what("a put of z/gone, its tombstone reclaimed"),
            )
            .await?;
            drain(&mut watch).await?;
        }
        let new = format!("z/new{n}");
        put(&writer, &new, b"1").await?;
        woken(&mut watch, &what(&format!("a put of {new}, never written"))).await?;
        drain(&mut watch).await?;
        delete(&writer, &new).await?;
        woken(&mut watch, &what(&format!("a delete of {new}, live"))).await?;
        drain(&mut watch).await?;
        delete(&writer, "z/never").await?;
        delete(&writer, &new).await?;
        put(&writer, "z/gone", b"1").await?;
        woken(
            &mut watch,
            &what("a put of z/gone after deletes of absent keys"),
        )
        .await?;
        drain(&mut watch).await?;
        delete(&writer, "z/gone").await?;
        woken(&mut watch, &what("a delete of z/gone, live")).await?;
    }
    Ok(())
}

crate::__define_suite! {$
    /// The changes suite's one list of cases (see [`crate::__define_suite!`]).
    __changes_suite "changes";
    /// Every case of the changes suite, over a backend factory.
    cases;
    /// Expand the changes suite into one `#[tokio::test]` per case, over a
    /// [`BackendFactory`] expression (evaluated once per test; it may also be an
    /// `Option<BackendFactory>`, `None` = skipped).
    changes_tests(changes);
    put_by_another_client_wakes,
    delete_wakes,
    rejected_txn_leaves_watch_working,
    prefix_is_literal,
    changes_fold_and_watch_keeps_working,
    dropped_watches_release,
    absent_keys_wake_when_written_also_after_reclaim,
}
