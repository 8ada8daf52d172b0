//! The changes suite on the in-process memory store, and proof that it goes
//! red on stores whose notifications are broken (a check that cannot fail is
//! a defect).
//!
//! [`FlawedChanges`] wraps the memory store with a change feed of its own (one
//! per namespace, so two clients of a namespace share it, as two connections
//! to one server would) and one [`Flaw`] switched in. With `Flaw::None` it
//! passes every case, so a red case below is caused by the flaw.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use coord_backend::{
    Assert, Backend, ChangeFeed, ChangeWatch, Changed, Changes, Entry, Limits, Mutation,
    ReclaimOptions, Reclaimed, Result, TxnOutcome,
};
use coord_conformance::{factory, run_cases, BackendFactory};
use coord_memory::SingleProcessMemoryBackend;

/// Dropped watches are gone from the memory store's feed (no subscriber left behind).
#[tokio::test]
async fn memory_watches_end_when_dropped() {
    let store = SingleProcessMemoryBackend::new("drop").unwrap();
    let changes = store.changes().unwrap();
    let a = changes.watch("a/").await.unwrap();
    let b = changes.watch("").await.unwrap();
    assert_eq!(store.watchers(), 2);
    drop(a);
    assert_eq!(store.watchers(), 1);
    drop(b);
    assert_eq!(store.watchers(), 0);
}

/// What is wrong with a [`FlawedChanges`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flaw {
    /// Nothing: the control, must pass every case.
    None,
    /// A watch never fires (e.g. it only reports changes before it began).
    Silent,
    /// Deletes are not notified.
    PutsOnly,
    /// A watch fires once, then never again.
    FirstOnly,
    /// Notifications name the key without its directory (`a/x` → `x`).
    Mangled,
    /// A client that ran a reclaim writes through another path, which
    /// notifies nothing (as a store whose deletes change once reclaimed
    /// might).
    QuietAfterReclaim,
    /// A delete of a key that is not there is not notified: what etcd does
    /// after a reclaim. Not a flaw by the contract: every case passes, and
    /// the fair lock must not rely on it.
    AbsentDeletesQuiet,
}

fn feeds() -> &'static Mutex<HashMap<String, ChangeFeed>> {
    static FEEDS: OnceLock<Mutex<HashMap<String, ChangeFeed>>> = OnceLock::new();
    FEEDS.get_or_init(Default::default)
}

/// One lock per namespace: a [`Flaw::AbsentDeletesQuiet`] txn reads which
/// keys are live and commits under it, so nothing lands in between.
fn namespace_lock(namespace: &str) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(namespace.to_owned())
        .or_default()
        .clone()
}

#[derive(Debug)]
struct FlawedChanges {
    inner: SingleProcessMemoryBackend,
    feed: ChangeFeed,
    flaw: Flaw,
    /// This client ran a reclaim.
    reclaimed: AtomicBool,
}

#[async_trait]
impl Backend for FlawedChanges {
    fn namespace(&self) -> &str {
        self.inner.namespace()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        self.inner.raw_snapshot(keys).await
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let lock = namespace_lock(self.inner.namespace());
        let _serialised = lock.lock().await;
        let live: Vec<String> = if self.flaw == Flaw::AbsentDeletesQuiet {
            let keys: Vec<&str> = mutations.iter().map(Mutation::key).collect();
            let entries = self.inner.raw_snapshot(&keys).await?;
            entries
                .into_iter()
                .filter(|e| e.value.is_some())
                .map(|e| e.key)
                .collect()
        } else {
            Vec::new()
        };
        let out = self.inner.raw_txn(asserts, mutations).await?;
        let quiet = self.flaw == Flaw::QuietAfterReclaim && self.reclaimed.load(Ordering::SeqCst);
        if out.applied && !quiet {
            let keys: Arc<[String]> = mutations
                .iter()
                .filter(|m| self.flaw != Flaw::PutsOnly || matches!(m, Mutation::Put { .. }))
                .filter(|m| {
                    self.flaw != Flaw::AbsentDeletesQuiet
                        || matches!(m, Mutation::Put { .. })
                        || live.iter().any(|k| k == m.key())
                })
                .map(|m| match self.flaw {
                    Flaw::Mangled => m.key().rsplit('/').next().unwrap_or("").to_owned(),
                    _ => m.key().to_owned(),
                })
                .collect();
            if !keys.is_empty() {
                self.feed.publish(Changed::Keys(keys));
            }
        }
        Ok(out)
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.raw_keys(prefix).await
    }

    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.reclaimed.store(true, Ordering::SeqCst);
        self.inner.reclaim(options).await
    }
}

