//! `coordctl cron`: a cluster cron daemon for the shell-command jobs of a
//! TOML config, and `coordctl cron history JOB`: the recent runs of a job.
//!
//! # Contract
//!
//! - Every `[[job]]` of the config must have a `command`; it runs through
//!   [`crate::shell_jobs::command_handler`] (`sh -c COMMAND`, with `COORD_JOB`,
//!   `COORD_SLOT_MS`, `COORD_INSTANCE`, `COORD_MANUAL` in its environment).
//! - Any number of `coordctl cron` processes started on the same `[store]`
//!   (and namespace) run each `(job, slot)` of a coordinated job once between
//!   them (`require_global` / `prefer_global` with a store); `node_local`
//!   jobs run on every instance.
//! - Each run ends with ONE line on stdout: `<now> run job=.. slot=..
//!   instance=.. outcome=.. duration=..ms takeovers=.. attempt=..`
//!   (`outcome=interrupted` when a timeout or the shutdown stopped it; a job
//!   with `max_attempts` prints one line per attempt). The scheduler's own warnings
//!   (lost leases, store failures; with `COORD_LOG=info` also every slot
//!   skipped as late) go to stderr; `COORD_LOG` takes a filter such as
//!   `info` or `warn,coord_scheduler=debug`.
//! - SIGINT / SIGTERM stop it gracefully: no new slots are claimed, running
//!   commands are stopped and their leases released through
//!   [`Scheduler::shutdown`], so another instance takes those slots over at
//!   once (within `max_late`). A second signal exits at once (code 130).
//!
//! # Boundary
//!
//! Exactly-once is about *starting* a slot's command. A process that is
//! killed (or stalls longer than the lease) after its command did its work
//! but before the run was recorded finished has its slot taken over when the
//! lease expires, and the command runs again: commands that must not repeat
//! need their own idempotence (or a fenced downstream).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::shell_jobs::{command_handler, command_jobs};
use crate::views::scheduler_error;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand};
use coord_adapters::maintenance::MaintenanceOptions;
use coord_backend::{Error, SystemClock};
use coord_scheduler::{
    handler, validate_job_name, Config, Handler, LockingHint, RunContext, RunStore, Scheduler,
    SlotStore, Tz,
};

/// Arguments of `coordctl cron`.
#[derive(Debug, Args)]
#[command(
    after_help = "Without a subcommand, runs the config's jobs until SIGINT/SIGTERM.\n\
    Start the same command in several processes (or hosts) on one store: each slot runs once.\n\n\
    Examples:\n  \
    coordctl cron --config examples/coord.toml --instance node-a\n  \
    coordctl cron history tick --config examples/coord.toml --limit 10"
)]
pub(crate) struct CronArgs {
    #[command(subcommand)]
    action: Option<CronAction>,
    /// The TOML config: `[store]`, `[scheduler]` and `[[job]]`s with a `command`.
    #[arg(long, global = true, value_name = "FILE", default_value = "coord.toml")]
    config: PathBuf,
    /// This instance's name in logs and history (default: `[scheduler] instance_id`,
    /// else `$HOSTNAME-<random>`).
    #[arg(long, value_name = "NAME")]
    instance: Option<String>,
    /// Serve the process's metrics in Prometheus text format at
    /// `http://ADDR/metrics` (e.g. 127.0.0.1:9464; docs/operations.md). Default: none.
    #[arg(long, value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Reclaim the namespace's tombstones (what deletes and forgotten
    /// claims leave) in the background every DURATION, like `coordctl gc`,
    /// so storage stays bounded by the live records. Default `10m`; `0`
    /// turns it off (then run `coordctl gc` yourself). A round that meets
    /// older clients (docs/operations.md, "Bounded storage") is refused and
    /// logged, and tried again next round.
    #[arg(long, value_name = "DURATION", value_parser = coord_scheduler::parse_duration, default_value = "10m")]
    reclaim_every: std::time::Duration,
    /// Each maintenance round first prunes side-effect keys completed
    /// longer ago than this (as `coordctl gc --side-effects-retention`).
    /// Default: keep them (at-most-once holds forever).
    #[arg(long, value_name = "DURATION", value_parser = crate::gc::retention)]
    side_effects_retention: Option<std::time::Duration>,
    /// Each maintenance round first prunes board tasks (prefix `board/`)
    /// completed longer ago than this (as `coordctl gc --board-retention`).
    /// Default: keep them.
    #[arg(long, value_name = "DURATION", value_parser = crate::gc::retention)]
    board_retention: Option<std::time::Duration>,
}

