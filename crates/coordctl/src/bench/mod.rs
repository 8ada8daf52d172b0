//! `coordctl bench --store URL`: measure coord on your own store, each
//! operation next to a baseline measured in the same run.
//!
//! Three comparisons, one caller at a time on warm clients, uncontended:
//! the primitives next to the raw client's one-round-trip conditional write
//! and point read (`subjects.rs`), a lock cycle of `GenericLock` next to the
//! store's native lock, and `Runner::execute` next to three of the store's own
//! conditional writes (`sideeffect.rs`, shared with `cargo bench -p coordctl
//! --bench sideeffect`). Every number is measured, never assumed: a failing
//! operation ends the command with its error. Everything the bench writes
//! goes to a fresh namespace (`<namespace>-bench-<random>`); the raw
//! baselines' own records are removed at the end, coord's records stay in
//! that namespace (stores keep tombstones).

mod measure;
mod outbox;
mod queue;
mod sideeffect;
mod subjects;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use coord_backend::{Backend, Error, StoreUrl};
use serde::Serialize;

use measure::{Budget, Failure, Tally};

/// A raw client of the endpoints an `etcd://` URL names (plain endpoints:
/// options are coord-etcd's to interpret), for the raw baselines here and
/// `coordctl scale`'s look into a namespace.
#[cfg(feature = "etcd")]
pub(crate) async fn raw_etcd_client(
    url: &StoreUrl,
) -> Result<etcd_client::Client, etcd_client::Error> {
    let endpoints: Vec<String> = url
        .body()
        .split(',')
        .map(|e| e.trim().to_owned())
        .filter(|e| !e.is_empty())
        .collect();
    etcd_client::Client::connect(&endpoints, None).await
}

/// Slices each measurement is split in (interleaved with its baseline).
const SLICES: u32 = 4;
/// Calls of each operation before measuring (connections, statements, scripts, caches).
const WARMUP: u32 = 5;

/// Arguments of `coordctl bench`.
#[derive(Debug, Args)]
#[command(after_long_help = JSON_SCHEMA)]
pub(crate) struct BenchArgs {
    /// Store URL to measure, e.g. sqlite://c.db, redis://127.0.0.1:6379, postgres://…, etcd://127.0.0.1:2379.
    /// The bench writes under a fresh namespace derived from the URL's.
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Seconds each measurement runs (split in 4 slices interleaved with its baseline).
    #[arg(long, default_value_t = 2.0, conflicts_with = "iterations")]
    seconds: f64,
    /// Run each measurement this many calls instead of for a time.
    #[arg(long)]
    iterations: Option<u64>,
    /// Print one JSON document (schema below) instead of the table.
    #[arg(long)]
    json: bool,
    /// Measure the board as a work queue instead: `--tasks` tasks drained by
    /// each number of workers in `--workers`, beside the store's conditional
    /// write at the same concurrency (JSON: `{"store", "namespace", "queue": [rows]}`).
    #[arg(long)]
    queue: bool,
    /// Measure the transactional outbox instead: `--tasks` intents drained
    /// by each number of dispatchers in `--workers`, beside the store's
    /// conditional write at the same concurrency; on PostgreSQL also a
    /// caller's transaction with and without an enqueue (JSON:
    /// `{"store", "namespace", "enqueue", "dispatch": [rows]}`).
    #[arg(long, conflicts_with = "queue")]
    outbox: bool,
    /// Tasks (intents) per worker (dispatcher) count (with `--queue` or `--outbox`).
    #[arg(long, default_value_t = 10_000)]
    tasks: usize,
    /// Worker counts (with `--queue`), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    workers: Vec<usize>,
}

/// What `--outbox --json` prints.
#[derive(Debug, Serialize)]
struct OutboxReport {
    store: String,
    namespace: String,
    /// PostgreSQL only: the caller's transaction with and without an enqueue.
    enqueue: Option<outbox::EnqueueCost>,
    dispatch: Vec<outbox::DispatchRow>,
}

/// What `--queue --json` prints.
#[derive(Debug, Serialize)]
struct QueueReport {
    store: String,
    namespace: String,
    queue: Vec<queue::QueueRow>,
}

