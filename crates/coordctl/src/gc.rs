//! `coordctl gc --store URL`: in one namespace, prune completed records
//! past their retention (`--side-effects-retention`, `--board-retention`;
//! default: keep them, see `coord_adapters::retention`), then reclaim the
//! store's tombstones
//! (see `coord_backend::reclaim`), each in bounded passes.
//!
//! Safe with several instances (and every application) running at once: a
//! prune removes a record only in a txn asserting it as it read it, and a
//! reclaim only removes what reads as missing and raises the floor with it,
//! atomically, so nothing a reader or writer sees changes but the version
//! a re-created key starts at.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use coord_adapters::board::{BoardAdapter, BoardOptions};
use coord_adapters::maintenance::{self, MaintenanceOptions};
use coord_adapters::retention::PruneOptions;
use coord_adapters::sideeffect::SideEffectAdapter;
use coord_backend::Error;
use serde::Serialize;

/// Arguments of `coordctl gc`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Remove side-effect keys completed longer ago than this (`24h`, `7d`,
    /// `90m`; at least one minute). A key retried after its record went runs
    /// again. Default: keep every completed key (at-most-once forever).
    #[arg(long, value_parser = retention)]
    side_effects_retention: Option<std::time::Duration>,
    /// Remove board tasks completed longer ago than this (at least one
    /// minute). Tasks waiting on a removed task stay claimable; an id added
    /// again is a new task. Default: keep every completed task.
    #[arg(long, value_parser = retention)]
    board_retention: Option<std::time::Duration>,
    /// The key prefix of a board to prune (repeat for several boards;
    /// default `board/`, the boards' default).
    #[arg(long = "board-prefix", value_name = "PREFIX")]
    board_prefixes: Vec<String>,
    /// Records (and tombstones) one pass removes at most (each pass is one bounded call).
    #[arg(long, default_value_t = 1000)]
    per_pass: usize,
    /// Passes at most in this run (0: until nothing is left).
    #[arg(long, default_value_t = 0)]
    max_passes: u64,
    /// You stopped or upgraded every client older than this coordctl: lets
    /// the reclaim go on in a namespace holding records from before clients
    /// announced their storage format (once; docs/operations.md, "Bounded
    /// storage"). Announced older clients still refuse it.
    #[arg(long)]
    older_clients_stopped: bool,
    /// Say what would run, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON document instead of text:
    /// `{"store", "namespace", "dry_run", "pruned", "pruned_tasks", "passes", "removed", "more",
    /// "candidates", "candidate_tasks", "seconds"}` (`pruned`: completed side-effect keys removed;
    /// `pruned_tasks`: completed board tasks removed; `removed`: tombstones reclaimed;
    /// with `--dry-run`, `candidates` / `candidate_tasks`: how many past their retention a
    /// prune would look at, an upper bound).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct GcReport {
    store: String,
    namespace: String,
    dry_run: bool,
    pruned: u64,
    pruned_tasks: u64,
    passes: u64,
    removed: u64,
    more: bool,
    /// Dry run: completed side-effect keys past the retention (upper bound).
    candidates: u64,
    /// Dry run: completed board tasks past the retention (upper bound).
    candidate_tasks: u64,
    seconds: f64,
}

pub(crate) async fn run(args: GcArgs) -> Result<ExitCode, Error> {
    if args.per_pass == 0 {
        return Err(Error::Config("--per-pass must be at least 1".to_owned()));
    }
    if !args.board_prefixes.is_empty() && args.board_retention.is_none() {
        return Err(Error::Config(
            "--board-prefix needs --board-retention".to_owned(),
        ));
    }
    let url = coord_backend::StoreUrl::parse(&args.store)?;
    let store = coord::connect(&args.store).await?;
    let started = Instant::now();
    let mut report = GcReport {
        store: url.without_namespace().to_string(),
        namespace: store.namespace().to_owned(),
        dry_run: args.dry_run,
        pruned: 0,
        pruned_tasks: 0,
        passes: 0,
        removed: 0,
        more: false,
        candidates: 0,
        candidate_tasks: 0,
        seconds: 0.0,
    };
    if args.dry_run {
        count_candidates(&args, &store, &mut report).await?;
    } else {
        // Prune first (it writes tombstones), then reclaim: one maintenance round.
        let mut options = MaintenanceOptions::default()
            .with_per_pass(args.per_pass)
            .with_max_passes(match args.max_passes {
                0 => u32::MAX,
                n => u32::try_from(n).unwrap_or(u32::MAX),
            });
        if let Some(retention) = args.side_effects_retention {
            options = options.with_side_effects_retention(retention);
        }
        if let Some(retention) = args.board_retention {
            options = options.with_board_retention(retention);
        }
        options = options
            .with_board_prefixes(board_prefixes(&args))
            .with_older_clients_stopped(args.older_clients_stopped);
        let round = maintenance::run_once(&store, &options).await?;
        report.pruned = round.pruned;
        report.pruned_tasks = round.pruned_tasks;
        report.removed = round.reclaimed;
        report.passes = round.reclaim_passes;
        report.more = round.more;
    }
    report.seconds = started.elapsed().as_secs_f64();
    crate::views::print_report(&report, args.json, |report| print_text(&args, report))?;
    Ok(ExitCode::SUCCESS)
}