#[derive(Debug, Subcommand)]
enum CronAction {
    /// Print the recent runs of JOB from every instance, newest slot first.
    History(HistoryArgs),
}

#[derive(Debug, Args)]
struct HistoryArgs {
    /// The job's name.
    job: String,
    /// Runs to show (the store keeps `[store] history_size`, default 50).
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Print one JSON document instead of the table (schema: docs/console.md).
    #[arg(long)]
    json: bool,
}

fn config_error(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("{}: {e}", path.display()))
}

/// `coordctl cron [history JOB]`.
pub(crate) async fn run(args: CronArgs) -> Result<ExitCode, Error> {
    let text = std::fs::read_to_string(&args.config).map_err(|e| config_error(&args.config, e))?;
    let config = Config::from_toml_str(&text).map_err(|e| config_error(&args.config, e))?;
    match args.action {
        None => {
            if args.reclaim_every.is_zero()
                && (args.side_effects_retention.is_some() || args.board_retention.is_some())
            {
                return Err(Error::Config(
                    "--side-effects-retention and --board-retention prune in the maintenance \
                     rounds, which --reclaim-every 0 turns off"
                        .to_owned(),
                ));
            }
            let maintenance = Some(args.reclaim_every)
                .filter(|every| !every.is_zero())
                .map(|every| {
                    let mut options = MaintenanceOptions::default().with_every(every);
                    if let Some(retention) = args.side_effects_retention {
                        options = options.with_side_effects_retention(retention);
                    }
                    if let Some(retention) = args.board_retention {
                        options = options.with_board_retention(retention);
                    }
                    options
                });
            daemon(
                &args.config,
                config,
                args.instance,
                args.metrics_addr,
                maintenance,
            )
            .await
        }
        Some(CronAction::History(history_args)) => {
            history(&args.config, &config, history_args).await
        }
    }
}

/// The store a config names, and how to show it (credentials hidden,
/// SQLite paths made absolute so several processes can check they share one file).
async fn open_store(config: &Config) -> Result<Option<(Arc<RunStore>, String)>, Error> {
    let Some(store) = &config.store else {
        return Ok(None);
    };
    let url = &store.url;
    let backend = coord::connect(&url.with_namespace(url.namespace())).await?;
    crate::warn_about_deployment(&url.with_namespace(url.namespace())).await;
    let run_store = RunStore::new(backend, Arc::new(SystemClock), store.options.clone())
        .map_err(scheduler_error)?;
    let shown = if url.scheme() == "sqlite" && Path::new(url.body()).is_relative() {
        let absolute = std::env::current_dir()
            .map(|d| d.join(url.body()))
            .unwrap_or_else(|_| PathBuf::from(url.body()));
        format!("sqlite://{}", absolute.display())
    } else {
        coord_backend::redact::url(url.without_namespace())
    };
    Ok(Some((
        Arc::new(run_store),
        format!("{shown} (namespace {})", url.namespace()),
    )))
}

pub(crate) fn fmt_time(ms: u64, tz: Option<Tz>) -> String {
    let Some(utc) = i64::try_from(ms)
        .ok()
        .and_then(DateTime::<Utc>::from_timestamp_millis)
    else {
        return format!("{ms}ms");
    };
    match tz {
        Some(tz) => utc
            .with_timezone(&tz)
            .format("%Y-%m-%dT%H:%M:%S%.3f%:z")
            .to_string(),
        None => utc.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
    }
}

fn now_ms() -> u64 {
    u64::try_from(Utc::now().timestamp_millis()).unwrap_or(0)
}

fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) || ms == 0 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms / 1000)
    }
}

