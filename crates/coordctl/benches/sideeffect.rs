//! What at-most-once costs: `Runner::execute` next to the store's raw
//! conditional write, per store, in one run.
//!
//! ```text
//! cargo bench -p coordctl --bench sideeffect
//! COORD_TEST_REDIS_URL=redis://127.0.0.1:6379 \
//! COORD_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! COORD_TEST_ETCD_ENDPOINTS=127.0.0.1:2379 cargo bench -p coordctl --bench sideeffect
//! ```
//!
//! Per store, the three measurements of `src/bench/sideeffect.rs` (raw txn,
//! execute, replay: the same code `coordctl bench` runs), each for
//! `COORD_BENCH_SECS` seconds (default 2), split in [`SLICES`] slices
//! interleaved with the other two, so drifting load on a shared machine hits
//! all three alike. Stores whose `COORD_TEST_*` variable is unset print
//! SKIPPED. Without `--bench` (`cargo test --benches`) every measurement runs
//! 0.1 s, as a smoke test.

mod common;
use common::unique;

// The measuring code `coordctl bench` runs (coordctl has no library target).
#[allow(dead_code)]
#[path = "../src/bench/measure.rs"]
mod measure;
#[allow(dead_code)]
#[path = "../src/bench/sideeffect.rs"]
mod sideeffect;

use std::time::Duration;

use measure::Budget;
use sideeffect::RESOURCES;

/// Each measurement's time is split into this many interleaved slices.
const SLICES: u32 = 4;
/// Calls of each measurement before measuring (connections, prepared statements, scripts, cache).
const WARMUP: u32 = 20;
const TARGET_ROUND_TRIPS: f64 = 3.0;

/// The three measurements of one store: (raw, execute, replay).
async fn measure_store(
    url: &str,
    run: String,
    secs: f64,
) -> (measure::Tally, measure::Tally, measure::Tally) {
    let backend = coord::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let budget = Budget::Time(Duration::from_secs_f64(secs));
    sideeffect::measure(backend, run, budget, SLICES, WARMUP, || {})
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let secs = std::env::var("COORD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(if quick { 0.1 } else { 2.0 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let run = unique();
    let temp = std::env::temp_dir().join(format!("coord-sideeffect-bench-{run}"));
    std::fs::create_dir_all(&temp).expect("temp dir");
    let namespace = format!("bench-se-{run}");
    let stores = common::stores(&temp, "sideeffect.db", &namespace);

    println!(
        "Runner::execute vs the raw one-round-trip txn: one warm uncontended caller, \
         fresh key per execute, {RESOURCES} resources, {secs} s per measurement in {SLICES} \
         interleaved slices{}",
        if quick {
            " (quick run: use cargo bench)"
        } else {
            ""
        }
    );
    println!(
        "{:<9} {:>10} {:>8} | {:>10} {:>8} {:>9} {:>14} {:>8} {:>8} | {:>10} {:>8} {:>8}",
        "store",
        "raw txn/s",
        "raw µs",
        "execute/s",
        "exec µs",
        "p99 µs",
        "exec/(3×raw)",
        "RT/exec",
        "rejected",
        "replay/s",
        "rep. µs",
        "RT/rep."
    );
    let mut verdicts = Vec::new();
    for (store, url, var) in stores {
        let Some(url) = url else {
            println!("{store:<9} SKIPPED: {var} is unset");
            continue;
        };
        let (raw, mut exec, replay) =
            runtime.block_on(measure_store(&url, format!("{store}-{run}"), secs));
        let rt_exec = exec.per_call(exec.round_trips);
        println!(
            "{:<9} {:>10.0} {:>8.1} | {:>10.0} {:>8.1} {:>9.1} {:>14.2} {:>8.3} {:>8} | {:>10.0} {:>8.1} {:>8.3}",
            store,
            raw.rate(),
            raw.mean_us(),
            exec.rate(),
            exec.mean_us(),
            exec.p99_us(),
            exec.mean_us() / (3.0 * raw.mean_us()),
            rt_exec,
            exec.rejections,
            replay.rate(),
            replay.mean_us(),
            replay.per_call(replay.round_trips),
        );
        verdicts.push((store, rt_exec, exec.rejections));
    }
    for (store, rt, rejected) in verdicts {
        println!(
            "{store}: {rt:.4} round trips per execute, target ≤ {TARGET_ROUND_TRIPS:.0}: {}{}",
            if rt <= TARGET_ROUND_TRIPS {
                "MET"
            } else {
                "NOT MET"
            },
            // A rejected txn is a wrong cached guess (e.g. after the engine's
            // bounded cache was cleared): one extra round trip each.
            if rejected > 0 {
                format!(" ({rejected} rejected txns, one extra round trip each)")
            } else {
                String::new()
            }
        );
    }
    let _ = std::fs::remove_dir_all(&temp);
}
