//! `coordctl cron --metrics-addr`: every metric of docs/operations.md is
//! served at `GET /metrics` in Prometheus text format, with counts that
//! match what the process did, as its store's history records it.
//!
//! Workload, on a temporary SQLite file: two uncertain side-effect keys are
//! left in the namespace first; then one `coordctl cron` runs a job that
//! succeeds and one that fails, every second; the process is SIGSTOPped for
//! longer than `max_late`, so the slots it slept through are skipped as late.
//! Every wait is for a condition (with a generous deadline), never a fixed sleep.
#![cfg(target_os = "linux")]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};
use coord_backend::SystemClock;
use coord_scheduler::{RunStatus, RunStore, RunStoreOptions, SkipReason, SlotStore};

mod common;
use common::Scratch;

/// Every series name the documentation promises (a labelled one appears as
/// soon as any of its label sets does).
const NAMED: [&str; 13] = [
    "coord_txn_total",
    "coord_txn_seconds_count",
    "coord_cas_attempts_total",
    "coord_lock_acquired_total",
    "coord_lock_lost_total",
    "coord_sideeffect_total",
    "coord_sideeffect_uncertain",
    "coord_scheduler_runs_total",
    "coord_cas_conflicts_total",
    "coord_rwlock_acquired_total",
    "coord_rwlock_lost_total",
    "coord_election_won_total",
    "coord_election_lost_total",
];

/// Kills the cron process (continued first, in case it is stopped) if the test fails.
struct Cron(Child);

impl Cron {
    /// `coordctl cron --instance INSTANCE --config CONFIG` with `/metrics`
    /// on `port` and `extra` arguments, its output in the file `log`.
    fn spawn(instance: &str, config: &Path, port: u16, extra: &[&str], log: &Path) -> Cron {
        let log = std::fs::File::create(log).unwrap();
        Cron(
            Command::new(env!("CARGO_BIN_EXE_coordctl"))
                .args(["cron", "--instance", instance, "--config"])
                .arg(config)
                .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
                .args(extra)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn coordctl cron"),
        )
    }
}

impl Drop for Cron {
    fn drop(&mut self) {
        let pid = self.0.id().to_string();
        let _ = Command::new("kill")
            .args(["-CONT", &pid])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid}");
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `GET /metrics` with a bare HTTP/1.1 request; `None` while nothing listens.
fn scrape(port: u16) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).ok()?;
    let (head, body) = reply.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain"),
        "{head}"
    );
    assert!(!head.to_ascii_lowercase().contains("chunked"), "{head}");
    Some(body.to_owned())
}

/// `name{k="v",...}` (labels sorted) → value, for every sample line.
fn parse(text: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value in {line:?}"));
        let key = match series.split_once('{') {
            Some((name, labels)) => {
                let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
                labels.sort();
                format!("{name}{{{}}}", labels.join(","))
            }
            None => series.to_owned(),
        };
        out.insert(key, value);
    }
    out
}

struct Scrape(BTreeMap<String, f64>);

impl Scrape {
    fn get(&self, key: &str) -> f64 {
        self.0.get(key).copied().unwrap_or(0.0)
    }

    /// Sum over every label set of `name`.
    fn sum(&self, name: &str) -> f64 {
        self.0
            .iter()
            .filter(|(k, _)| k.as_str() == name || k.starts_with(&format!("{name}{{")))
            .map(|(_, v)| v)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.0
            .keys()
            .any(|k| k.as_str() == name || k.starts_with(&format!("{name}{{")))
    }

    fn runs(&self, result: &str) -> f64 {
        self.get(&format!(
            "coord_scheduler_runs_total{{result=\"{result}\"}}"
        ))
    }
}

