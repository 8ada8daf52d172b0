//! `coordctl scale --store URL`: what coord costs as a namespace grows and
//! churns, in one run on one store.
//!
//! Four namespaces, each with 10 live keys under `x/`:
//!
//! - **empty**: nothing else;
//! - **live**: `--keys` more live keys (under `l/`);
//! - **deleted**: `--keys` keys created and deleted under `x/` (the listed
//!   prefix), measured before and after `reclaim` (what `coordctl gc`
//!   runs);
//! - **side effects**: `--effects` completed `Runner::execute` keys,
//!   measured after a reclaim (as `coordctl gc` leaves them).
//!
//! In each: the mean time of a one-key CAS txn, a one-key snapshot and
//! `keys("x/")`, and where the store can be looked into (not memory) the
//! records and bytes it holds for the namespace (`scale/size.rs` says how
//! each store is measured). Ratios are against the empty namespace of the
//! same run. Every namespace is fresh (`<namespace>-scale-<random>-<name>`)
//! and left behind, reclaimed.

mod size;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use coord_adapters::sideeffect::{Action, EffectResult, Runner, SideEffectAdapter};
use coord_backend::{Assert, Backend, Error, Mutation, ReclaimOptions, StoreUrl, Version};
use serde::Serialize;

/// Arguments of `coordctl scale`.
#[derive(Debug, Args)]
pub(crate) struct ScaleArgs {
    /// Store URL to measure; the command writes under fresh namespaces derived from the URL's.
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Keys in the "live" namespace, and keys created and deleted in the "deleted" one.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Completed side-effect keys whose bytes are measured.
    #[arg(long, default_value_t = 1000)]
    effects: u64,
    /// Time spent measuring each operation in each namespace.
    #[arg(long, default_value_t = 0.5)]
    seconds: f64,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    json: bool,
    /// Run a reclaim on each fresh namespace before filling it (a namespace
    /// under maintenance; on etcd the first reclaim switches the namespace
    /// to real deletes, see docs/shapes.md).
    #[arg(long)]
    reclaim_first: bool,
    /// On etcd: after the reclaim, also compact etcd's history (the WHOLE
    /// cluster's, as `--auto-compaction-retention` would) and measure again.
    /// For test clusters only.
    #[arg(long)]
    etcd_compact: bool,
}

/// One namespace's measurements.
#[derive(Debug, Serialize)]
struct Phase {
    name: String,
    txn_us: f64,
    snapshot_us: f64,
    keys_us: f64,
    /// Calls behind `keys_us` (a slow listing is measured fewer times).
    keys_calls: u64,
    records: Option<u64>,
    bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct Report {
    store: String,
    keys: u64,
    effects: u64,
    phases: Vec<Phase>,
    /// Bytes of the "deleted" namespace after reclaim / before the churn.
    churn_bytes_ratio: Option<f64>,
    /// Bytes per completed side-effect key.
    bytes_per_effect: Option<f64>,
    /// Tombstones the reclaim removed, and the seconds it took.
    reclaimed: u64,
    reclaim_seconds: f64,
    /// Seconds spent filling the "live" and "deleted" namespaces.
    fill_seconds: f64,
}

fn note(message: &str) {
    eprintln!("coordctl scale: {message}");
}

pub(crate) async fn run(args: ScaleArgs) -> Result<ExitCode, Error> {
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(Error::Config("--seconds must be a positive number".into()));
    }
    let given = StoreUrl::parse(&args.store)?;
    let run = coord_adapters::mint_token()[..8].to_owned();
    let budget = Duration::from_secs_f64(args.seconds);
    let open = |name: &str| {
        let namespace = format!("{}-scale-{run}-{name}", given.namespace());
        given.with_namespace(&namespace)
    };
    let mut phases = Vec::new();
    let fill_started = Instant::now();
    let mut fill = Duration::ZERO;

    note("empty namespace");
    let empty_url = open("empty");
    let empty = prepared(&empty_url, args.reclaim_first).await?;
    phases.push(measure("empty", &empty, &empty_url, budget).await?);

    note(&format!("filling {} live keys", args.keys));
    let live_url = open("live");
    let live = prepared(&live_url, args.reclaim_first).await?;
    let started = Instant::now();
    fill_keys(&live, "l/", args.keys, false).await?;
    fill += started.elapsed();
    phases.push(measure(&format!("{} live", args.keys), &live, &live_url, budget).await?);

