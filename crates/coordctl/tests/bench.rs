//! `coordctl bench`: the report's structure, in JSON and as a table, on
//! SQLite and on every server whose `COORD_TEST_*` variable is set. Speed is
//! never asserted: only that every row was measured (exactly the calls asked
//! for, positive times), that baselines are there where the store has them,
//! and that the raw baselines' records are gone afterwards.
//!
//! `coordctl demo` (worker processes racing on one store) runs here too: its
//! totals must match on SQLite (its default) and on every server given.
//!
//! `coordctl board` runs here too, on a SQLite board seeded through the
//! adapter (a dead task, a ready one, one in another queue): its reads agree
//! with the adapter, `retry` and `cancel` change exactly what they say (checked
//! through the adapter), refusals exit 3 and change nothing, bad input exits 2,
//! and a store that is down is an error.

use coord_backend::StoreUrl;
use serde_json::Value;

mod common;
use common::{coordctl, unique, Scratch};
const ITERATIONS: u64 = 6;

/// The rows every report has: (section, op).
const ROWS: [(&str, &str); 5] = [
    ("primitives", "txn"),
    ("primitives", "snapshot"),
    ("locks", "lock_cycle"),
    ("sideeffect", "execute"),
    ("sideeffect", "replay"),
];

fn bench_json(url: &str) -> Value {
    let iterations = ITERATIONS.to_string();
    let out = coordctl(&[
        "bench",
        "--store",
        url,
        "--iterations",
        &iterations,
        "--json",
    ]);
    assert!(
        out.status.success(),
        "coordctl bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn positive(value: &Value, field: &str, context: &str) -> f64 {
    let n = value[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{context}: {field} is not a number: {value}"));
    assert!(n > 0.0 && n.is_finite(), "{context}: {field} = {n}");
    n
}

/// Check one measured operation (a row or its baseline).
fn check_stat(stat: &Value, context: &str) {
    assert_eq!(
        stat["calls"].as_u64(),
        Some(ITERATIONS),
        "{context}: calls: {stat}"
    );
    for field in ["seconds", "ops_per_sec", "mean_us", "p99_us"] {
        positive(stat, field, context);
    }
    assert!(stat["subject"].as_str().is_some_and(|s| !s.is_empty()));
}

/// Check the whole report; `baselines` lists the (section, op) rows that
/// must have a measured baseline on this store.
fn check_report(report: &Value, namespace_prefix: &str, baselines: &[(&str, &str)]) {
    assert_eq!(report["budget"]["iterations"].as_u64(), Some(ITERATIONS));
    assert!(report["slices"].as_u64().is_some_and(|n| n > 0));
    let namespace = report["namespace"].as_str().unwrap();
    assert!(
        namespace.starts_with(&format!("{namespace_prefix}-bench-")),
        "{namespace}"
    );
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), ROWS.len(), "{report}");
    for (section, op) in ROWS {
        let context = format!("{section}/{op}");
        let row = rows
            .iter()
            .find(|r| r["section"] == section && r["op"] == op)
            .unwrap_or_else(|| panic!("no row {context}: {report}"));
        check_stat(row, &context);
        if baselines.contains(&(section, op)) {
            let baseline = &row["baseline"];
            check_stat(baseline, &format!("{context} baseline"));
            positive(baseline, "times", &context);
            positive(row, "ratio", &context);
            assert!(row["baseline_note"].is_null());
        } else {
            assert!(row["baseline"].is_null(), "{context}: {row}");
            assert!(row["ratio"].is_null(), "{context}: {row}");
            assert!(
                row["baseline_note"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("n/a")),
                "{context}: {row}"
            );
        }
        if section != "primitives" {
            // Counted by the CAS engine: a generic lock cycle or an execute
            // takes at least one round trip.
            positive(row, "round_trips_per_op", &context);
        }
    }
    assert_eq!(
        rows.iter()
            .find(|r| r["op"] == "execute")
            .map(|r| r["baseline"]["times"].as_f64()),
        Some(Some(3.0)),
        "execute is compared with three raw writes"
    );
}