/// Scrape until `done` holds (or fail after `within`, showing the last scrape).
fn wait_for(port: u16, within: Duration, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
    let deadline = Instant::now() + within;
    let mut last = String::new();
    loop {
        if let Some(text) = scrape(port) {
            let parsed = Scrape(parse(&text));
            if done(&parsed) {
                return parsed;
            }
            last = text;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last scrape:\n{last}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Leave `n` keys whose outcome is unknown in the store (apply failed, not retry-safe).
fn seed_uncertain(url: &str, n: usize) {
    runtime().block_on(async {
        let store = coord::connect(url).await.unwrap();
        let runner = Runner::new(Arc::new(SideEffectAdapter::new(store)));
        for i in 0..n {
            let action = Action::new(format!("payout/{i}"), format!("bank-{i}"));
            let failed = runner
                .execute(&action, Duration::from_secs(30), |_| async {
                    Err::<EffectResult, _>(std::io::Error::other("connection reset"))
                })
                .await;
            assert!(failed.is_err());
        }
    });
}

/// Per job: (runs claimed, runs failed, slots skipped as late), from the store's history.
fn history(url: &str) -> BTreeMap<&'static str, (u64, u64, u64)> {
    runtime().block_on(async {
        let store = RunStore::new(
            coord::connect(url).await.unwrap(),
            Arc::new(SystemClock),
            RunStoreOptions::default(),
        )
        .unwrap();
        let mut out = BTreeMap::new();
        for job in ["good", "bad"] {
            let runs = store.history(job, 1_000).await.unwrap();
            let count =
                |f: &dyn Fn(RunStatus) -> bool| runs.iter().filter(|r| f(r.status)).count() as u64;
            out.insert(
                job,
                (
                    count(&|s| !matches!(s, RunStatus::Skipped(_))),
                    count(&|s| matches!(s, RunStatus::Failed | RunStatus::TimedOut)),
                    count(&|s| s == RunStatus::Skipped(SkipReason::Late)),
                ),
            );
        }
        out
    })
}

fn write_config(dir: &Path, url: &str) -> std::path::PathBuf {
    let path = dir.join("coord.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[store]
url = "{url}"
history_size = 1000

[scheduler]
poll_interval = "100ms"

[[job]]
name = "good"
schedule = "every 1s"
hint = "require_global"
lease_ttl = "5s"
max_late = "1s"
command = "true"

[[job]]
name = "bad"
schedule = "every 1s"
hint = "require_global"
lease_ttl = "5s"
max_late = "1s"
command = "exit 3"
"#
        ),
    )
    .unwrap();
    path
}

#[test]
fn cron_serves_every_metric_with_counts_that_match_its_history() {
    let scratch = Scratch::new("coord-metrics");
    let dir = &scratch.0;
    let url = scratch.sqlite_url("coord.db", Some("metrics"));
    seed_uncertain(&url, 2);
    let config = write_config(dir, &url);
    let port = free_port();
    let cron = Cron::spawn("metered", &config, port, &[], &dir.join("cron.out"));
    let pid = cron.0.id();

    // Runs of both jobs, counted as they happen.
    let first = wait_for(port, Duration::from_secs(60), "runs", |m| {
        m.runs("ran") >= 4.0 && m.runs("failed") >= 2.0
    });
    for name in NAMED {
        assert!(first.has(name), "{name} missing from /metrics");
    }

    // Asleep for longer than max_late: the slots it slept through are late.
    let skipped_before = first.runs("skipped_late");
    signal(pid, "-STOP");
    std::thread::sleep(Duration::from_millis(3_500));
    signal(pid, "-CONT");
    wait_for(port, Duration::from_secs(60), "late slots", |m| {
        m.runs("skipped_late") >= skipped_before + 1.0
    });

    // History first, then scrapes until the counters caught up with it (a
    // run is counted just after its claim commits): never fewer than recorded.
    let before = Scrape(parse(&scrape(port).expect("scrape")));
    let recorded = history(&url);
    let claimed: u64 = recorded.values().map(|r| r.0).sum();
    let failed: u64 = recorded.values().map(|r| r.1).sum();
    let late: u64 = recorded.values().map(|r| r.2).sum();
    assert!(claimed >= 4 && failed >= 2 && late >= 1, "{recorded:?}");
    // Counted before the history read: at most what it shows.
    assert!(before.runs("ran") <= claimed as f64, "{recorded:?}");
    let after = wait_for(port, Duration::from_secs(30), "counts >= history", |m| {
        m.runs("ran") >= claimed as f64
            && m.runs("failed") >= failed as f64
            && m.runs("skipped_late") >= late as f64
    });
    // One instance: nothing was taken over and no slot waited on another.
    assert_eq!(after.runs("takeover"), 0.0);
    assert_eq!(after.runs("skipped_overlap"), 0.0);

    // Every claim, finish and skip record is a txn through the CAS engine,
    // counted when sent (attempts) and when answered (txn_total).
    let applied = after.get("coord_txn_total{outcome=\"applied\",store=\"sqlite\"}");
    assert!(
        applied >= claimed as f64,
        "applied {applied} < claims {claimed}"
    );
    let txns = after.sum("coord_txn_total");
    assert!(after.sum("coord_cas_attempts_total") >= txns);
    assert!(after.get("coord_txn_seconds_count{store=\"sqlite\"}") >= txns);
    assert!(after.get("coord_txn_seconds_bucket{le=\"+Inf\",store=\"sqlite\"}") >= txns);
    assert_eq!(
        after.get("coord_txn_total{outcome=\"indeterminate\",store=\"sqlite\"}"),
        0.0
    );

    // The two keys left uncertain before the start, counted from the store.
    assert_eq!(after.get("coord_sideeffect_uncertain"), 2.0);
    assert_eq!(after.get("coord_sideeffect_uncertain_truncated"), 0.0);
    // cron takes no locks and runs no side effects itself: registered at 0.
    assert_eq!(after.sum("coord_lock_acquired_total"), 0.0);
    assert_eq!(after.sum("coord_lock_lost_total"), 0.0);
    assert_eq!(after.sum("coord_sideeffect_total"), 0.0);
    assert!(after.has("coord_sideeffect_total"));

    // The graceful stop still works with the endpoint running.
    signal(pid, "-TERM");
    let mut cron = cron;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = cron.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "cron did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let out = std::fs::read_to_string(dir.join("cron.out")).unwrap();
    assert!(
        out.contains(&format!("metrics at http://127.0.0.1:{port}/metrics")),
        "{out}"
    );
    // Maintenance runs by default (no --reclaim-every given).
    assert!(out.contains("maintenance (reclaim) every 600s"), "{out}");
}

#[test]
fn a_busy_metrics_address_is_an_error_before_anything_runs() {
    let scratch = Scratch::new("coord-metrics-busy");
    let dir = &scratch.0;
    let url = scratch.sqlite_url("coord.db", None);
    let config = write_config(dir, &url);
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_coordctl"))
        .args(["cron", "--config"])
        .arg(&config)
        .args(["--metrics-addr", &addr.to_string()])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains(" run job="), "{stdout}");
}