/// The text report of a round (or of a dry run).
fn print_text(args: &GcArgs, report: &GcReport) {
    if args.dry_run {
        println!(
            "coordctl gc (dry run): would {}reclaim the tombstones of namespace {:?} on {}, \
             at most {} per pass{}; nothing changed",
            what_is_pruned(args, report),
            report.namespace,
            report.store,
            args.per_pass,
            match args.max_passes {
                0 => String::new(),
                n => format!(", {n} passes"),
            }
        );
    } else {
        println!(
            "coordctl gc: namespace {:?} on {}: {} completed side-effect key(s) and \
             {} completed task(s) pruned, {} tombstone(s) reclaimed in {} pass(es), {:.2} s{}",
            report.namespace,
            report.store,
            report.pruned,
            report.pruned_tasks,
            report.removed,
            report.passes,
            report.seconds,
            if report.more {
                "; more are left (run again)"
            } else {
                ""
            }
        );
    }
}

/// The board prefixes to prune (`board/`, the boards' default, unless given).
fn board_prefixes(args: &GcArgs) -> Vec<String> {
    if args.board_prefixes.is_empty() {
        vec![BoardOptions::default().key_prefix]
    } else {
        args.board_prefixes.clone()
    }
}

/// Dry run: count what each prune would look at (the index entries past
/// the retention), writing nothing.
async fn count_candidates(
    args: &GcArgs,
    store: &std::sync::Arc<dyn coord_backend::Backend>,
    report: &mut GcReport,
) -> Result<(), Error> {
    let counting = |what: &str, e: &dyn std::fmt::Display| Error::Unavailable {
        message: format!("counting {what} to prune: {e}"),
        source: None,
    };
    if let Some(retention) = args.side_effects_retention {
        let adapter = SideEffectAdapter::new(store.clone());
        let due = adapter
            .prune_candidates(&PruneOptions::after(retention))
            .await
            .map_err(|e| counting("side-effect keys", &e))?;
        report.candidates = due.removed;
        report.more |= due.more;
    }
    if let Some(retention) = args.board_retention {
        for prefix in board_prefixes(args) {
            let board = BoardAdapter::with_options(
                store.clone(),
                BoardOptions::default().with_key_prefix(prefix),
            );
            let due = board
                .prune_candidates(&PruneOptions::after(retention))
                .await
                .map_err(|e| counting("board tasks", &e))?;
            report.candidate_tasks += due.removed;
            report.more |= due.more;
        }
    }
    Ok(())
}

/// What a dry run says would be pruned before the reclaim.
fn what_is_pruned(args: &GcArgs, report: &GcReport) -> String {
    let mut steps = Vec::new();
    if let Some(d) = args.side_effects_retention {
        steps.push(format!(
            "prune up to {} side-effect key(s) completed over {d:?} ago",
            report.candidates
        ));
    }
    if let Some(d) = args.board_retention {
        steps.push(format!(
            "prune up to {} task(s) completed over {d:?} ago on the board(s) {:?}",
            report.candidate_tasks,
            board_prefixes(args)
        ));
    }
    steps.into_iter().map(|s| s + ", then ").collect()
}

/// A retention: a duration of at least one minute.
pub(crate) fn retention(text: &str) -> Result<std::time::Duration, String> {
    let duration = coord_scheduler::parse_duration(text)?;
    if duration < std::time::Duration::from_secs(60) {
        return Err(format!("{text:?} is shorter than one minute"));
    }
    Ok(duration)
}
