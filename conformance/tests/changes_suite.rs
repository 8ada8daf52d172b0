//! The changes suite on the in-process memory store, and proof that it goes
//! red on stores whose notifications are broken (a check that cannot fail is
//! a defect).
//!
//! [`FlawedChanges`] wraps the memory store with a change feed of its own (one
//! per namespace, so two clients of a namespace share it, as two connections
//! to one server would) and one [`Flaw`] switched in. With `Flaw::None` it
//! passes every case, so a red case below is caused by the flaw.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use coord_backend::{
    Assert, Backend, ChangeFeed, ChangeWatch, Changed, Changes, Entry, Limits, Mutation, Result,
    TxnOutcome,
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
}

fn feeds() -> &'static Mutex<HashMap<String, ChangeFeed>> {
    static FEEDS: OnceLock<Mutex<HashMap<String, ChangeFeed>>> = OnceLock::new();
    FEEDS.get_or_init(Default::default)
}

#[derive(Debug)]
struct FlawedChanges {
    inner: SingleProcessMemoryBackend,
    feed: ChangeFeed,
    flaw: Flaw,
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
        let out = self.inner.raw_txn(asserts, mutations).await?;
        if out.applied {
            let keys: Arc<[String]> = mutations
                .iter()
                .filter(|m| self.flaw != Flaw::PutsOnly || matches!(m, Mutation::Put { .. }))
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
}

#[async_trait]
impl Changes for FlawedChanges {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        Ok(match self.flaw {
            Flaw::Silent => Box::new(Never),
            Flaw::FirstOnly => Box::new(Once(Some(self.feed.watch(prefix)))),
            Flaw::None | Flaw::PutsOnly | Flaw::Mangled => self.feed.watch(prefix),
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
    assert_eq!(failed_cases(Flaw::PutsOnly).await, ["delete_wakes"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_firing_once_is_caught() {
    assert_eq!(
        failed_cases(Flaw::FirstOnly).await,
        ["changes_fold_and_watch_keeps_working"]
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
