//! `coordctl demo`: several worker PROCESSES race on one store.
//!
//! Each worker does `increments` CAS increments spread over `counters`
//! shared counters (through the adapters' CAS engine, so conflicts are
//! retried from the entries a rejected txn returns) and tries to claim each
//! of `jobs` shared jobs (create-if-missing). At the end the counters must
//! sum to workers × increments and every job must have exactly one owner.
//! Any mismatch exits non-zero: that is a store that is not atomic across
//! processes.

use std::collections::BTreeMap;
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use clap::Args;
use coord_adapters::{CasEngine, Decision};
use coord_backend::{Assert, Error, Mutation};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

/// Arguments of `coordctl demo`.
#[derive(Args)]
pub(crate) struct DemoArgs {
    /// Store URL; default: a fresh SQLite file in a temporary directory (the embedded default).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: Option<String>,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// CAS increments per worker.
    #[arg(long, default_value_t = 250)]
    increments: u32,
    /// Shared counters the increments are spread over.
    #[arg(long, default_value_t = 3)]
    counters: u32,
    /// Shared jobs every worker tries to claim.
    #[arg(long, default_value_t = 100)]
    jobs: u32,
}

/// Arguments of one worker (internal).
#[derive(Args)]
pub(crate) struct WorkerArgs {
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    #[arg(long)]
    id: u32,
    #[arg(long)]
    increments: u32,
    #[arg(long)]
    counters: u32,
    #[arg(long)]
    jobs: u32,
    /// Unix time (ms) at which every worker starts, so they really race.
    #[arg(long)]
    start_at_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct WorkerReport {
    id: u32,
    increments: u64,
    conflicts_retried: u64,
    store_calls: u64,
    claims_won: u64,
    millis: u64,
}

fn counter_key(i: u32) -> String {
    format!("demo/counter/{i}")
}

fn job_key(i: u32) -> String {
    format!("demo/job/{i:04}")
}

/// One worker: increments and claims, then one JSON line on stdout.
pub(crate) async fn worker(args: WorkerArgs) -> Result<ExitCode, Error> {
    let store = coord::connect(&args.store).await?;
    let engine = CasEngine::new(store.clone());
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    if args.start_at_ms > now_ms {
        tokio::time::sleep(std::time::Duration::from_millis(args.start_at_ms - now_ms)).await;
    }
    let started = Instant::now();
    let mut claims_won = 0;
    let mut claim_calls = 0;
    let total = args.increments.max(args.jobs);
    for step in 0..total {
        if step < args.increments {
            let key = counter_key((step + args.id) % args.counters);
            engine
                .decide(std::slice::from_ref(&key), |view| {
                    let n = match view.value(&key) {
                        None => 0,
                        Some(bytes) => std::str::from_utf8(bytes)
                            .ok()
                            .and_then(|s| s.parse::<u64>().ok())
                            .ok_or_else(|| Error::malformed(&key, "not a decimal counter"))?,
                    };
                    Ok::<_, Error>(Decision::Commit {
                        mutations: vec![Mutation::put(key.clone(), (n + 1).to_string())],
                        then: (),
                    })
                })
                .await?;
        }
        if step < args.jobs {
            // Start at a different job per worker so claims really race.
            let job = job_key((step + args.id * 7) % args.jobs);
            claim_calls += 1;
            let out = store
                .txn(
                    &[Assert::missing(job.clone())],
                    &[Mutation::put(job, format!("worker-{}", args.id))],
                )
                .await?;
            if out.applied {
                claims_won += 1;
            }
        }
    }
    let stats = engine.stats();
    let report = WorkerReport {
        id: args.id,
        increments: u64::from(args.increments),
        conflicts_retried: stats.rejections,
        store_calls: stats.round_trips() + claim_calls,
        claims_won,
        millis: started.elapsed().as_millis() as u64,
    };
    println!(
        "{}",
        serde_json::to_string(&report).map_err(|e| Error::Config(e.to_string()))?
    );
    Ok(ExitCode::SUCCESS)
}

/// The demo: spawn workers, wait, check totals, print a table.
pub(crate) async fn run(args: DemoArgs) -> Result<ExitCode, Error> {
    if args.workers == 0 || args.counters == 0 {
        return Err(Error::Config(
            "--workers and --counters must be at least 1".into(),
        ));
    }
    let (store_url, _temp_dir) = match args.store.clone() {
        Some(url) => (url, None),
        None => {
            let dir = std::env::temp_dir().join(format!("coord-demo-{:08x}", rand_u32()));
            std::fs::create_dir_all(&dir)
                .map_err(|e| Error::Config(format!("cannot create {}: {e}", dir.display())))?;
            let url = format!("sqlite://{}", dir.join("coord.db").display());
            (url, Some(TempDir(dir)))
        }
    };
    // A fresh namespace per run, so a reused store starts from zero.
    let parsed = coord_backend::StoreUrl::parse(&store_url)?;
    let store_url = parsed.with_namespace(&format!("demo-{:08x}", rand_u32()));
    println!(
        "coord demo: {} worker processes on {}",
        args.workers,
        parsed.without_namespace()
    );

    let exe = std::env::current_exe().map_err(|e| Error::Config(e.to_string()))?;
    let bar = crate::progress::bar(u64::from(args.workers), "workers racing");
    let mut children = Vec::new();
    // Workers connect first, then all start at the same instant.
    let start_at_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
        + 1_000
        + 100 * u64::from(args.workers);
    for id in 0..args.workers {
        let child = tokio::process::Command::new(&exe)
            .arg("demo-worker")
            .env(crate::STORE_ENV, &store_url)
            .args(["--id", &id.to_string()])
            .args(["--increments", &args.increments.to_string()])
            .args(["--counters", &args.counters.to_string()])
            .args(["--jobs", &args.jobs.to_string()])
            .args(["--start-at-ms", &start_at_ms.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Config(format!("cannot start a worker process: {e}")))?;
        children.push(child);
    }
    let mut reports = Vec::new();
    let mut failed_workers = 0;
    for mut child in children {
        let mut out = String::new();
        if let Some(mut stdout) = child.stdout.take() {
            let _ = stdout.read_to_string(&mut out).await;
        }
        let status = child
            .wait()
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
        bar.inc(1);
        match serde_json::from_str::<WorkerReport>(out.trim()) {
            Ok(report) if status.success() => reports.push(report),
            _ => failed_workers += 1,
        }
    }
    bar.finish_and_clear();

    let store = coord::connect(&store_url).await?;
    let counter_keys: Vec<String> = (0..args.counters).map(counter_key).collect();
    let counters = store.snapshot(&counter_keys).await?;
    let counted: u64 = counters
        .iter()
        .map(|e| {
            e.value
                .as_deref()
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    let claimed = store.keys("demo/job/").await?;
    let mut owners: BTreeMap<String, u64> = BTreeMap::new();
    for chunk in claimed.chunks(100) {
        for entry in store.snapshot(chunk).await? {
            if let Some(v) = entry.value {
                *owners
                    .entry(String::from_utf8_lossy(&v).into_owned())
                    .or_default() += 1;
            }
        }
    }

    println!();
    println!(
        "{:>8} {:>12} {:>18} {:>12} {:>12} {:>9}",
        "worker", "increments", "conflicts retried", "store calls", "claims won", "time ms"
    );
    for r in &reports {
        println!(
            "{:>8} {:>12} {:>18} {:>12} {:>12} {:>9}",
            r.id, r.increments, r.conflicts_retried, r.store_calls, r.claims_won, r.millis
        );
    }
    let expected_count = u64::from(args.workers) * u64::from(args.increments);
    let won: u64 = reports.iter().map(|r| r.claims_won).sum();
    let owners_agree = reports.iter().all(|r| {
        owners
            .get(&format!("worker-{}", r.id))
            .copied()
            .unwrap_or(0)
            == r.claims_won
    });
    println!();
    println!("{:<28} {:>10} {:>10}", "total", "actual", "expected");
    let rows = [
        ("counter increments", counted, expected_count),
        (
            "jobs claimed (store)",
            claimed.len() as u64,
            u64::from(args.jobs),
        ),
        ("claims won (workers)", won, u64::from(args.jobs)),
        (
            "workers finished",
            reports.len() as u64,
            u64::from(args.workers),
        ),
    ];
    let mut ok = failed_workers == 0 && owners_agree;
    for (name, actual, expected) in rows {
        let mark = if actual == expected { "ok" } else { "MISMATCH" };
        ok &= actual == expected;
        println!("{name:<28} {actual:>10} {expected:>10}  {mark}");
    }
    if !owners_agree {
        println!("owners recorded in the store disagree with what workers report: MISMATCH");
    }
    if ok {
        println!("\nall totals match: every increment counted once, every job claimed by exactly one worker");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nTOTALS DO NOT MATCH: this store is not atomic across processes");
        Ok(ExitCode::FAILURE)
    }
}

fn rand_u32() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

/// Removes the demo's temporary directory at the end.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
