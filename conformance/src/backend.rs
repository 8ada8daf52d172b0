//! The backend suite: the contract of the three primitives (SPEC §1).
//!
//! Run it with [`backend_tests!`](crate::backend_tests) or call the checks directly.

use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Mutation, Version};

use crate::{ensure, unique_namespace, BackendFactory, BoxFuture, Case, CheckResult, Failure};

/// Exactly one of `workers` racing writers that assert the same version
/// commits; the version moves by exactly one; store errors are reported as
/// errors, never counted as losers.
pub async fn concurrent_txn(backend: Arc<dyn Backend>, key: &str, workers: usize) -> CheckResult {
    let before = backend.snapshot(&[key.to_owned()]).await?.remove(0);
    let barrier = Arc::new(tokio::sync::Barrier::new(workers));
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let backend = backend.clone();
        let barrier = barrier.clone();
        let key = key.to_owned();
        let version = before.version;
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            backend
                .txn(
                    &[Assert::at(key.clone(), version)],
                    &[Mutation::put(key, format!("worker-{worker}"))],
                )
                .await
        }));
    }
    let mut winners = Vec::new();
    for (worker, task) in tasks.into_iter().enumerate() {
        let outcome = task
            .await
            .map_err(|e| Failure::new(format!("worker {worker} panicked: {e}")))??;
        if outcome.applied {
            winners.push(worker);
        }
    }
    ensure!(
        winners.len() == 1,
        "{} of {workers} racing txns on one version committed (expected exactly 1): {winners:?}",
        winners.len()
    );
    let after: Entry = backend.snapshot(&[key.to_owned()]).await?.remove(0);
    ensure!(
        after.version == Version(before.version.0 + 1),
        "version moved from {} to {} (expected exactly +1)",
        before.version,
        after.version
    );
    ensure!(
        after.value.as_deref() == Some(format!("worker-{}", winners[0]).as_bytes()),
        "stored value is not the winner's"
    );
    Ok(())
}

fn case_concurrent_txn(factory: BackendFactory) -> BoxFuture<'static, CheckResult> {
    Box::pin(async move {
        let backend = factory(unique_namespace("concurrent_txn")).await?;
        concurrent_txn(backend.clone(), "race", 16).await?;
        // again on an existing key
        concurrent_txn(backend, "race", 16).await
    })
}

/// Every case of the backend suite.
pub fn cases() -> Vec<Case> {
    vec![Case {
        suite: "backend",
        name: "concurrent_txn",
        run: case_concurrent_txn,
    }]
}

/// Expand the backend suite into one `#[tokio::test]` per case for a
/// [`BackendFactory`] expression (evaluated once per test).
#[macro_export]
macro_rules! backend_tests {
    ($factory:expr) => {
        $crate::__cases_as_tests!($crate::backend::cases, $factory;
            concurrent_txn,
        );
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn macro_lists_every_case() {
        let source = include_str!("backend.rs");
        for case in super::cases() {
            assert!(
                source.contains(&format!("            {},\n", case.name)),
                "backend_tests! does not list {}",
                case.name
            );
        }
    }
}