#[async_trait]
impl Changes for FlawedChanges {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        Ok(match self.flaw {
            Flaw::Silent => Box::new(Never),
            Flaw::FirstOnly => Box::new(Once(Some(self.feed.watch(prefix)))),
            Flaw::None
            | Flaw::PutsOnly
            | Flaw::Mangled
            | Flaw::QuietAfterReclaim
            | Flaw::AbsentDeletesQuiet => self.feed.watch(prefix),
        })
    }
}

#[derive(Debug)]
struct Never;

#[async_trait]
impl ChangeWatch for Never {
    async fn changed(&mut self) -> Result<()> {
        std::future::pending().await
    }
}

#[derive(Debug)]
struct Once(Option<Box<dyn ChangeWatch>>);

#[async_trait]
impl ChangeWatch for Once {
    async fn changed(&mut self) -> Result<()> {
        match self.0.take() {
            Some(mut first) => first.changed().await,
            None => std::future::pending().await,
        }
    }
}

fn flawed(flaw: Flaw) -> BackendFactory {
    factory(move |namespace| async move {
        let feed = feeds()
            .lock()
            .unwrap()
            .entry(namespace.clone())
            .or_default()
            .clone();
        Ok(Arc::new(FlawedChanges {
            inner: SingleProcessMemoryBackend::shared(&namespace)?,
            feed,
            flaw,
            reclaimed: AtomicBool::new(false),
        }) as Arc<dyn Backend>)
    })
}

/// Run every case of the suite on `flaw` at once; return the names of the failed ones.
async fn failed_cases(flaw: Flaw) -> Vec<&'static str> {
    let cases = coord_conformance::changes::cases();
    let mut runs = Vec::new();
    for case in cases {
        runs.push(tokio::spawn(async move {
            run_cases(&[case], flawed(flaw), |_| {}).await
        }));
    }
    let mut failed = Vec::new();
    for run in runs {
        for report in run.await.unwrap() {
            if let Err(failure) = &report.result {
                eprintln!(
                    "{flaw:?}: {}::{} failed: {failure}",
                    report.suite, report.name
                );
                failed.push(report.name);
            }
        }
    }
    failed.sort_unstable();
    failed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_passes() {
    assert_eq!(failed_cases(Flaw::None).await, Vec::<&str>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silent_watch_is_caught() {
    let failed = failed_cases(Flaw::Silent).await;
    assert_eq!(
        failed.len(),
        coord_conformance::changes::cases().len(),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unnotified_delete_is_caught() {
    assert_eq!(
        failed_cases(Flaw::PutsOnly).await,
        [
            "absent_keys_wake_when_written_also_after_reclaim",
            "delete_wakes"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_firing_once_is_caught() {
    assert_eq!(
        failed_cases(Flaw::FirstOnly).await,
        [
            "absent_keys_wake_when_written_also_after_reclaim",
            "changes_fold_and_watch_keeps_working"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mangled_keys_are_caught() {
    let failed = failed_cases(Flaw::Mangled).await;
    assert!(failed.contains(&"prefix_is_literal"), "{failed:?}");
    assert!(
        failed.contains(&"put_by_another_client_wakes"),
        "{failed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn silence_after_a_reclaim_is_caught() {
    assert_eq!(
        failed_cases(Flaw::QuietAfterReclaim).await,
        ["absent_keys_wake_when_written_also_after_reclaim"]
    );
}

/// A store that does not report deletes of keys that are not there (etcd
/// after a reclaim) passes the suite: the contract does not ask for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quiet_deletes_of_absent_keys_pass() {
    assert_eq!(
        failed_cases(Flaw::AbsentDeletesQuiet).await,
        Vec::<&str>::new()
    );
}

/// ... and the fair lock does not rely on it: its suite passes over that
/// store (a hand-over that only deleted a ticket never written left its
/// waiter asleep until its poll).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fair_lock_does_not_rely_on_deletes_of_absent_keys() {
    let mut failed = Vec::new();
    for report in run_cases(
        &coord_conformance::fair_lock::cases(),
        flawed(Flaw::AbsentDeletesQuiet),
        |report| eprintln!("fair_lock::{}: {:?}", report.name, report.elapsed),
    )
    .await
    {
        if let Err(failure) = &report.result {
            eprintln!("fair_lock::{} failed: {failure}", report.name);
            failed.push(report.name);
        }
    }
    assert_eq!(failed, Vec::<&str>::new());
}