    let deleted_url = open("deleted");
    let deleted = prepared(&deleted_url, args.reclaim_first).await?;
    let before_churn = size::of(&deleted_url, deleted.namespace()).await?;
    note(&format!("creating and deleting {} keys", args.keys));
    let started = Instant::now();
    fill_keys(&deleted, "x/d/", args.keys, true).await?;
    fill += started.elapsed();
    // The churned namespace, measured at each step of its clean-up.
    let measure_deleted = async |step: &str| {
        let name = format!("{} deleted, {step}", args.keys);
        measure(&name, &deleted, &deleted_url, budget).await
    };
    phases.push(measure_deleted("before reclaim").await?);
    note("reclaiming");
    let started = Instant::now();
    let reclaimed = reclaim_all(&deleted).await?;
    let reclaim_seconds = started.elapsed().as_secs_f64();
    let after = measure_deleted("after reclaim").await?;
    let churn_bytes_ratio = match (before_churn, after.bytes) {
        (Some((_, before)), Some(after)) if before > 0 => Some(after as f64 / before as f64),
        _ => None,
    };
    phases.push(after);
    if args.etcd_compact && size::compact_etcd(&deleted_url).await? {
        phases.push(measure_deleted("+ etcd compaction").await?);
    }

    note(&format!("{} side effects", args.effects));
    let effects_url = open("effects");
    let effects = coord::connect(&effects_url).await?;
    let before_effects = size::of(&effects_url, effects.namespace()).await?;
    let runner = Runner::new(Arc::new(SideEffectAdapter::new(effects.clone())));
    for i in 0..args.effects {
        runner
            .execute(
                &Action::new(format!("order-{i}"), "payments"),
                Duration::from_secs(30),
                |_lease| async { Ok::<_, std::io::Error>(EffectResult::from(&b"ok"[..])) },
            )
            .await
            .map_err(|e| Error::Config(format!("side effect {i} failed: {e}")))?;
    }
    // As `coordctl gc` leaves it: the attention entries each completion
    // deleted are tombstones until reclaimed.
    reclaim_all(&effects).await?;
    let after_effects = size::of(&effects_url, effects.namespace()).await?;
    let bytes_per_effect = match (before_effects, after_effects) {
        (Some((_, before)), Some((_, after))) if args.effects > 0 => {
            Some(after.saturating_sub(before) as f64 / args.effects as f64)
        }
        _ => None,
    };

    let report = Report {
        store: given.without_namespace().to_owned(),
        keys: args.keys,
        effects: args.effects,
        phases,
        churn_bytes_ratio,
        bytes_per_effect,
        reclaimed,
        reclaim_seconds,
        fill_seconds: fill.as_secs_f64().min(fill_started.elapsed().as_secs_f64()),
    };
    crate::views::print_report(&report, args.json, print_table)?;
    Ok(ExitCode::SUCCESS)
}

/// Reclaim passes until none is left to do: the tombstones removed.
async fn reclaim_all(store: &Arc<dyn Backend>) -> Result<u64, Error> {
    let mut removed = 0;
    loop {
        let pass = store.reclaim(&ReclaimOptions::DEFAULT).await?;
        removed += pass.removed;
        if !pass.more {
            return Ok(removed);
        }
    }
}

/// A namespace with its 10 live keys under `x/` and the CAS key `t`.
async fn prepared(url: &str, reclaim_first: bool) -> Result<Arc<dyn Backend>, Error> {
    let store = coord::connect(url).await?;
    if reclaim_first {
        store.reclaim(&ReclaimOptions::DEFAULT).await?;
    }
    let mut puts: Vec<Mutation> = (0..10)
        .map(|i| Mutation::put(format!("x/{i}"), b"live".to_vec()))
        .collect();
    puts.push(Mutation::put("t", b"0".to_vec()));
    applied(store.txn(&[], &puts).await?, "the 10 live keys")?;
    Ok(store)
}

fn applied(outcome: coord_backend::TxnOutcome, what: &str) -> Result<(), Error> {
    if outcome.applied {
        Ok(())
    } else {
        Err(Error::Config(format!("writing {what} was refused")))
    }
}

/// Write `count` keys under `prefix` in txns as large as the store takes,
/// and with `delete_after` delete each batch again.
async fn fill_keys(
    store: &Arc<dyn Backend>,
    prefix: &str,
    count: u64,
    delete_after: bool,
) -> Result<(), Error> {
    let batch = store.limits().max_keys_per_call.clamp(1, 100) as u64;
    let mut next = 0;
    let mut last_note = Instant::now();
    while next < count {
        let end = (next + batch).min(count);
        let keys: Vec<String> = (next..end).map(|i| format!("{prefix}{i:08}")).collect();
        let puts: Vec<Mutation> = keys
            .iter()
            .map(|k| Mutation::put(k.as_str(), b"v".to_vec()))
            .collect();
        applied(store.txn(&[], &puts).await?, "a batch of keys")?;
        if delete_after {
            let deletes: Vec<Mutation> =
                keys.iter().map(|k| Mutation::delete(k.as_str())).collect();
            applied(store.txn(&[], &deletes).await?, "a batch of deletes")?;
        }
        next = end;
        if last_note.elapsed() > Duration::from_secs(10) {
            note(&format!("  {next} / {count}"));
            last_note = Instant::now();
        }
    }
    Ok(())
}