/// The JSON document's schema, shown by `coordctl bench --help`.
const JSON_SCHEMA: &str = "\
--json prints one JSON document:
  {
    \"store\": \"redis://127.0.0.1:6379\",       the URL without namespace or password
    \"namespace\": \"coord-bench-…\",           where the bench wrote
    \"budget\": {\"seconds\": 2.0} | {\"iterations\": N},   per measurement
    \"slices\": 4,
    \"rows\": [ {
      \"section\": \"primitives\" | \"locks\" | \"sideeffect\",
      \"op\": \"txn\" | \"snapshot\" | \"lock_cycle\" | \"execute\" | \"replay\",
      \"subject\": \"…\",                        what was measured
      \"calls\", \"seconds\", \"ops_per_sec\", \"mean_us\", \"p99_us\",   numbers: seconds
                                              spent in the calls, *_us in microseconds
      \"round_trips_per_op\": number | null,     counted by a CAS engine
      \"baseline\": null | {\"subject\", \"times\", \"calls\", \"seconds\", \"ops_per_sec\",
                          \"mean_us\", \"p99_us\"},
      \"baseline_note\": string | null,          why there is no baseline
      \"ratio\": number | null                   mean_us / (times × baseline mean_us)
    } ]
  }
Rows always present: primitives/txn, primitives/snapshot, locks/lock_cycle,
sideeffect/execute (baseline: 3 × the store's one-round-trip txn),
sideeffect/replay (baseline: 1 × that txn).";

/// One measured operation.
#[derive(Debug, Serialize)]
struct Stat {
    calls: u64,
    seconds: f64,
    ops_per_sec: f64,
    mean_us: f64,
    p99_us: f64,
}

impl Stat {
    fn of(tally: &mut Tally) -> Stat {
        Stat {
            calls: tally.calls,
            seconds: tally.busy.as_secs_f64(),
            ops_per_sec: tally.rate(),
            mean_us: tally.mean_us(),
            p99_us: tally.p99_us(),
        }
    }
}

/// The baseline of a row.
#[derive(Debug, Serialize)]
struct BaselineStat {
    subject: String,
    /// The subject is compared with this many baseline operations.
    times: f64,
    #[serde(flatten)]
    stat: Stat,
}

/// One row of the report.
#[derive(Debug, Serialize)]
struct Row {
    section: &'static str,
    op: &'static str,
    subject: String,
    #[serde(flatten)]
    stat: Stat,
    round_trips_per_op: Option<f64>,
    baseline: Option<BaselineStat>,
    baseline_note: Option<String>,
    ratio: Option<f64>,
}

impl Row {
    fn new(
        section: &'static str,
        op: &'static str,
        subject: String,
        stat: Stat,
        baseline: Result<BaselineStat, String>,
    ) -> Row {
        let (baseline, note) = match baseline {
            Ok(b) => (Some(b), None),
            Err(note) => (None, Some(note)),
        };
        let ratio = baseline
            .as_ref()
            .map(|b| stat.mean_us / (b.times * b.stat.mean_us).max(f64::EPSILON));
        Row {
            section,
            op,
            subject,
            stat,
            round_trips_per_op: None,
            baseline,
            baseline_note: note,
            ratio,
        }
    }
}

/// The budget as the JSON shows it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum BudgetJson {
    Seconds(f64),
    Iterations(u64),
}

/// The whole report.
#[derive(Debug, Serialize)]
struct Report {
    store: String,
    namespace: String,
    budget: BudgetJson,
    slices: u32,
    rows: Vec<Row>,
}

/// The URL as it may be shown: no namespace, no password.
fn shown(url: &StoreUrl) -> String {
    let raw = url.without_namespace();
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_owned();
    };
    // userinfo ends at the last '@' before the first '/' of the authority.
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &rest[..at];
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}{}", &rest[at..])
        }
        None => raw.to_owned(),
    }
}

