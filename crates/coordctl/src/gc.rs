//! `coordctl gc --store URL`: reclaim the store's tombstones in one
//! namespace, in bounded passes (see `coord_backend::reclaim`).
//!
//! Safe with several instances (and every application) running at once: a
//! reclaim only removes what reads as missing and raises the floor with it,
//! atomically, so nothing a reader or writer sees changes but the version
//! a re-created key starts at.

use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use coord_backend::{Error, ReclaimOptions};
use serde::Serialize;

/// Arguments of `coordctl gc`.
#[derive(Debug, Args)]
pub(crate) struct GcArgs {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long)]
    store: String,
    /// Tombstones one pass removes at most (each pass is one bounded call).
    #[arg(long, default_value_t = 1000)]
    per_pass: usize,
    /// Passes at most in this run (0: until nothing is left).
    #[arg(long, default_value_t = 0)]
    max_passes: u64,
    /// Say what would run, change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON document instead of text:
    /// `{"store", "namespace", "dry_run", "passes", "removed", "more", "seconds"}`.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct GcReport {
    store: String,
    namespace: String,
    dry_run: bool,
    passes: u64,
    removed: u64,
    more: bool,
    seconds: f64,
}

pub(crate) async fn run(args: GcArgs) -> Result<ExitCode, Error> {
    if args.per_pass == 0 {
        return Err(Error::Config("--per-pass must be at least 1".to_owned()));
    }
    let url = coord_backend::StoreUrl::parse(&args.store)?;
    let store = coord::connect(&args.store).await?;
    let started = Instant::now();
    let mut report = GcReport {
        store: url.without_namespace().to_string(),
        namespace: store.namespace().to_owned(),
        dry_run: args.dry_run,
        passes: 0,
        removed: 0,
        more: false,
        seconds: 0.0,
    };
    if !args.dry_run {
        let options = ReclaimOptions::DEFAULT.with_max_tombstones(args.per_pass);
        loop {
            let pass = store.reclaim(&options).await?;
            report.passes += 1;
            report.removed += pass.removed;
            report.more = pass.more;
            if !pass.more || (args.max_passes > 0 && report.passes >= args.max_passes) {
                break;
            }
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::Config(format!("cannot encode the report: {e}")))?;
        println!("{text}");
    } else if args.dry_run {
        println!(
            "coordctl gc (dry run): would reclaim the tombstones of namespace {:?} on {}, \
             at most {} per pass{}; nothing changed",
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
            "coordctl gc: namespace {:?} on {}: {} tombstone(s) reclaimed in {} pass(es), {:.2} s{}",
            report.namespace,
            report.store,
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
    Ok(ExitCode::SUCCESS)
}
