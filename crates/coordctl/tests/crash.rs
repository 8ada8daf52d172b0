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
//! The `outbox_*` tests race, kill and stop `coordctl outbox run` processes
//! (each wait up to `COORD_OUTBOX_DEADLINE_S`, default 120 s).
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

// ---------------------------------------------------------------------------
// `coordctl outbox run` processes (docs/outbox.md): each intent's command
// runs once, never twice, across racing dispatchers, SIGKILLs and verdicts.
// SQLite always; PostgreSQL when `COORD_TEST_POSTGRES_URL` is set.

/// How long any wait below may take on a busy machine before it fails:
/// 120 s, or `COORD_OUTBOX_DEADLINE_S` seconds.
fn outbox_deadline() -> std::time::Duration {
    let secs = std::env::var("COORD_OUTBOX_DEADLINE_S")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(120);
    std::time::Duration::from_secs(secs)
}

/// Poll `done` every 100 ms until it holds; panic with `what` after
/// [`outbox_deadline`].
fn outbox_wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + outbox_deadline();
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The command every dispatcher below runs: it appends
/// `KEY` to `log` (one line per run); `KEY` = `slow*` with fence 1 then
/// sleeps a minute, `temp*` with fence 1 exits 75, `bad*` exits 9.
fn outbox_command(log: &Path) -> Vec<String> {
    let script = format!(
        r#"cat >/dev/null; echo "$COORD_OUTBOX_KEY" >> '{}'
case "$COORD_OUTBOX_KEY:$COORD_OUTBOX_FENCE" in
  slow*:1) sleep 60 ;;
  temp*:1) exit 75 ;;
  bad*) exit 9 ;;
esac
printf 'done %s' "$COORD_OUTBOX_KEY""#,
        log.display()
    );
    vec!["sh".into(), "-c".into(), script]
}

/// A `coordctl outbox run` process, in its own process group (so a kill
/// of the group takes its running command too).
struct OutboxRunner {
    child: std::process::Child,
}

impl OutboxRunner {
    fn start(url: &str, name: &str, ttl: &str, log: &Path, out: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        let out = std::fs::File::create(out).unwrap();
        let child = Command::new(COORDCTL)
            .args([
                "outbox", "run", "--store", url, "--name", name, "--ttl", ttl, "--",
            ])
            .args(outbox_command(log))
            .stdout(out)
            .process_group(0)
            .spawn()
            .expect("start coordctl outbox run");
        OutboxRunner { child }
    }

    fn signal(&self, signal: &str, group: bool) {
        let pid = self.child.id();
        let target = if group {
            format!("-{pid}")
        } else {
            pid.to_string()
        };
        let status = Command::new("kill")
            .args([signal, "--", &target])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {target}");
    }

    /// SIGTERM: it lets a running command finish and exits 0.
    fn stop(mut self) {
        self.signal("-TERM", false);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "outbox run after SIGTERM: {status}");
    }

    /// SIGKILL to its whole group (it and its command).
    fn kill(mut self) {
        self.signal("-KILL", true);
        let _ = self.child.wait();
    }
}