#[test]
fn sqlite_json_and_table() {
    let scratch = Scratch::new("bench");
    let url = scratch.sqlite_url("c.db", Some("app"));
    let report = bench_json(&url);
    check_report(
        &report,
        "app",
        &[
            ("primitives", "txn"),
            ("primitives", "snapshot"),
            ("sideeffect", "execute"),
            ("sideeffect", "replay"),
        ],
    );
    // The raw baseline's sibling file is removed; only the store's own files stay.
    let mut left: Vec<String> = std::fs::read_dir(&scratch.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("bench-raw"))
        .collect();
    left.sort();
    assert!(left.is_empty(), "raw baseline files left: {left:?}");

    let out = coordctl(&["bench", "--store", &url, "--iterations", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for header in [
        "[primitives] operation",
        "[locks] operation",
        "[sideeffect] operation",
        "baseline",
        "ratio",
        "GenericLock try_lock + release",
        "n/a: SQLite has no native lock",
    ] {
        assert!(text.contains(header), "no {header:?} in:\n{text}");
    }
}

#[test]
fn memory_has_no_raw_baseline() {
    let report = bench_json("memory://?namespace=m");
    check_report(
        &report,
        "m",
        &[("sideeffect", "execute"), ("sideeffect", "replay")],
    );
}

#[test]
fn bad_input_is_refused() {
    for args in [
        &["bench", "--store", "nope"][..],
        &["bench", "--store", "memory://", "--iterations", "0"],
        &["bench", "--store", "memory://", "--seconds", "-1"],
        &["bench", "--store", "unknown://x"],
    ] {
        let out = coordctl(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(out.stdout.is_empty(), "{args:?} printed a report");
        assert!(!out.stderr.is_empty(), "{args:?} said nothing");
    }
}

#[test]
fn a_store_that_is_down_is_an_error() {
    // Nothing listens on port 1.
    let out = coordctl(&[
        "bench",
        "--store",
        "redis://127.0.0.1:1",
        "--iterations",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}

/// The server stores: every native baseline is there.
fn server(var: &str, label: &str, with_native_lock: bool) {
    let Some(base) = coord_conformance::server_env(var) else {
        return;
    };
    let base = if label == "etcd" {
        format!("etcd://{}", base.trim())
    } else {
        base
    };
    let namespace = unique(&format!("bench-{label}"));
    let url = StoreUrl::parse(&base).unwrap().with_namespace(&namespace);
    let report = bench_json(&url);
    let mut baselines = vec![
        ("primitives", "txn"),
        ("primitives", "snapshot"),
        ("sideeffect", "execute"),
        ("sideeffect", "replay"),
    ];
    if with_native_lock {
        baselines.push(("locks", "lock_cycle"));
    }
    check_report(&report, &namespace, &baselines);
    let shown = report["store"].as_str().unwrap();
    assert!(!shown.contains("namespace="), "{shown}");
}

#[test]
fn redis() {
    server("COORD_TEST_REDIS_URL", "redis", true);
}

#[test]
fn postgres() {
    server("COORD_TEST_POSTGRES_URL", "pg", true);
}

#[test]
fn etcd() {
    server("COORD_TEST_ETCD_ENDPOINTS", "etcd", true);
}

#[test]
fn password_is_not_shown() {
    // The URL is shown in the report; a password in it never is. The store is
    // down (port 1), so the command fails, and its error must not show it either.
    let out = coordctl(&[
        "bench",
        "--store",
        "postgres://user:s3cret-pw@127.0.0.1:1/db",
        "--iterations",
        "1",
    ]);
    assert!(!out.status.success());
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("s3cret-pw"), "{all}");
}

fn gc_json(args: &[&str]) -> Value {
    let out = coordctl(args);
    assert!(
        out.status.success(),
        "coordctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON document")
}

/// `coordctl gc`: bounded passes, `more` until everything is reclaimed, a
/// dry run that changes nothing, and bad input refused.
#[test]
fn gc_reclaims_tombstones_in_passes() {
    use coord_backend::{Assert, Mutation, Version};
    let scratch = Scratch::new("gc");
    let url = scratch.sqlite_url("c.db", Some("app"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = coord::connect(&url).await.unwrap();
        for i in 0..25 {
            let key = format!("k/{i}");
            let put = [Mutation::put(key.as_str(), b"v".to_vec())];
            assert!(
                store
                    .txn(&[Assert::missing(key.as_str())], &put)
                    .await
                    .unwrap()
                    .applied
            );
            let delete = [Mutation::delete(key.as_str())];
            let at = [Assert::at(key.as_str(), Version(1))];
            assert!(store.txn(&at, &delete).await.unwrap().applied);
        }
    });
    let dry = coordctl(&["gc", "--store", &url, "--dry-run"]);
    assert!(dry.status.success());
    assert!(String::from_utf8_lossy(&dry.stdout).contains("nothing changed"));
    let first = gc_json(&[
        "gc",
        "--store",
        &url,
        "--per-pass",
        "10",
        "--max-passes",
        "2",
        "--json",
    ]);
    assert_eq!(
        (
            &first["removed"],
            &first["passes"],
            &first["more"],
            &first["namespace"]
        ),
        (
            &Value::from(20),
            &Value::from(2),
            &Value::from(true),
            &Value::from("app")
        ),
        "{first}"
    );
    let rest = gc_json(&["gc", "--store", &url, "--json"]);
    assert_eq!(
        (&rest["removed"], &rest["more"]),
        (&Value::from(5), &Value::from(false))
    );
    runtime.block_on(async {
        let store = coord::connect(&url).await.unwrap();
        let put = [Mutation::put("k/0", b"again".to_vec())];
        assert!(
            store
                .txn(&[Assert::missing("k/0")], &put)
                .await
                .unwrap()
                .applied
        );
        let entry = store.snapshot(&["k/0".to_owned()]).await.unwrap();
        assert_eq!(
            entry[0].version,
            Version(3),
            "re-created above its old counter"
        );
    });
    // A side effect completed just now stays under a one-hour retention.
    runtime.block_on(async {
        use coord_adapters::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};
        let store = coord::connect(&url).await.unwrap();
        let runner = Runner::new(std::sync::Arc::new(SideEffectAdapter::new(store)));
        runner
            .execute(
                &Action::new("order-1", "payments"),
                std::time::Duration::from_secs(30),
                |_| async { Ok::<_, std::io::Error>(EffectResult::from(&b"ok"[..])) },
            )
            .await
            .unwrap();
    });
    let kept = gc_json(&[
        "gc",
        "--store",
        &url,
        "--side-effects-retention",
        "1h",
        "--json",
    ]);
    assert_eq!(kept["pruned"], Value::from(0), "{kept}");
    // Board tasks: one completed two hours ago (by its board's clock) goes
    // under a one-hour retention, the one completed now stays.
    runtime.block_on(async {
        use coord_adapters::board::{Board, BoardAdapter, BoardOptions, TaskSpec};
        use coord_backend::{Clock, ManualClock, SystemClock};
        let store = coord::connect(&url).await.unwrap();
        let two_hours_ago = std::sync::Arc::new(ManualClock::at_millis(
            SystemClock.now_millis() - 2 * 3_600_000,
        ));
        for (id, clock) in [
            ("old", two_hours_ago as std::sync::Arc<dyn Clock>),
            ("new", std::sync::Arc::new(SystemClock)),
        ] {
            let board = BoardAdapter::with_options(
                store.clone(),
                BoardOptions::default().with_clock(clock),
            );
            board.add(TaskSpec::new(id, b"p".to_vec())).await.unwrap();
            let claim = board
                .claim(id, "agent", std::time::Duration::from_secs(30))
                .await
                .unwrap();
            board.complete(id, &claim.token, vec![]).await.unwrap();
        }
    });
    // A dry run counts the task past its retention and removes nothing.
    let dry_run = [
        "gc",
        "--store",
        &url,
        "--board-retention",
        "1h",
        "--dry-run",
    ];
    let dry = gc_json(&[&dry_run[..], &["--json"]].concat());
    assert_eq!(
        (
            &dry["candidate_tasks"],
            &dry["pruned_tasks"],
            &dry["removed"]
        ),
        (&Value::from(1), &Value::from(0), &Value::from(0)),
        "{dry}"
    );
    let dry_text = coordctl(&dry_run);
    assert!(
        String::from_utf8_lossy(&dry_text.stdout).contains("prune up to 1 task(s)"),
        "{}",
        String::from_utf8_lossy(&dry_text.stdout)
    );
    let pruned = gc_json(&["gc", "--store", &url, "--board-retention", "1h", "--json"]);
    assert_eq!(
        (&pruned["pruned_tasks"], &pruned["pruned"]),
        (&Value::from(1), &Value::from(0)),
        "{pruned}"
    );
    runtime.block_on(async {
        use coord_adapters::board::{Board, BoardAdapter};
        let store = coord::connect(&url).await.unwrap();
        let ids: Vec<String> = BoardAdapter::new(store)
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect();
        assert_eq!(ids, ["new"]);
    });
    for args in [
        &["gc", "--store", &url, "--per-pass", "0"][..],
        &["gc", "--store", "nope"],
        &["gc", "--store", &url, "--side-effects-retention", "30s"],
        &["gc", "--store", &url, "--side-effects-retention", "soon"],
        &["gc", "--store", &url, "--board-prefix", "jobs/"],
    ] {
        let out = coordctl(args);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(!out.stderr.is_empty(), "{args:?} said nothing");
    }
}

/// A namespace holding records from before clients announced their storage
/// format: `coordctl gc` refuses (saying what to do) until
/// `--older-clients-stopped`, once; later runs need it no more.
#[test]
fn gc_needs_the_operators_word_for_records_from_before_announcements() {
    use coord_backend::{Assert, Mutation, Version};
    use sqlx::Connection;
    let scratch = Scratch::new("gc-formats");
    let url = scratch.sqlite_url("c.db", Some("app"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = coord::connect(&url).await.unwrap();
        let put = [Mutation::put("k", b"v".to_vec())];
        assert!(
            store
                .txn(&[Assert::missing("k")], &put)
                .await
                .unwrap()
                .applied
        );
        let delete = [Mutation::delete("k")];
        assert!(
            store
                .txn(&[Assert::at("k", Version(1))], &delete)
                .await
                .unwrap()
                .applied
        );
        // As if those records had been written before announcements.
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(scratch.0.join("c.db"));
        let mut conn = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        sqlx::query("DELETE FROM coord_clients")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    });
    let refused = coordctl(&["gc", "--store", &url]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--older-clients-stopped"), "{stderr}");
    let done = gc_json(&["gc", "--store", &url, "--older-clients-stopped", "--json"]);
    assert_eq!(&done["removed"], &Value::from(1), "{done}");
    let again = coordctl(&["gc", "--store", &url]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}

/// `--store` falls back to `COORD_STORE`, so a password need not be on the
/// command line; `--help` names the variable without showing its value; an
/// explicit `--store` wins; with neither, clap's usage error.
#[test]
fn store_url_from_the_environment() {
    use std::process::Command;
    let scratch = Scratch::new("store-env");
    let url = scratch.sqlite_url("c.db", Some("env"));
    let run = |env: Option<&str>, args: &[&str]| {
        let mut cmd = Command::new(common::COORDCTL);
        cmd.args(args).env_remove("COORD_STORE");
        if let Some(value) = env {
            cmd.env("COORD_STORE", value);
        }
        cmd.output().expect("run coordctl")
    };

    let from_env = run(Some(&url), &["gc", "--dry-run"]);
    assert!(from_env.status.success(), "{from_env:?}");
    assert!(String::from_utf8_lossy(&from_env.stdout).contains("nothing changed"));
    let inspect = run(Some(&url), &["inspect", "--json"]);
    assert!(inspect.status.success(), "{inspect:?}");

    let secret = "postgres://app:s3cret-pw@127.0.0.1:1/db";
    let help = run(Some(secret), &["gc", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success(), "{help:?}");
    assert!(text.contains("COORD_STORE"), "{text}");
    assert!(!text.contains("s3cret"), "help shows the password: {text}");

    let explicit = run(Some("nope://x"), &["gc", "--dry-run", "--store", &url]);
    assert!(explicit.status.success(), "{explicit:?}");

    let neither = run(None, &["gc", "--dry-run"]);
    assert_eq!(neither.status.code(), Some(2), "{neither:?}");
    assert!(String::from_utf8_lossy(&neither.stderr).contains("--store"));
}

/// `coordctl demo` on `url` (None: its default, a fresh SQLite file): every
/// increment counted once and every queued job done by exactly one worker,
/// as the store and the workers both say.
fn demo(url: Option<&str>) {
    let mut args = vec![
        "demo",
        "--workers",
        "3",
        "--increments",
        "40",
        "--jobs",
        "30",
        "--job-ms",
        "2",
    ];
    if let Some(url) = url {
        args.extend(["--store", url]);
    }
    let out = coordctl(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "counter increments",
        "jobs completed (store)",
        "jobs done (workers)",
        "workers finished",
    ] {
        let line = text
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("no {row:?} row in {text}"));
        assert!(line.ends_with(" ok"), "{line}");
    }
    assert!(text.contains("the 30 jobs spread over"), "{text}");
}

#[test]
fn demo_totals_match() {
    demo(None);
    for var in ["COORD_TEST_REDIS_URL", "COORD_TEST_POSTGRES_URL"] {
        if let Some(base) = coord_conformance::server_env(var) {
            demo(Some(&base));
        }
    }
}

/// `coordctl board ARGS --store url`: (exit code, stdout, stderr).
fn board(url: &str, args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["board"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", url]);
    let out = coordctl(&all);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `coordctl board ARGS --json` (which must succeed), parsed.
fn board_json(url: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (code, out, err) = board(url, &all);
    assert_eq!(code, 0, "board {args:?} failed: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("board {args:?}: {e}: {out}"))
}

/// The ids of a `list --json` answer.
fn listed(view: &Value) -> Vec<&str> {
    view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect()
}

#[test]
fn board_reads_retries_and_cancels() {
    use coord_adapters::board::{Board, BoardAdapter, RetryPolicy, TaskSpec, TaskState};
    use std::time::Duration;
    let scratch = Scratch::new("board");
    let url = scratch.sqlite_url("c.db", Some(&unique("board")));
    let error = "550 mailbox unavailable";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let adapter = runtime.block_on(async {
        let board = BoardAdapter::new(coord::connect(&url).await.unwrap());
        board
            .add_many(vec![
                TaskSpec::new("bounce-1", b"secret payload".to_vec())
                    .in_queue("emails")
                    .with_retry(RetryPolicy::attempts(1))
                    .with_priority(1),
                TaskSpec::new("mail-ok", b"".to_vec()).in_queue("emails"),
                TaskSpec::new("report-1", b"".to_vec()).in_queue("reports"),
            ])
            .await
            .unwrap();
        let claim = board
            .claim_next("emails", "w", Duration::from_secs(600))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(claim.id, "bounce-1");
        board.fail("bounce-1", &claim.token, error).await.unwrap();
        board
    });
    let get = |id: &str| runtime.block_on(adapter.get(id)).unwrap();

    // queues: the counts the adapter keeps, text and JSON alike.
    let queues = board_json(&url, &["queues"]);
    let emails = &queues["queues"][0];
    assert_eq!(emails["queue"], "emails", "{queues}");
    let counts = |q: &Value| ["depth", "ready", "timed", "dead"].map(|f| q[f].as_u64().unwrap());
    assert_eq!(counts(emails), [1, 1, 0, 1], "{queues}");
    assert_eq!(queues["queues"][1]["queue"], "reports");
    assert_eq!(counts(&queues["queues"][1]), [1, 1, 0, 0], "{queues}");
    let (code, text, _) = board(&url, &["queues"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("emails") && text.contains("reports"),
        "{text}"
    );

    // list: a page, a queue, a state, and paging past what does not match.
    let all = board_json(&url, &["list"]);
    assert_eq!(listed(&all), ["bounce-1", "mail-ok", "report-1"], "{all}");
    let first = board_json(&url, &["list", "--limit", "1"]);
    assert_eq!(
        (listed(&first), &first["next_after"]),
        (vec!["bounce-1"], &Value::from("bounce-1"))
    );
    let emails = board_json(&url, &["list", "--queue", "emails"]);
    assert_eq!(listed(&emails), ["bounce-1", "mail-ok"], "{emails}");
    let dead = board_json(&url, &["list", "--queue", "emails", "--state", "dead"]);
    assert_eq!(listed(&dead), ["bounce-1"], "{dead}");
    let reports = board_json(&url, &["list", "--queue", "reports", "--limit", "1"]);
    assert_eq!(listed(&reports), ["report-1"], "{reports}");
    let (code, text, _) = board(&url, &["list", "--queue", "emails"]);
    assert_eq!(code, 0);
    assert!(
        text.contains("bounce-1") && !text.contains("report-1"),
        "{text}"
    );
    assert!(!text.contains("secret payload"), "{text}");

    // show and dead: the error of the last attempt, never the payload.
    let shown = board_json(&url, &["show", "bounce-1"]);
    assert_eq!(
        (
            &shown["state"],
            &shown["attempts"],
            &shown["max_attempts"],
            &shown["last_error"]
        ),
        (
            &Value::from("dead"),
            &Value::from(1),
            &Value::from(1),
            &Value::from(error)
        ),
        "{shown}"
    );
    let (code, text, _) = board(&url, &["show", "bounce-1"]);
    assert_eq!(code, 0);
    assert!(
        text.contains(error) && !text.contains("secret payload"),
        "{text}"
    );
    let dead = board_json(&url, &["dead", "emails"]);
    let row = &dead["dead_tasks"][0];
    assert_eq!(
        (&row["id"], &row["last_error"]),
        (&Value::from("bounce-1"), &Value::from(error)),
        "{dead}"
    );
    assert!(row["died_ms"].as_u64().unwrap() > 0, "{dead}");
    assert_eq!(dead["dead_tasks"].as_array().unwrap().len(), 1);
    let (code, text, _) = board(&url, &["dead", "emails"]);
    assert_eq!(code, 0);
    assert!(text.contains("bounce-1") && text.contains(error), "{text}");
    let (code, _, err) = board(&url, &["show", "nope"]);
    assert_eq!(code, 3, "{err}");

    // retry of a task that is not dead: refused, nothing changed.
    let before = get("mail-ok");
    let (code, out, err) = board(&url, &["retry", "mail-ok"]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(err.contains("not dead"), "{err}");
    assert_eq!(get("mail-ok"), before);

    // retry of the dead task: ready again, attempts from zero.
    let (code, out, err) = board(&url, &["retry", "bounce-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("retried task \"bounce-1\"") && out.contains(error),
        "{out}"
    );
    let task = get("bounce-1");
    assert_eq!(
        (&task.state, task.attempts),
        (&TaskState::Open, 0),
        "{task:?}"
    );
    let depth = runtime
        .block_on(adapter.queue_depth("emails", 100))
        .unwrap();
    assert_eq!((depth.ready.count, depth.dead.count), (2, 0), "{depth:?}");
    let (code, _, err) = board(&url, &["retry", "bounce-1"]);
    assert_eq!(code, 3, "a second retry: {err}");

    // cancel: a ready task is cancelled; again, or a completed one: refused.
    let (code, out, err) = board(&url, &["cancel", "report-1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("cancelled task \"report-1\""), "{out}");
    assert_eq!(get("report-1").state, TaskState::Cancelled);
    let (code, _, err) = board(&url, &["cancel", "report-1"]);
    assert_eq!(code, 3, "{err}");
    let done = runtime.block_on(async {
        let claim = adapter
            .claim("mail-ok", "w", Duration::from_secs(600))
            .await
            .unwrap();
        adapter
            .complete("mail-ok", &claim.token, b"ok".to_vec())
            .await
            .unwrap();
        adapter.get("mail-ok").await.unwrap()
    });
    let (code, _, err) = board(&url, &["cancel", "mail-ok"]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("completed"), "{err}");
    assert_eq!(get("mail-ok"), done);

    // add: a task in a queue, due later.
    let (code, _, err) = board(
        &url,
        &[
            "add",
            "later-1",
            "--queue",
            "reports",
            "--max-attempts",
            "2",
            "--run-at",
            "+1h",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let task = get("later-1");
    assert_eq!(
        (task.queue.as_deref(), task.max_attempts),
        (Some("reports"), Some(2))
    );
    assert!(task.not_before.is_some(), "{task:?}");

    // Bad input: clap's usage error, before the store.
    for args in [
        &["list", "--limit", "0"][..],
        &["list", "--limit", "501"],
        &["list", "--state", "asleep"],
        &["show", ""],
        &["retry", ""],
        &["dead", "a/b"],
        &["add", "x", "--queue", "q", "--run-at", "tomorrow"],
    ] {
        let (code, out, err) = board(&url, args);
        assert_eq!(code, 2, "{args:?}: {out}{err}");
        assert!(out.is_empty() && !err.is_empty(), "{args:?}: {out}{err}");
    }

    // A store that is down: an error, never an empty answer.
    for down in ["redis://127.0.0.1:1", "postgres://postgres@127.0.0.1:1/x"] {
        for args in [
            &["queues"][..],
            &["list"],
            &["retry", "bounce-1"],
            &["cancel", "x"],
        ] {
            let (code, out, err) = board(down, args);
            assert_eq!(code, 1, "{down} {args:?}: {out}{err}");
            assert!(out.is_empty(), "{down} {args:?}: {out}");
        }
    }
}

/// `bench --outbox --json` on `url`: one dispatch row per dispatcher count,
/// every intent dispatched, store calls per intent in a sane range; the
/// caller's-transaction figures only on PostgreSQL.
fn outbox_bench(url: &str, postgres: bool) {
    let out = coordctl(&[
        "bench",
        "--store",
        url,
        "--outbox",
        "--tasks",
        "20",
        "--workers",
        "1,3",
        "--seconds",
        "0.4",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["dispatch"].as_array().expect("dispatch rows");
    assert_eq!(rows.len(), 2, "{report}");
    for (row, n) in rows.iter().zip([1, 3]) {
        assert_eq!(row["dispatchers"], n, "{report}");
        assert_eq!(row["intents"], 20, "{report}");
        let calls = positive(row, "round_trips_per_intent", "dispatch");
        assert!(
            (2.0..6.0).contains(&calls),
            "{calls} calls per intent: {report}"
        );
        positive(row, "raw_writes_per_sec", "dispatch");
    }
    if postgres {
        let cost = &report["enqueue"];
        positive(cost, "plain_ms", "enqueue");
        positive(cost, "with_enqueue_ms", "enqueue");
        positive(cost, "with_bare_insert_ms", "enqueue");
        positive(cost, "bare_insert_ratio", "enqueue");
        positive(cost, "transactions", "enqueue");
    } else {
        assert!(report["enqueue"].is_null(), "{report}");
    }
}

#[test]
fn outbox_bench_json() {
    let scratch = Scratch::new("outbox-bench");
    outbox_bench(&scratch.sqlite_url("o.db", Some("app")), false);
    if let Some(base) = coord_conformance::server_env("COORD_TEST_POSTGRES_URL") {
        let url = StoreUrl::parse(&base)
            .unwrap()
            .with_namespace(&unique("outbox-bench"));
        outbox_bench(&url, true);
    }
}
