//! Stored record formats stay readable: `tests/golden/format-3.json` holds
//! every raw entry the adapters of the release that introduced storage
//! format 3 wrote in one namespace (a lock taken and released, a task board
//! with one task completed, a side effect applied, a leadership), and this
//! test loads them into a fresh store and reads them through today's
//! adapters. A release that can no longer read them breaks the promise of
//! api-lifecycle.yaml ("Stored data") and fails here; a new format gets a
//! new fixture beside the old ones, never a rewrite of them.
//!
//! The adapters' records are the same bytes on every store (only the key
//! layout around them differs, see docs/shapes.md), so the in-process store
//! carries them.
//!
//! `COORD_WRITE_GOLDEN=1 cargo test -p coord-adapters --test formats`
//! writes the fixture of the current format (for a NEW format only).

use std::sync::Arc;
use std::time::Duration;

use coord_adapters::board::{Board, BoardAdapter, TaskSpec, TaskState};
use coord_adapters::election::{Election, GenericElection};
use coord_adapters::lock::{GenericLock, Lock};
use coord_adapters::sideeffect::{Action, EffectResult, Outcome, Runner, SideEffectAdapter};
use coord_backend::reclaim::STORAGE_FORMAT;
use coord_backend::{Backend, Mutation};
use coord_memory::SingleProcessMemoryBackend;

const FORMAT: u32 = 3;
const NAMESPACE: &str = "golden";

fn fixture_path(format: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("format-{format}.json"))
}

/// What the fixture's namespace holds, written by the adapters.
async fn write_namespace(store: Arc<dyn Backend>) {
    let locks = GenericLock::new(store.clone());
    for _ in 0..3 {
        let held = locks
            .try_lock("reports/daily", Duration::from_secs(30))
            .await
            .unwrap()
            .expect("free");
        locks.release(held).await.unwrap();
    }
    let board = BoardAdapter::new(store.clone());
    board
        .seed(vec![
            TaskSpec::new("fetch", b"https://example.invalid/data".to_vec()),
            TaskSpec::new("index", b"".to_vec()).with_deps(["fetch"]),
        ])
        .await
        .unwrap();
    let claim = board
        .claim("fetch", "agent-1", Duration::from_secs(60))
        .await
        .unwrap();
    board
        .complete("fetch", &claim.token, b"42 rows".to_vec())
        .await
        .unwrap();
    let runner = Runner::new(Arc::new(SideEffectAdapter::new(store.clone())));
    let done = runner
        .execute(
            &Action::new("refund/order-42", "payments"),
            Duration::from_secs(30),
            |_lease| async { Ok::<_, std::io::Error>(EffectResult::from(&b"refund-id 9f2c"[..])) },
        )
        .await
        .unwrap();
    assert_eq!(done.outcome, Outcome::Applied);
    let election = GenericElection::new(store);
    let lead = election
        .campaign(
            "ingest",
            "node-a",
            "10.0.0.7:8080",
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    election.resign(lead).await.unwrap();
}

#[tokio::test]
async fn records_of_format_3_are_read_by_this_release() {
    if std::env::var_os("COORD_WRITE_GOLDEN").is_some() {
        let store = Arc::new(SingleProcessMemoryBackend::new(NAMESPACE).unwrap());
        write_namespace(store.clone()).await;
        let keys = store.keys("").await.unwrap();
        let entries = store.snapshot(&keys).await.unwrap();
        let entries: Vec<serde_json::Value> = entries
            .iter()
            .filter(|e| e.exists())
            .map(|e| {
                let value = String::from_utf8(e.value.clone().unwrap())
                    .expect("adapter records are UTF-8 JSON");
                serde_json::json!({ "key": e.key, "value": value })
            })
            .collect();
        let doc = serde_json::json!({ "storage_format": STORAGE_FORMAT, "entries": entries });
        std::fs::write(
            fixture_path(STORAGE_FORMAT),
            serde_json::to_string_pretty(&doc).unwrap() + "\n",
        )
        .unwrap();
        return;
    }

    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture_path(FORMAT)).unwrap()).unwrap();
    assert_eq!(doc["storage_format"], FORMAT);
    let store: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new(NAMESPACE).unwrap());
    let puts: Vec<Mutation> = doc["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            Mutation::put(
                e["key"].as_str().unwrap(),
                e["value"].as_str().unwrap().as_bytes().to_vec(),
            )
        })
        .collect();
    assert!(!puts.is_empty());
    assert!(store.txn(&[], &puts).await.unwrap().applied);

    // The lock was granted three times: the next grant's fence is above them.
    let locks = GenericLock::new(store.clone());
    let held = locks
        .try_lock("reports/daily", Duration::from_secs(30))
        .await
        .unwrap()
        .expect("released in the fixture");
    assert_eq!(held.fence(), 4);

    // The completed task keeps its result; its dependant is claimable.
    let board = BoardAdapter::new(store.clone());
    match board.get("fetch").await.unwrap().state {
        TaskState::Completed { result, .. } => assert_eq!(result, b"42 rows"),
        other => panic!("fetch is {other:?}"),
    }
    let next = board
        .claim("index", "agent-2", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(next.deps, vec!["fetch".to_owned()]);

    // The side effect replays its stored result and is not run again.
    let runner = Runner::new(Arc::new(SideEffectAdapter::new(store.clone())));
    let again = runner
        .execute(
            &Action::new("refund/order-42", "payments"),
            Duration::from_secs(30),
            |_lease| async {
                panic!("an applied side effect ran again");
                #[allow(unreachable_code)]
                Ok::<_, std::io::Error>(EffectResult::from(&b""[..]))
            },
        )
        .await
        .unwrap();
    assert_eq!(again.outcome, Outcome::Replayed);
    assert_eq!(again.result.unwrap().as_bytes(), b"refund-id 9f2c");

    // The next leadership's term is above the fixture's.
    let election = GenericElection::new(store);
    let lead = election
        .campaign(
            "ingest",
            "node-b",
            "10.0.0.8:8080",
            Duration::from_secs(10),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(lead.term(), 2);
}
