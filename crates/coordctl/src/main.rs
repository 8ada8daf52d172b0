//! `coordctl`: run the demo, check a store against every contract suite,
//! benchmark it, and (for operators) inspect and reconcile side effects and
//! watch, retry and cancel work-queue tasks.

mod bench;
mod board_cmd;
mod conformance;
mod console;
mod crash;
mod cron;
mod demo;
mod gc;
mod metrics;
mod outbox_cmd;
mod progress;
mod scale;
mod shell_jobs;
mod sideeffect_cmd;
mod views;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// coord's command-line tool.
#[derive(Parser)]
#[command(name = "coordctl", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Race several worker processes on shared keys of one store and check the totals.
    Demo(demo::DemoArgs),
    /// Run every contract suite against a store URL and print a pass/fail table.
    Conformance(conformance::ConformanceArgs),
    /// Measure coord on a store next to the store's raw operations and native lock (tables or --json).
    Bench(bench::BenchArgs),
    /// Internal: one worker process of `demo`.
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// List uncertain keys, in-flight side-effect intents and resource leases with their fences.
    Inspect(sideeffect_cmd::InspectArgs),
    /// Resolve an uncertain side-effect key (or, with --outbox, an outbox intent) after checking downstream facts.
    Reconcile(sideeffect_cmd::ReconcileArgs),
    /// Work queues and tasks: `queues`, `list`, `show`, `dead`; writes: `retry` (a dead task), `cancel`, `add`.
    Board(board_cmd::BoardArgs),
    /// Transactional outbox: `run` (dispatch intents to a command), `enqueue`, `status`, `resolve`.
    Outbox(outbox_cmd::OutboxArgs),
    /// Run the config's shell-command jobs as a cluster cron daemon (`cron history JOB`: recent runs).
    Cron(cron::CronArgs),
    /// Serve the web console: locks, tasks, side-effect keys, scheduler jobs and a JSON API.
    Serve(console::ServeArgs),
    /// Measure txn, snapshot, listing and bytes as a namespace grows and churns (empty, N live, N deleted before/after reclaim).
    Scale(scale::ScaleArgs),
    /// Reclaim the store's tombstones (deleted keys' version counters) in one namespace, in bounded passes.
    Gc(gc::GcArgs),
    /// Internal: one side-effect run that the crash test SIGKILLs.
    #[command(hide = true)]
    CrashChild(crash::ChildArgs),
    /// Internal: the crash test's kill loop on one store (summary table).
    #[command(hide = true)]
    CrashDrive(crash::DriveArgs),
}

/// The environment variable every `--store` falls back to: a URL with a
/// password given so stays out of the process list (`ps` shows arguments,
/// not the environment); an explicit `--store` wins. Child processes that
/// `demo` and the crash test start get their URL the same way.
pub(crate) const STORE_ENV: &str = "COORD_STORE";

/// Print what [`coord::deployment_warnings`] finds about the store `url`
/// names (e.g. a Redis primary with replicas and no `?replicas=N`), once,
/// on standard error, as `coordctl: warning: ...`.
pub(crate) async fn warn_about_deployment(url: &str) {
    for warning in coord::deployment_warnings(url).await {
        eprintln!("coordctl: warning: {warning}");
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("coordctl: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => demo::run(args).await,
            Command::DemoWorker(args) => demo::worker(args).await,
            Command::Conformance(args) => conformance::run(args).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Inspect(args) => sideeffect_cmd::inspect(args).await,
            Command::Reconcile(args) => sideeffect_cmd::reconcile(args).await,
            Command::Board(args) => board_cmd::run(args).await,
            Command::Cron(args) => cron::run(args).await,
            Command::Outbox(args) => outbox_cmd::run(args).await,
            Command::Serve(args) => console::run(args).await,
            Command::Gc(args) => gc::run(args).await,
            Command::Scale(args) => scale::run(args).await,
            Command::CrashChild(args) => crash::child(args).await,
            Command::CrashDrive(args) => crash::drive(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("coordctl: {e}");
            ExitCode::FAILURE
        }
    }
}