fn hint_name(hint: LockingHint) -> &'static str {
    match hint {
        LockingHint::NodeLocal => "node_local",
        LockingHint::RequireGlobal => "require_global",
        LockingHint::PreferGlobal => "prefer_global",
        _ => "other",
    }
}

/// Prints the run's line when it ends; a run dropped unfinished (timeout or
/// shutdown aborted it) still gets its line, so every started run shows up.
struct RunLine {
    ctx: RunContext,
    tz: Option<Tz>,
    started: Instant,
    outcome: Option<String>,
}

impl Drop for RunLine {
    fn drop(&mut self) {
        let outcome = self
            .outcome
            .take()
            .unwrap_or_else(|| "interrupted (timeout or shutdown)".into());
        let lost = if self.ctx.is_lease_lost() {
            " lease_lost=true"
        } else {
            ""
        };
        println!(
            "{} run job={} slot={} instance={} outcome={outcome} duration={}ms takeovers={} attempt={}{lost}",
            fmt_time(now_ms(), None),
            self.ctx.job,
            fmt_time(self.ctx.slot, self.tz),
            self.ctx.instance,
            self.started.elapsed().as_millis(),
            self.ctx.takeovers,
            self.ctx.attempt,
        );
    }
}

fn logged(inner: Handler, tz: Option<Tz>) -> Handler {
    handler(move |ctx: RunContext| {
        let inner = inner.clone();
        async move {
            let mut line = RunLine {
                ctx: ctx.clone(),
                tz,
                started: Instant::now(),
                outcome: None,
            };
            let result = inner(ctx).await;
            line.outcome = Some(match &result {
                Ok(()) => "succeeded".to_owned(),
                Err(e) => format!("failed ({e})"),
            });
            result
        }
    })
}

fn init_logging() {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;

    let filter = std::env::var("COORD_LOG")
        .ok()
        .and_then(|s| match s.parse::<Targets>() {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("coordctl: ignoring COORD_LOG={s:?}: {e}");
                None
            }
        })
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::WARN));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_filter(filter),
        )
        .try_init();
}

