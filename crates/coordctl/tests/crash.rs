//! The side-effect gate under SIGKILL, per store, with real processes.
//!
//! Each test runs `coordctl crash-drive` (see `src/crash.rs`): N iterations,
//! each with a fresh key, a child killed in a random phase (before apply,
//! inside apply, between apply and complete, or at a random time), then the
//! key settled by reruns, TTL waits and `coordctl reconcile` subprocesses.
//! The test then checks the end state INDEPENDENTLY of the driver's own
//! verdict: it reads the counter file itself (every key exactly one line,
//! never two) and asks the store, through the adapter, that every key is
//! completed.
//!
//! `COORD_CRASH_ITERATIONS` overrides the iteration count (default 40);
//! PostgreSQL and Redis run when `COORD_TEST_POSTGRES_URL` /
//! `COORD_TEST_REDIS_URL` are set (SKIPPED otherwise).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Output};

use coord_adapters::sideeffect::{KeyStatus, SideEffectAdapter};
use serde_json::Value;

mod common;
use common::{inspect_text, server_url, unique, Scratch, COORDCTL};

fn iterations() -> u32 {
    std::env::var("COORD_CRASH_ITERATIONS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(40)
}

fn counter_lines(path: &Path) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    for line in text.lines() {
        *counts.entry(line.to_owned()).or_default() += 1;
    }
    counts
}

/// One `coordctl crash-child` run (never killed) applying `key` on `url`,
/// counting in `counter`, with `extra` arguments.
fn crash_child(url: &str, key: &str, counter: &Path, extra: &[&str]) -> Output {
    Command::new(COORDCTL)
        .args([
            "crash-child",
            "--store",
            url,
            "--key",
            key,
            "--counter-file",
        ])
        .arg(counter)
        .args(extra)
        .output()
        .unwrap()
}

/// Drive the kill loop on `url` and check everything it left behind.
fn crash_store(name: &str, url: String) {
    let scratch = Scratch::new(&format!("crash-{name}"));
    let counter = scratch.0.join("counter.txt");
    let report_path = scratch.0.join("report.json");
    let n = iterations();
    let out = Command::new(COORDCTL)
        .arg("crash-drive")
        .args(["--store", &url])
        .args(["--iterations", &n.to_string()])
        .arg("--counter-file")
        .arg(&counter)
        .arg("--report")
        .arg(&report_path)
        .args(["--ttl-ms", "300"])
        .output()
        .expect("coordctl runs");
    // The summary table (shown with --nocapture, and on failure).
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "crash-drive failed on {name} ({}): {stderr}",
        out.status
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(&report_path).expect("report written"))
            .expect("report is JSON");
    assert_eq!(report["double_applies"], 0, "double applies on {name}");
    assert_eq!(report["anomalies"], 0, "anomalies on {name}");
    let iterations = report["iterations"].as_array().expect("iterations");
    assert_eq!(iterations.len(), n as usize);

    // Our own reading of the external counter: one line per key, never two.
    let lines = counter_lines(&counter);
    let keys: Vec<String> = iterations
        .iter()
        .map(|it| it["key"].as_str().unwrap().to_owned())
        .collect();
    for key in &keys {
        assert_eq!(
            lines.get(key).copied().unwrap_or(0),
            1,
            "key {key} on {name}: the counter must hold exactly one line"
        );
    }
    assert!(
        lines.values().all(|n| *n == 1),
        "a counter line appears twice on {name}: {lines:?}"
    );

    // And the store's view: every key completed (none left uncertain or in flight).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let backend = coord::connect(&url).await.expect("store reachable");
        let adapter = SideEffectAdapter::new(backend);
        for key in &keys {
            let status = adapter.key_status(key).await.expect("key status");
            assert!(
                matches!(status, KeyStatus::Completed { .. }),
                "key {key} on {name} ended {status:?}"
            );
        }
    });

    // The uncertain path (kill between apply and complete) must have been
    // exercised and settled by `coordctl reconcile`; otherwise this run
    // proved little.
    let reconciled = iterations
        .iter()
        .filter(|it| {
            it["steps"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s.as_str().unwrap().starts_with("reconcile:"))
        })
        .count();
    assert!(reconciled > 0, "no iteration on {name} needed a reconcile");

    // `inspect` runs on the end state and lists no uncertain key.
    let text = inspect_text(&url);
    assert!(text.contains("UNCERTAIN KEYS (0)"), "{text}");
    assert!(text.contains("IN-FLIGHT INTENTS (0)"), "{text}");
}