/// `--reclaim-every` with `--board-retention`: the background rounds prune
/// the task completed two hours ago (by its board's clock), keep the one
/// completed now, and reclaim the tombstone the prune left; both counted on
/// `/metrics`. With `--reclaim-every 0` (no maintenance) the retention flag is refused.
#[test]
fn cron_prunes_and_reclaims_in_the_background() {
    use coord_adapters::board::{Board, BoardAdapter, BoardOptions, TaskSpec};
    use coord_backend::{Clock, ManualClock};
    let scratch = Scratch::new("coord-maintenance");
    let dir = &scratch.0;
    let url = scratch.sqlite_url("coord.db", Some("kept"));
    runtime().block_on(async {
        let store = coord::connect(&url).await.unwrap();
        let two_hours_ago = Arc::new(ManualClock::at_millis(
            SystemClock.now_millis() - 2 * 3_600_000,
        ));
        for (id, clock) in [
            ("old", two_hours_ago as Arc<dyn Clock>),
            ("new", Arc::new(SystemClock)),
        ] {
            let board = BoardAdapter::with_options(
                store.clone(),
                BoardOptions::default().with_clock(clock),
            );
            board.add(TaskSpec::new(id, b"p".to_vec())).await.unwrap();
            let claim = board
                .claim(id, "agent", Duration::from_secs(30))
                .await
                .unwrap();
            board.complete(id, &claim.token, vec![]).await.unwrap();
        }
    });
    let config = write_config(dir, &url);
    let refused = Command::new(env!("CARGO_BIN_EXE_coordctl"))
        .args(["cron", "--config"])
        .arg(&config)
        .args(["--reclaim-every", "0", "--board-retention", "1h"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--reclaim-every"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let port = free_port();
    let _cron = Cron::spawn(
        "keeper",
        &config,
        port,
        &["--reclaim-every", "1s", "--board-retention", "1h"],
        &dir.join("cron.out"),
    );
    wait_for(
        port,
        Duration::from_secs(60),
        "a prune and a reclaim",
        |m| {
            m.get("coord_pruned_total{adapter=\"board\"}") >= 1.0
                && m.sum("coord_reclaimed_total") >= 1.0
        },
    );
    let left: Vec<String> = runtime().block_on(async {
        BoardAdapter::new(coord::connect(&url).await.unwrap())
            .list()
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect()
    });
    assert_eq!(left, ["new"]);
}

/// `coordctl serve`'s `/metrics` carries the `coord_queue_*` gauges of the
/// store's default board, per queue: a queue `emails` with 2 ready tasks, 1
/// claimed, 1 dead, and a queue `sms` with 1 task waiting for its run-at.
#[test]
fn serve_exports_the_queue_gauges() {
    use coord_adapters::board::{Board, BoardAdapter, RetryPolicy, TaskSpec};
    let scratch = Scratch::new("metrics-queues");
    let url = scratch.sqlite_url("coord.db", None);
    runtime().block_on(async {
        let board = BoardAdapter::new(coord::connect(&url).await.unwrap());
        let once = RetryPolicy::attempts(1);
        let tomorrow = std::time::SystemTime::now() + Duration::from_secs(86_400);
        board
            .add_many(vec![
                TaskSpec::new("doomed", vec![])
                    .in_queue("emails")
                    .with_retry(once)
                    .with_priority(9),
                TaskSpec::new("held", vec![])
                    .in_queue("emails")
                    .with_priority(5),
                TaskSpec::new("mail-1", vec![]).in_queue("emails"),
                TaskSpec::new("mail-2", vec![]).in_queue("emails"),
                TaskSpec::new("later", vec![])
                    .in_queue("sms")
                    .with_run_at(tomorrow),
            ])
            .await
            .unwrap();
        let ttl = Duration::from_secs(600);
        let doomed = board.claim_next("emails", "w", ttl).await.unwrap().unwrap();
        assert_eq!(doomed.id, "doomed");
        board
            .fail("doomed", &doomed.token, "bounced")
            .await
            .unwrap();
        let held = board.claim_next("emails", "w", ttl).await.unwrap().unwrap();
        assert_eq!(held.id, "held");
    });
    let server = common::serve::Server::start(&url, &[]);
    let reply = server.get("/metrics");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let scrape = Scrape(parse(&reply.body));
    let expect = [
        ("coord_queue_ready{queue=\"emails\"}", 2.0),
        ("coord_queue_timed{queue=\"emails\"}", 1.0),
        ("coord_queue_depth{queue=\"emails\"}", 3.0),
        ("coord_queue_dead{queue=\"emails\"}", 1.0),
        ("coord_queue_truncated{queue=\"emails\"}", 0.0),
        ("coord_queue_ready{queue=\"sms\"}", 0.0),
        ("coord_queue_timed{queue=\"sms\"}", 1.0),
        ("coord_queue_dead{queue=\"sms\"}", 0.0),
        ("coord_queue_oldest_ready_seconds{queue=\"sms\"}", 0.0),
        ("coord_queues_truncated", 0.0),
    ];
    for (series, value) in expect {
        assert_eq!(
            scrape.0.get(series),
            Some(&value),
            "{series} in:\n{}",
            reply.body
        );
    }
    // Ready since the add, a moment ago (not a tight bound: a busy machine).
    let oldest = scrape.get("coord_queue_oldest_ready_seconds{queue=\"emails\"}");
    assert!((0.0..600.0).contains(&oldest), "{oldest}");
}