/// Mean microseconds of `op` over `budget` (at least 3 calls, at most
/// 10,000; a single call when one takes longer than the budget).
async fn timed<F, Fut>(budget: Duration, mut op: F) -> Result<(f64, u64), Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let mut calls = 0u64;
    let mut busy = Duration::ZERO;
    let started = Instant::now();
    loop {
        let one = Instant::now();
        op().await?;
        busy += one.elapsed();
        calls += 1;
        let slow = calls == 1 && busy > budget;
        if slow || calls >= 10_000 || (calls >= 3 && started.elapsed() >= budget) {
            break;
        }
    }
    Ok((busy.as_secs_f64() * 1e6 / calls as f64, calls))
}

async fn measure(
    name: &str,
    store: &Arc<dyn Backend>,
    url: &str,
    budget: Duration,
) -> Result<Phase, Error> {
    // Warm up the client (connections, statements, scripts) on every operation.
    let mut version = store.snapshot(&["t".to_owned()]).await?[0].version;
    for _ in 0..5 {
        let outcome = store
            .txn(
                &[Assert::at("t", version)],
                &[Mutation::put("t", b"1".to_vec())],
            )
            .await?;
        applied(outcome, "the CAS key")?;
        // +1 per write, from a first version the store chooses (an etcd
        // namespace in floor mode starts at the key's create revision).
        version = if version.is_missing() {
            store.snapshot(&["t".to_owned()]).await?[0].version
        } else {
            Version(version.0 + 1)
        };
        store.snapshot(&["x/0".to_owned()]).await?;
    }
    store.keys("x/").await?;
    let txn_us = {
        let mut calls = 0u64;
        let mut busy = Duration::ZERO;
        let started = Instant::now();
        while calls < 3 || (started.elapsed() < budget && calls < 10_000) {
            let one = Instant::now();
            let outcome = store
                .txn(
                    &[Assert::at("t", version)],
                    &[Mutation::put("t", b"1".to_vec())],
                )
                .await?;
            busy += one.elapsed();
            applied(outcome, "the CAS key")?;
            version = Version(version.0 + 1);
            calls += 1;
        }
        busy.as_secs_f64() * 1e6 / calls as f64
    };
    let (snapshot_us, _) = timed(budget, || async {
        store.snapshot(&["x/0".to_owned()]).await.map(|_| ())
    })
    .await?;
    let (keys_us, keys_calls) = timed(budget, || async {
        let keys = store.keys("x/").await?;
        if keys.len() == 10 {
            Ok(())
        } else {
            Err(Error::Config(format!(
                "keys(\"x/\") listed {} keys instead of the 10 live ones",
                keys.len()
            )))
        }
    })
    .await?;
    let found = size::of(url, store.namespace()).await?;
    Ok(Phase {
        name: name.to_owned(),
        txn_us,
        snapshot_us,
        keys_us,
        keys_calls,
        records: found.map(|(records, _)| records),
        bytes: found.map(|(_, bytes)| bytes),
    })
}

fn print_table(report: &Report) {
    println!(
        "coordctl scale: {} ({} keys, {} side effects)",
        report.store, report.keys, report.effects
    );
    let empty = &report.phases[0];
    println!(
        "{:<32} {:>10} {:>7} {:>12} {:>7} {:>12} {:>8} {:>10} {:>12}",
        "namespace", "txn µs", "×", "snapshot µs", "×", "keys(x/) µs", "×", "records", "bytes"
    );
    for phase in &report.phases {
        let ratio = |a: f64, b: f64| a / b.max(f64::EPSILON);
        println!(
            "{:<32} {:>10.1} {:>7.2} {:>12.1} {:>7.2} {:>12.1} {:>8.2} {:>10} {:>12}",
            phase.name,
            phase.txn_us,
            ratio(phase.txn_us, empty.txn_us),
            phase.snapshot_us,
            ratio(phase.snapshot_us, empty.snapshot_us),
            phase.keys_us,
            ratio(phase.keys_us, empty.keys_us),
            phase.records.map_or("-".to_owned(), |r| r.to_string()),
            phase.bytes.map_or("-".to_owned(), |b| b.to_string()),
        );
    }
    println!(
        "reclaim: {} tombstones in {:.1} s; fill: {:.1} s",
        report.reclaimed, report.reclaim_seconds, report.fill_seconds
    );
    match report.churn_bytes_ratio {
        Some(r) => println!("bytes after churn + reclaim / before churn: {r:.3}"),
        None => println!("bytes after churn + reclaim / before churn: n/a (store not measurable)"),
    }
    match report.bytes_per_effect {
        Some(b) => println!("bytes per completed side-effect key: {b:.0}"),
        None => println!("bytes per completed side-effect key: n/a"),
    }
}