#[test]
fn crash_sqlite() {
    let scratch = Scratch::new("crash-sqlite-db");
    let url = scratch.sqlite_url("coord.db", Some(&unique("crash-sqlite")));
    crash_store("sqlite", url);
}

#[test]
fn crash_postgres() {
    if let Some(url) = server_url("COORD_TEST_POSTGRES_URL", "crash-pg") {
        crash_store("postgres", url);
    }
}

#[test]
fn crash_redis() {
    if let Some(url) = server_url("COORD_TEST_REDIS_URL", "crash-redis") {
        crash_store("redis", url);
    }
}

/// `reconcile` refuses with a distinct exit code and a clear message when the
/// key is not uncertain, and changes nothing.
#[test]
fn reconcile_refuses_a_key_that_is_not_uncertain() {
    let scratch = Scratch::new("crash-refuse");
    let url = scratch.sqlite_url("coord.db", None);
    let counter = scratch.0.join("counter.txt");
    let child = crash_child(&url, "k1", &counter, &[]);
    assert!(child.status.success());
    let report: Value = serde_json::from_slice(&child.stdout).unwrap();
    assert_eq!(report["outcome"], "applied");

    for key in ["k1", "never-run"] {
        let out = Command::new(COORDCTL)
            .args(["reconcile", key, "--store", &url, "--not-applied"])
            .args(["--reason", "test"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let msg = String::from_utf8_lossy(&out.stderr);
        assert!(msg.contains("not uncertain"), "{msg}");
    }
    // Completed stays completed: the refused --not-applied changed nothing.
    let again = crash_child(&url, "k1", &counter, &[]);
    let report: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report["outcome"], "replayed");
    assert_eq!(counter_lines(&counter).get("k1"), Some(&1));
}

/// A key marked uncertain by a failed apply: `inspect` lists it with its
/// reason, a second reconciler is refused while the first holds its claim,
/// and `reconcile --not-applied` lets the key apply once.
#[test]
fn marked_uncertain_key_is_listed_and_reconciled() {
    let scratch = Scratch::new("crash-marked");
    let url = scratch.sqlite_url("coord.db", Some("marked"));
    let counter = scratch.0.join("counter.txt");
    let run = |extra: &[&str]| -> Value {
        serde_json::from_slice(&crash_child(&url, "m1", &counter, extra).stdout).unwrap()
    };
    let failed = run(&["--fail-apply"]);
    assert_eq!(failed["outcome"], "uncertain", "{failed}");
    assert_eq!(
        run(&[])["outcome"],
        "uncertain",
        "an uncertain key never re-runs"
    );

    let text = inspect_text(&url);
    assert!(text.contains("UNCERTAIN KEYS (1)"), "{text}");
    assert!(text.contains("injected apply failure"), "{text}");
    assert!(text.contains("crash-resource/m1"), "{text}");

    // Another reconciler holds the key: refused with exit code 4, nothing changed.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let claim = rt.block_on(async {
        use coord_adapters::sideeffect::{Action, SideEffectStore};
        let adapter = SideEffectAdapter::new(coord::connect(&url).await.unwrap());
        adapter
            .begin_reconcile(
                &Action::new("m1", "crash-resource/m1"),
                std::time::Duration::from_millis(600),
            )
            .await
            .unwrap()
            .expect("the key is free to claim")
    });
    let reconcile = || {
        Command::new(COORDCTL)
            .args(["reconcile", "m1", "--store", &url, "--not-applied"])
            .args(["--reason", "no line in the counter file"])
            .output()
            .unwrap()
    };
    let busy = reconcile();
    assert_eq!(busy.status.code(), Some(4), "{busy:?}");
    assert!(String::from_utf8_lossy(&busy.stderr).contains("someone else"));
    assert_eq!(run(&[])["outcome"], "uncertain");

    // Once that claim lapses, the operator's verdict goes through.
    std::thread::sleep(claim_left(claim.expires_at));
    let done = reconcile();
    assert!(done.status.success(), "{done:?}");
    assert!(String::from_utf8_lossy(&done.stdout).contains("may run again"));
    assert_eq!(run(&[])["outcome"], "applied");
    assert_eq!(run(&[])["outcome"], "replayed");
    assert_eq!(counter_lines(&counter).get("m1"), Some(&1));
}

fn claim_left(expires_at: std::time::SystemTime) -> std::time::Duration {
    expires_at
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default()
        + std::time::Duration::from_millis(50)
}