pub(crate) async fn run(args: BenchArgs) -> Result<ExitCode, Error> {
    let given = StoreUrl::parse(&args.store)?;
    let budget = match args.iterations {
        Some(0) => return Err(Error::Config("--iterations must be at least 1".into())),
        Some(n) => Budget::Calls(n),
        None if args.seconds.is_finite() && args.seconds > 0.0 => {
            Budget::Time(Duration::from_secs_f64(args.seconds))
        }
        None => return Err(Error::Config("--seconds must be a positive number".into())),
    };
    let run = coord_adapters::mint_token()[..12].to_owned();
    let namespace = format!("{}-bench-{run}", given.namespace());
    let url = StoreUrl::parse(&given.with_namespace(&namespace))?;
    let store = coord::connect(&given.with_namespace(&namespace)).await?;
    // Some clients connect lazily (etcd): one read proves the store answers.
    store.snapshot(&["bench/probe".to_owned()]).await?;

    if args.outbox {
        if args.tasks == 0 || args.workers.contains(&0) {
            return Err(Error::Config(
                "--tasks and every --workers count must be at least 1".into(),
            ));
        }
        let progress = |what: &str| eprintln!("coordctl bench: {what}");
        let enqueue = if matches!(url.scheme(), "postgres" | "postgresql") {
            postgres_enqueue_cost(&url, budget, &progress).await?
        } else {
            None
        };
        let dispatch =
            outbox::measure_dispatch(&store, args.tasks, &args.workers, progress).await?;
        let report = OutboxReport {
            store: shown(&given),
            namespace,
            enqueue,
            dispatch,
        };
        crate::views::print_report(&report, args.json, |r: &OutboxReport| {
            outbox::print(&r.store, &r.dispatch, r.enqueue.as_ref())
        })?;
        return Ok(ExitCode::SUCCESS);
    }

    if args.queue {
        if args.tasks == 0 || args.workers.contains(&0) {
            return Err(Error::Config(
                "--tasks and every --workers count must be at least 1".into(),
            ));
        }
        let rows = queue::measure(&store, args.tasks, &args.workers, |what| {
            eprintln!("coordctl bench: {what}")
        })
        .await?;
        let report = QueueReport {
            store: shown(&given),
            namespace,
            queue: rows,
        };
        crate::views::print_report(&report, args.json, |r: &QueueReport| {
            queue::print(&r.store, &r.queue)
        })?;
        return Ok(ExitCode::SUCCESS);
    }

    let mut cleanup = subjects::Cleanup::new();
    let result = measure_all(&store, &url, &run, budget, &mut cleanup).await;
    for step in cleanup {
        step.await;
    }
    let rows = match result {
        Ok(rows) => rows,
        Err(failure) => {
            eprintln!("coordctl bench: {failure}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let report = Report {
        store: shown(&given),
        namespace,
        budget: match budget {
            Budget::Time(t) => BudgetJson::Seconds(t.as_secs_f64()),
            Budget::Calls(n) => BudgetJson::Iterations(n),
        },
        slices: SLICES,
        rows,
    };
    crate::views::print_report(&report, args.json, print_table)?;
    Ok(ExitCode::SUCCESS)
}

async fn measure_all(
    store: &Arc<dyn Backend>,
    url: &StoreUrl,
    run: &str,
    budget: Budget,
    cleanup: &mut subjects::Cleanup,
) -> Result<Vec<Row>, Failure> {
    let mut raw = subjects::raw(url, run, cleanup).await?;
    let mut pairs = subjects::primitives(store, &mut raw);
    pairs.push(subjects::lock(store, &mut raw));
    let measurements: u64 = pairs
        .iter()
        .map(|p| 1 + u64::from(p.baseline.op.is_some()))
        .sum::<u64>()
        + 3;
    // On stderr (and only on a terminal): a --json document on stdout stays whole.
    let bar = crate::progress::bar(measurements * u64::from(SLICES), "measuring");
    let mut rows = Vec::new();
    for pair in pairs {
        bar.set_message(pair.label.clone());
        let mut ops = vec![pair.op.clone()];
        ops.extend(pair.baseline.op.clone());
        let before = pair.counted.as_ref().map(|g| g.stats().round_trips());
        let mut tallies = measure::interleaved(&ops, budget, SLICES, WARMUP, || bar.inc(1)).await?;
        let baseline = match (pair.baseline.op.is_some(), tallies.get_mut(1)) {
            (true, Some(t)) => Ok(BaselineStat {
                subject: pair.baseline.label.clone(),
                times: 1.0,
                stat: Stat::of(t),
            }),
            _ => Err(pair.baseline.label.clone()),
        };
        let section = if pair.id == "lock_cycle" {
            "locks"
        } else {
            "primitives"
        };
        let mut row = Row::new(
            section,
            pair.id,
            pair.label,
            Stat::of(&mut tallies[0]),
            baseline,
        );
        if let (Some(generic), Some(before)) = (&pair.counted, before) {
            // Warm-up calls are counted by the engine too.
            let calls = tallies[0].calls + u64::from(WARMUP);
            row.round_trips_per_op =
                Some((generic.stats().round_trips() - before) as f64 / calls as f64);
        }
        rows.push(row);
    }

    bar.set_message("Runner::execute");
    let (mut raw_txn, mut exec, mut replay) = sideeffect::measure(
        store.clone(),
        run.to_owned(),
        budget,
        SLICES,
        WARMUP,
        || bar.inc(1),
    )
    .await?;
    bar.finish_and_clear();
    let raw_label = "the store's txn (assert version + put, 1 key)".to_owned();
    for (op, subject, tally, times) in [
        (
            "execute",
            format!(
                "Runner::execute, fresh key ({} resources)",
                sideeffect::RESOURCES
            ),
            &mut exec,
            3.0,
        ),
        (
            "replay",
            "Runner::execute, completed key (replay)".to_owned(),
            &mut replay,
            1.0,
        ),
    ] {
        let mut row = Row::new(
            "sideeffect",
            op,
            subject,
            Stat::of(tally),
            Ok(BaselineStat {
                subject: raw_label.clone(),
                times,
                stat: Stat::of(&mut raw_txn),
            }),
        );
        row.round_trips_per_op = Some(tally.per_call(tally.round_trips));
        rows.push(row);
    }
    Ok(rows)
}

fn print_table(report: &Report) {
    let budget = match report.budget {
        BudgetJson::Seconds(s) => format!("{s} s"),
        BudgetJson::Iterations(n) => format!("{n} calls"),
    };
    println!(
        "coordctl bench: {} (namespace {}), one warm caller, sequential; {budget} per \
         measurement in {} slices interleaved with its baseline",
        report.store, report.namespace, report.slices
    );
    let mut section = "";
    for row in &report.rows {
        if row.section != section {
            section = row.section;
            println!();
            println!(
                "{:<44} {:>9} {:>9} {:>9} {:>7} | {:<46} {:>9} {:>9} | {:>6}",
                format!("[{section}] operation"),
                "ops/s",
                "µs/op",
                "p99 µs",
                "RT/op",
                "baseline",
                "ops/s",
                "µs/op",
                "ratio"
            );
        }
        let rt = row
            .round_trips_per_op
            .map_or("-".to_owned(), |r| format!("{r:.2}"));
        let (label, rate, mean, ratio) = match &row.baseline {
            Some(b) => (
                if b.times == 1.0 {
                    b.subject.clone()
                } else {
                    format!("{} × {}", b.times, b.subject)
                },
                format!("{:.0}", b.stat.ops_per_sec / b.times),
                format!("{:.1}", b.stat.mean_us * b.times),
                format!("{:.2}", row.ratio.unwrap_or(f64::NAN)),
            ),
            None => (
                row.baseline_note.clone().unwrap_or_default(),
                "-".into(),
                "-".into(),
                "-".into(),
            ),
        };
        println!(
            "{:<44} {:>9.0} {:>9.1} {:>9.1} {:>7} | {:<46} {:>9} {:>9} | {:>6}",
            row.subject,
            row.stat.ops_per_sec,
            row.stat.mean_us,
            row.stat.p99_us,
            rt,
            label,
            rate,
            mean,
            ratio
        );
    }
    println!();
    println!(
        "ratio = µs/op of the operation / µs of its baseline (× times); RT/op = store round trips \
         counted by coord's CAS engine. Numbers from one run on this machine, not a promise."
    );
}

/// The enqueue's cost in a caller's PostgreSQL transaction, in `budget`
/// (time: split in [`SLICES`] slices per kind; a count of calls: one slice
/// of a second per thousand).
#[cfg(feature = "postgres")]
async fn postgres_enqueue_cost(
    url: &StoreUrl,
    budget: Budget,
    progress: &impl Fn(&str),
) -> Result<Option<outbox::EnqueueCost>, Error> {
    progress("outbox: a caller's transaction, without and with an enqueue");
    let total = match budget {
        Budget::Time(t) => t,
        Budget::Calls(n) => Duration::from_millis(n.max(1)),
    };
    outbox::measure_enqueue_postgres(url, total / SLICES, SLICES)
        .await
        .map(Some)
}

/// Without the `postgres` feature there is no caller's PostgreSQL pool.
#[cfg(not(feature = "postgres"))]
async fn postgres_enqueue_cost(
    _url: &StoreUrl,
    _budget: Budget,
    _progress: &impl Fn(&str),
) -> Result<Option<outbox::EnqueueCost>, Error> {
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_url_hides_the_password_and_namespace() {
        let cases = [
            (
                "postgres://u:pw@h:5432/db?namespace=x&sslmode=disable",
                "postgres://u:***@h:5432/db?sslmode=disable",
            ),
            ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
            ("redis://u@h:6379", "redis://u@h:6379"),
            ("etcd://a:1,b:2?namespace=n", "etcd://a:1,b:2"),
            ("sqlite:///tmp/a@b/c.db", "sqlite:///tmp/a@b/c.db"),
        ];
        for (given, want) in cases {
            assert_eq!(shown(&StoreUrl::parse(given).unwrap()), want, "{given}");
        }
    }

    #[test]
    fn calls_are_spread_exactly_over_slices() {
        for total in [0u64, 1, 3, 4, 5, 17] {
            let sum: u64 = (0..SLICES)
                .map(|i| match Budget::Calls(total).slice(i, SLICES) {
                    Budget::Calls(n) => n,
                    Budget::Time(_) => unreachable!(),
                })
                .sum();
            assert_eq!(sum, total);
        }
    }
}
