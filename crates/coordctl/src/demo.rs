//! `coordctl demo`: several worker PROCESSES race on one store.
//!
//! Each worker does `increments` CAS increments spread over `counters`
//! shared counters (through the adapters' CAS engine, so conflicts are
//! retried from the entries a rejected txn returns) and, between them, takes
//! jobs from one work queue of `jobs` tasks (`Board::claim_next`, a
//! `job_ms` pause standing for the work, then `complete`) until the queue
//! has none ready. At the end the counters must
//! sum to workers × increments, every job must be completed by exactly one
//! worker, and the workers' own counts must agree with the store. Any
//! mismatch exits non-zero: that is a store that is not atomic across
//! processes. The table shows how the jobs spread over the workers.

use std::collections::BTreeMap;
use std::process::{ExitCode, Stdio};
use std::time::Instant;

use clap::Args;
use coord_adapters::board::{Board, BoardAdapter, BoardError, TaskSpec, TaskState};
use coord_adapters::{CasEngine, Decision};
use coord_backend::{Error, Mutation};
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
    /// Jobs in the shared work queue the workers drain.
    #[arg(long, default_value_t = 100)]
    jobs: u32,
    /// How long each job "works" (ms) between its claim and its completion.
    #[arg(long, default_value_t = 10)]
    job_ms: u64,
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
    #[arg(long)]
    job_ms: u64,
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
    jobs_done: u64,
    /// Queue entries this worker found taken by another worker first.
    lost_races: u64,
    millis: u64,
}

/// The queue the demo's jobs are in.
const DEMO_QUEUE: &str = "demo";

/// How long a worker's claim on a job lasts (it completes it at once).
const JOB_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// Jobs added per `add_many`: one txn each, within every store's key limit.
const ADD_BATCH: usize = 10;

fn counter_key(i: u32) -> String {
    format!("demo/counter/{i}")
}

fn job_id(i: u32) -> String {
    format!("job-{i:04}")
}

fn agent(worker: u32) -> String {
    format!("worker-{worker}")
}

fn board_error(e: BoardError) -> Error {
    match e {
        BoardError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
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
    let board = BoardAdapter::new(store.clone());
    let me = agent(args.id);
    let started = Instant::now();
    let mut jobs_done = 0;
    let mut queue_drained = args.jobs == 0;
    let mut step = 0;
    while step < args.increments || !queue_drained {
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
        if !queue_drained {
            match board
                .claim_next(DEMO_QUEUE, &me, JOB_LEASE)
                .await
                .map_err(board_error)?
            {
                Some(job) => {
                    tokio::time::sleep(std::time::Duration::from_millis(args.job_ms)).await;
                    board
                        .complete(&job.id, &job.token, me.clone().into_bytes())
                        .await
                        .map_err(board_error)?;
                    jobs_done += 1;
                }
                // Nothing ready: every job is done or held by a worker
                // that completes it (none fails in the demo).
                None => queue_drained = true,
            }
        }
        step += 1;
    }
    let stats = engine.stats();
    let report = WorkerReport {
        id: args.id,
        increments: u64::from(args.increments),
        conflicts_retried: stats.rejections,
        store_calls: stats.round_trips() + board.stats().round_trips(),
        jobs_done,
        lost_races: board.queue_stats().lost_races,
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

    // The jobs go into the queue before any worker starts.
    let store = coord::connect(&store_url).await?;
    let board = BoardAdapter::new(store.clone());
    let jobs: Vec<TaskSpec> = (0..args.jobs)
        .map(|i| TaskSpec::new(job_id(i), Vec::new()).in_queue(DEMO_QUEUE))
        .collect();
    for batch in jobs.chunks(ADD_BATCH) {
        board.add_many(batch.to_vec()).await.map_err(board_error)?;
    }

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
            .args(["--job-ms", &args.job_ms.to_string()])
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
    // Who completed each job, as the store says.
    let mut owners: BTreeMap<String, u64> = BTreeMap::new();
    let mut completed = 0u64;
    for i in 0..args.jobs {
        let task = board.get(&job_id(i)).await.map_err(board_error)?;
        if let TaskState::Completed { agent, .. } = task.state {
            completed += 1;
            *owners.entry(agent).or_default() += 1;
        }
    }

    println!();
    println!(
        "{:>8} {:>12} {:>18} {:>12} {:>10} {:>11} {:>9}",
        "worker",
        "increments",
        "conflicts retried",
        "store calls",
        "jobs done",
        "lost races",
        "time ms"
    );
    for r in &reports {
        println!(
            "{:>8} {:>12} {:>18} {:>12} {:>10} {:>11} {:>9}",
            r.id,
            r.increments,
            r.conflicts_retried,
            r.store_calls,
            r.jobs_done,
            r.lost_races,
            r.millis
        );
    }
    let expected_count = u64::from(args.workers) * u64::from(args.increments);
    let done: u64 = reports.iter().map(|r| r.jobs_done).sum();
    let owners_agree = reports
        .iter()
        .all(|r| owners.get(&agent(r.id)).copied().unwrap_or(0) == r.jobs_done);
    println!();
    println!("{:<28} {:>10} {:>10}", "total", "actual", "expected");
    let rows = [
        ("counter increments", counted, expected_count),
        ("jobs completed (store)", completed, u64::from(args.jobs)),
        ("jobs done (workers)", done, u64::from(args.jobs)),
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
        println!("\nall totals match: every increment counted once, every job done by exactly one worker");
        let busy = reports.iter().filter(|r| r.jobs_done > 0).count();
        println!(
            "the {} jobs spread over {busy} of {} workers",
            args.jobs, args.workers
        );
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