impl Drop for OutboxRunner {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn outbox_enqueue(url: &str, name: &str, key: &str) {
    let out = Command::new(COORDCTL)
        .args(["outbox", "enqueue", "--store", url, "--name", name, key])
        .args(["--payload", &format!("payload of {key}")])
        .output()
        .unwrap();
    assert!(out.status.success(), "enqueue {key}: {out:?}");
}

/// `outbox status --json`'s state of `key`.
fn outbox_state(url: &str, name: &str, key: &str) -> String {
    let out = Command::new(COORDCTL)
        .args([
            "outbox", "status", "--store", url, "--name", name, key, "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "status {key}: {out:?}");
    let task: Value = serde_json::from_slice(&out.stdout).unwrap();
    task["state"].as_str().unwrap().to_owned()
}

/// Three dispatchers race over 30 intents: each command runs exactly once.
fn outbox_race(url: &str) {
    let scratch = Scratch::new("outbox-race");
    let log = scratch.0.join("runs.log");
    let keys: Vec<String> = (0..30).map(|i| format!("order-{i}")).collect();
    for key in &keys {
        outbox_enqueue(url, "race", key);
    }
    let runners: Vec<OutboxRunner> = (0..3)
        .map(|i| {
            let out = scratch.0.join(format!("runner-{i}.out"));
            OutboxRunner::start(url, "race", "30s", &log, &out)
        })
        .collect();
    outbox_wait_for("30 runs", || {
        counter_lines(&log).values().sum::<u64>() >= 30
    });
    for runner in runners {
        runner.stop();
    }
    let runs = counter_lines(&log);
    for key in &keys {
        assert_eq!(
            runs.get(key),
            Some(&1),
            "{key} ran {:?} times",
            runs.get(key)
        );
    }
    assert_eq!(runs.len(), keys.len(), "{runs:?}");
    for key in &keys {
        assert_eq!(outbox_state(url, "race", key), "completed", "{key}");
    }
}

/// A dispatcher SIGKILLed while idle, intents committed meanwhile: after a
/// restart every intent runs once.
fn outbox_killed_idle(url: &str) {
    let scratch = Scratch::new("outbox-idle");
    let log = scratch.0.join("runs.log");
    let first = OutboxRunner::start(url, "idle", "30s", &log, &scratch.0.join("1.out"));
    outbox_enqueue(url, "idle", "before-kill");
    outbox_wait_for("the first intent", || counter_lines(&log).len() == 1);
    // Idle for a few of its one-second claim waits: it must still be up,
    // and take the next intent.
    std::thread::sleep(std::time::Duration::from_secs(3));
    outbox_enqueue(url, "idle", "while-idle");
    outbox_wait_for("the intent sent while idle", || {
        counter_lines(&log).len() == 2
    });
    let mut first = first;
    assert!(
        first.child.try_wait().unwrap().is_none(),
        "the idle dispatcher exited"
    );
    first.kill();
    let keys: Vec<String> = (0..10).map(|i| format!("idle-{i}")).collect();
    for key in &keys {
        outbox_enqueue(url, "idle", key);
    }
    let second = OutboxRunner::start(url, "idle", "30s", &log, &scratch.0.join("2.out"));
    outbox_wait_for("11 runs", || {
        counter_lines(&log).values().sum::<u64>() >= 11
    });
    second.stop();
    let runs = counter_lines(&log);
    assert_eq!(runs.get("before-kill"), Some(&1), "{runs:?}");
    assert_eq!(runs.get("while-idle"), Some(&1), "{runs:?}");
    for key in &keys {
        assert_eq!(runs.get(key), Some(&1), "{runs:?}");
    }
}

/// A dispatcher SIGKILLed mid-command with a short --ttl: the next
/// dispatcher does not run it again; it is uncertain until a verdict;
/// `reconcile --outbox --not-applied` runs it once more, `--applied` never.
fn outbox_killed_mid_run(url: &str) {
    let scratch = Scratch::new("outbox-mid");
    let log = scratch.0.join("runs.log");
    let first = OutboxRunner::start(url, "mid", "2s", &log, &scratch.0.join("1.out"));
    outbox_enqueue(url, "mid", "slow-retry");
    outbox_enqueue(url, "mid", "slow-leave");
    outbox_wait_for("one slow command", || !counter_lines(&log).is_empty());
    first.kill();
    // Which one it ran first: that one is killed mid-run; the other is
    // then run (and killed) by the second dispatcher's first claim.
    let second = OutboxRunner::start(url, "mid", "2s", &log, &scratch.0.join("2.out"));
    outbox_wait_for("the second slow command", || counter_lines(&log).len() == 2);
    second.kill();
    let third = OutboxRunner::start(url, "mid", "2s", &log, &scratch.0.join("3.out"));
    for key in ["slow-retry", "slow-leave"] {
        outbox_wait_for(&format!("{key} uncertain"), || {
            outbox_state(url, "mid", key) == "uncertain"
        });
    }
    let runs = counter_lines(&log);
    assert_eq!(
        runs.get("slow-retry"),
        Some(&1),
        "ran again after a kill: {runs:?}"
    );
    assert_eq!(
        runs.get("slow-leave"),
        Some(&1),
        "ran again after a kill: {runs:?}"
    );

    let reconcile = |key: &str, verdict: &str| {
        let out = Command::new(COORDCTL)
            .args(["reconcile", "--store", url, "--outbox", "mid", key, verdict])
            .output()
            .unwrap();
        assert!(out.status.success(), "reconcile {key} {verdict}: {out:?}");
    };
    reconcile("slow-leave", "--applied");
    reconcile("slow-retry", "--not-applied");
    outbox_wait_for("slow-retry run again", || {
        outbox_state(url, "mid", "slow-retry") == "completed"
    });
    // A later intent runs too: the dispatcher is past the cancelled one.
    outbox_enqueue(url, "mid", "after");
    outbox_wait_for("the later intent", || {
        outbox_state(url, "mid", "after") == "completed"
    });
    third.stop();
    let runs = counter_lines(&log);
    assert_eq!(runs.get("slow-retry"), Some(&2), "{runs:?}");
    assert_eq!(runs.get("slow-leave"), Some(&1), "{runs:?}");
    assert_eq!(outbox_state(url, "mid", "slow-leave"), "cancelled");
    // A second verdict finds nothing to resolve: exit 3.
    let again = Command::new(COORDCTL)
        .args([
            "outbox",
            "resolve",
            "--store",
            url,
            "--name",
            "mid",
            "slow-leave",
            "--not-applied",
        ])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(3), "{again:?}");
}

/// Exit 75 is retried (and then applied); another exit code leaves the
/// intent uncertain, never run again.
fn outbox_exit_codes(url: &str) {
    let scratch = Scratch::new("outbox-codes");
    let log = scratch.0.join("runs.log");
    outbox_enqueue(url, "codes", "temp-1");
    outbox_enqueue(url, "codes", "bad-1");
    let runner = OutboxRunner::start(url, "codes", "30s", &log, &scratch.0.join("1.out"));
    outbox_wait_for("temp-1 completed", || {
        outbox_state(url, "codes", "temp-1") == "completed"
    });
    outbox_wait_for("bad-1 uncertain", || {
        outbox_state(url, "codes", "bad-1") == "uncertain"
    });
    // bad-1 would be due again by now had it been taken for a retry
    // (backoff 1 s): a later intent that ran shows the dispatcher moved on.
    outbox_enqueue(url, "codes", "later");
    outbox_wait_for("later completed", || {
        outbox_state(url, "codes", "later") == "completed"
    });
    runner.stop();
    let runs = counter_lines(&log);
    assert_eq!(runs.get("temp-1"), Some(&2), "{runs:?}");
    assert_eq!(runs.get("bad-1"), Some(&1), "{runs:?}");
    let out = std::fs::read_to_string(scratch.0.join("1.out")).unwrap();
    assert!(out.contains("temp-1 not-applied"), "{out}");
    assert!(out.contains("temp-1 applied"), "{out}");
    assert!(out.contains("bad-1 uncertain"), "{out}");
}

/// Each outbox scenario on `url`, in namespaces of its own.
fn outbox_store(url_for: impl Fn(&str) -> String) {
    outbox_exit_codes(&url_for("codes"));
    outbox_killed_idle(&url_for("idle"));
    outbox_killed_mid_run(&url_for("mid"));
    outbox_race(&url_for("race"));
}

#[test]
fn outbox_sqlite() {
    let scratch = Scratch::new("outbox-sqlite-db");
    outbox_store(|label| scratch.sqlite_url(&format!("{label}.db"), None));
}

#[test]
fn outbox_postgres() {
    if server_url("COORD_TEST_POSTGRES_URL", "outbox").is_none() {
        return;
    }
    outbox_store(|label| {
        server_url("COORD_TEST_POSTGRES_URL", &format!("outbox-{label}")).unwrap()
    });
}