/// SIGINT and SIGTERM, registered before the scheduler starts so an early
/// signal is never the default (immediate) death.
pub(crate) struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn register() -> Result<Self, Error> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let io = |e: std::io::Error| Error::Config(format!("cannot handle signals: {e}"));
            Ok(Signals {
                term: signal(SignalKind::terminate()).map_err(io)?,
                int: signal(SignalKind::interrupt()).map_err(io)?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    pub(crate) async fn next(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

async fn daemon(
    path: &Path,
    config: Config,
    instance: Option<String>,
    metrics_addr: Option<std::net::SocketAddr>,
    maintenance: Option<MaintenanceOptions>,
) -> Result<ExitCode, Error> {
    init_logging();
    // Before the store is opened, so its first txns are counted too.
    let metrics_handle = metrics_addr
        .map(|_| crate::metrics::install_recorder())
        .transpose()?;
    let mut signals = Signals::register()?;
    if config.jobs.is_empty() {
        return Err(config_error(path, "no [[job]] to run"));
    }
    // Refuses a job without a command, naming it.
    command_jobs(&config).map_err(|e| config_error(path, e))?;
    let mut options = config.scheduler.options();
    if let Some(name) = instance {
        if name.is_empty() || name.len() > 128 {
            return Err(Error::Config("--instance must be 1 to 128 bytes".into()));
        }
        options.instance_id = name;
    }
    // A signal while the store is still being reached (it may be down and
    // retried) must stop the process too: the handlers are registered.
    let store = tokio::select! {
        store = open_store(&config) => store?,
        signal = signals.next() => {
            eprintln!("coordctl cron: {signal} while connecting to the store: exiting");
            return Ok(ExitCode::from(130));
        }
    };
    if let (Some(addr), Some(handle)) = (metrics_addr, metrics_handle) {
        let gauge = store.as_ref().map(|(s, _)| {
            Arc::new(crate::metrics::UncertainGauge::new(
                s.engine().backend().clone(),
            ))
        });
        let (bound, _task) =
            crate::metrics::serve(addr, crate::metrics::router(handle, gauge)).await?;
        println!("coordctl cron: metrics at http://{bound}/metrics");
    }
    // Dropped when the daemon returns, which stops it.
    let _maintenance = match (maintenance, &store) {
        (Some(options), Some((s, _))) => {
            let prune = match (options.side_effects_retention, options.board_retention) {
                (None, None) => "",
                _ => "prune, ",
            };
            println!(
                "coordctl cron: maintenance ({prune}reclaim) every {}",
                fmt_duration(options.every)
            );
            Some(coord_adapters::maintenance::spawn_maintenance(
                s.engine().backend().clone(),
                options,
            ))
        }
        (None, Some(_)) => {
            println!("coordctl cron: no maintenance (--reclaim-every 0): run `coordctl gc`");
            None
        }
        _ => None,
    };
    let scheduler = Scheduler::new(
        store.as_ref().map(|(s, _)| s.clone() as Arc<dyn SlotStore>),
        Arc::new(SystemClock),
        options,
    );
    for job in &config.jobs {
        let Some(command) = &job.command else {
            continue;
        };
        let tz = job.schedule.time_zone();
        scheduler
            .add_job(job.job(logged(command_handler(command.clone()), tz)))
            .map_err(|e| config_error(path, e))?;
    }

    match &store {
        Some((_, shown)) => println!(
            "coordctl cron: instance {} on {shown}, {} job(s)",
            scheduler.instance_id(),
            config.jobs.len()
        ),
        None => println!(
            "coordctl cron: instance {} WITHOUT a store: every instance runs every slot, {} job(s)",
            scheduler.instance_id(),
            config.jobs.len()
        ),
    }
    let width = config.jobs.iter().map(|j| j.name.len()).max().unwrap_or(0);
    for job in &config.jobs {
        let o = &job.options;
        println!(
            "  {:width$}  {:28}  {:14}  lease {}  max_late {}{}",
            job.name,
            job.schedule.to_string(),
            hint_name(o.hint),
            fmt_duration(o.lease_ttl),
            fmt_duration(o.max_late),
            o.timeout
                .map(|t| format!("  timeout {}", fmt_duration(t)))
                .unwrap_or_default(),
        );
    }
    println!("stop with Ctrl-C or SIGTERM (running leases are released for another instance)");

    scheduler.start();
    let first = signals.next().await;
    println!(
        "{} {first}: stopping (no new claims; running commands are stopped and their leases released)",
        fmt_time(now_ms(), None)
    );
    tokio::select! {
        _ = scheduler.shutdown() => {}
        second = signals.next() => {
            eprintln!("coordctl cron: second signal ({second}): exiting without waiting for the shutdown");
            return Ok(ExitCode::from(130));
        }
    }
    println!(
        "{} stopped: instance {}",
        fmt_time(now_ms(), None),
        scheduler.instance_id()
    );
    Ok(ExitCode::SUCCESS)
}

fn fmt_run_duration(ms: Option<u64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms < 10_000 => format!("{ms} ms"),
        Some(ms) => format!("{:.1} s", ms as f64 / 1000.0),
    }
}

async fn history(path: &Path, config: &Config, args: HistoryArgs) -> Result<ExitCode, Error> {
    if args.limit == 0 {
        return Err(Error::Config("--limit must be at least 1".into()));
    }
    validate_job_name(&args.job).map_err(scheduler_error)?;
    // Reading history must not create an empty SQLite file (a typo'd path
    // would otherwise look like a store with no runs).
    if let Some(store) = config.store.as_ref().filter(|s| s.url.scheme() == "sqlite") {
        let file = Path::new(store.url.body());
        if !file.exists() {
            return Err(config_error(
                path,
                format!(
                    "the store file {} does not exist (no run recorded yet?)",
                    file.display()
                ),
            ));
        }
    }
    let Some((store, shown)) = open_store(config).await? else {
        return Err(config_error(
            path,
            "no [store]: history is kept in the store (local-only runs are not recorded)",
        ));
    };
    let tz = match config.jobs.iter().find(|j| j.name == args.job) {
        Some(job) => {
            if job.options.hint == LockingHint::NodeLocal {
                eprintln!(
                    "note: {:?} is node_local: its runs never touch the store, so they are not in history",
                    args.job
                );
            }
            job.schedule.time_zone()
        }
        None => {
            eprintln!(
                "note: no job {:?} in {}; showing what the store holds for that name",
                args.job,
                path.display()
            );
            None
        }
    };
    let view = crate::views::runs(&store, &args.job, args.limit, tz).await?;
    if args.json {
        crate::views::print_json(&view)?;
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "history of {:?} on {shown}: {} run(s), newest slot first, times in {}",
        args.job,
        view.runs.len(),
        view.time_zone
    );
    if view.runs.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let header = [
        "SLOT",
        "INSTANCE",
        "STATUS",
        "STARTED",
        "DURATION",
        "TAKEOVERS",
        "ATTEMPTS",
        "MESSAGE",
    ];
    let rows: Vec<[String; 8]> = view
        .runs
        .iter()
        .map(|r| {
            let mut status = r.status.clone();
            if let Some(why) = r.skip_reason {
                status.push_str(&format!(" ({why})"));
            }
            if r.lease_expired {
                status.push_str(" (lease expired)");
            }
            if r.manual {
                status.push_str(" (manual)");
            }
            [
                r.slot.clone(),
                r.instance.clone(),
                status,
                r.started.clone(),
                fmt_run_duration(r.duration_ms),
                r.takeovers.to_string(),
                r.attempts.to_string(),
                r.message.clone().unwrap_or_default(),
            ]
        })
        .collect();
    // The message column only when some run has one.
    let columns = if rows.iter().any(|r| !r[7].is_empty()) {
        8
    } else {
        7
    };
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:w$}  ", w = widths[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(&header[..columns]);
    for row in &rows {
        line(&row.each_ref().map(String::as_str)[..columns]);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        cron: CronArgs,
    }

    #[test]
    fn command_line() {
        let daemon =
            Cli::try_parse_from(["cron", "--config", "c.toml", "--instance", "n1"]).unwrap();
        assert!(daemon.cron.action.is_none());
        assert_eq!(daemon.cron.instance.as_deref(), Some("n1"));
        assert_eq!(daemon.cron.config, PathBuf::from("c.toml"));
        let history = Cli::try_parse_from([
            "cron", "history", "tick", "--config", "c.toml", "--limit", "5",
        ])
        .unwrap();
        match history.cron.action {
            Some(CronAction::History(h)) => assert_eq!((h.job.as_str(), h.limit), ("tick", 5)),
            other => panic!("{other:?}"),
        }
        assert_eq!(history.cron.config, PathBuf::from("c.toml"));
        assert_eq!(
            Cli::try_parse_from(["cron"]).unwrap().cron.config,
            PathBuf::from("coord.toml")
        );
        assert!(
            Cli::try_parse_from(["cron", "history"]).is_err(),
            "JOB is required"
        );
    }

    /// The README's example config stays valid: every job runnable by `coordctl cron`.
    #[test]
    fn example_config_is_valid() {
        let config = Config::from_toml_str(include_str!("../../../examples/coord.toml")).unwrap();
        let store = config.store.as_ref().expect("a [store]");
        assert_eq!(store.url.scheme(), "sqlite");
        assert_eq!(command_jobs(&config).unwrap().len(), 3);
        let hints: Vec<_> = config.jobs.iter().map(|j| j.options.hint).collect();
        assert_eq!(
            hints,
            [
                LockingHint::RequireGlobal,
                LockingHint::PreferGlobal,
                LockingHint::NodeLocal
            ]
        );
        assert!(config.jobs[1].schedule.time_zone().is_some());
    }

    #[test]
    fn times_in_utc_and_in_a_zone() {
        assert_eq!(fmt_time(0, None), "1970-01-01T00:00:00.000Z");
        let paris: Tz = "Europe/Paris".parse().unwrap();
        assert_eq!(
            fmt_time(1_700_000_000_000, Some(paris)),
            "2023-11-14T23:13:20.000+01:00"
        );
        assert_eq!(fmt_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(fmt_duration(Duration::from_secs(30)), "30s");
    }
}
