//! Slot claims per second across 3 scheduler instances, per store.
//!
//! ```text
//! cargo bench -p coordctl --bench claims
//! COORD_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! COORD_TEST_REDIS_URL=redis://127.0.0.1:6379 \
//! COORD_TEST_ETCD_ENDPOINTS=127.0.0.1:2379 cargo bench -p coordctl --bench claims
//! ```
//!
//! Three instances = three tasks, each with its own store client
//! (`coord::connect`) and its own `RunStore` (its own CAS engine and cache),
//! on one multi-threaded runtime. Two modes, each for `COORD_BENCH_SECS`
//! seconds (default 3) after a short warm-up:
//!
//! - **distinct**: every claim is a distinct `(job, slot)` nobody claimed
//!   before (each instance on its own jobs), so every claim is won: the cost
//!   of starting a slot. The target for PostgreSQL is 1,000 claims/s.
//! - **race**: the three instances claim the same `(job, slot)`s in the same
//!   order, as a cluster does at every tick: one wins each slot, the others
//!   learn it is running elsewhere. Reported per claim and as slots decided
//!   per second; a slot won twice aborts the bench.
//! - **floor-txn** (not a claim): one bare create-if-missing txn of one key
//!   per call on the backend: the store's commit rate with 3 clients, the
//!   floor under a claim's single round trip (a claim writes 3 keys).
//!
//! Round trips per claim are the CAS engines' store calls (snapshots + txns)
//! divided by the claims. Stores whose `COORD_TEST_*` variable is unset are
//! listed as SKIPPED. Numbers on a shared 2-core machine are indicative only.

mod common;
use common::unique;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_backend::{Assert, Mutation, SystemClock};
use coord_scheduler::{ClaimRequest, RunStore, RunStoreOptions, SlotStore};

const INSTANCES: usize = 3;
const SLOT: u64 = 60_000;
const LEASE: Duration = Duration::from_secs(30);
const WARMUP_CLAIMS: usize = 20;
const POSTGRES_TARGET: f64 = 1_000.0;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Distinct,
    Race,
    /// Not a claim: one bare create-if-missing txn of one key on the
    /// backend, the store's own commit rate with 3 clients (the floor a
    /// claim's one round trip cannot beat).
    Floor,
}

struct Row {
    store: &'static str,
    mode: Mode,
    claims: u64,
    won: u64,
    secs: f64,
    round_trips: u64,
    rejections: u64,
}

async fn instance(url: &str) -> RunStore {
    let backend = coord::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    RunStore::new(backend, Arc::new(SystemClock), RunStoreOptions::default()).expect("run store")
}

fn job(mode: Mode, run: &str, instance: usize, n: u64) -> String {
    match mode {
        Mode::Distinct => format!("d{run}-{instance}-{n}"),
        Mode::Race => format!("r{run}-{n}"),
        Mode::Floor => format!("f{run}-{instance}-{n}"),
    }
}

/// One mode on one store: returns the row.
async fn measure(store: &'static str, url: &str, mode: Mode, secs: f64) -> Row {
    let run = unique();
    let mut stores = Vec::new();
    for _ in 0..INSTANCES {
        stores.push(Arc::new(instance(url).await));
    }
    // Warm-up: connections, prepared statements, scripts loaded.
    for (i, s) in stores.iter().enumerate() {
        for n in 0..WARMUP_CLAIMS as u64 {
            let request = ClaimRequest::new(
                format!("w{run}-{i}-{n}"),
                SLOT,
                format!("t{i}"),
                format!("i{i}"),
                LEASE,
            );
            s.claim(&request).await.expect("warm-up claim");
        }
    }
    let before: Vec<_> = stores.iter().map(|s| s.engine().stats()).collect();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (i, s) in stores.iter().enumerate() {
        let s = s.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let mut claims = 0u64;
            let mut won = Vec::new();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let won_it = if mode == Mode::Floor {
                    let key = job(mode, &run, i, n);
                    s.engine()
                        .backend()
                        .txn(
                            &[Assert::missing(key.clone())],
                            &[Mutation::put(key, b"x".to_vec())],
                        )
                        .await
                        .expect("txn")
                        .applied
                } else {
                    let request = ClaimRequest::new(
                        job(mode, &run, i, n),
                        SLOT,
                        format!("token-{i}-{n}"),
                        format!("instance-{i}"),
                        LEASE,
                    );
                    s.claim(&request).await.expect("claim").won
                };
                claims += 1;
                if won_it {
                    won.push(n);
                }
                n += 1;
            }
            (claims, won)
        }));
    }
    let mut claims = 0;
    let mut won_total = 0;
    let mut won_slots = BTreeSet::new();
    for task in tasks {
        let (c, won) = task.await.expect("claim task");
        claims += c;
        won_total += won.len() as u64;
        for n in won {
            assert!(
                won_slots.insert(n) || mode != Mode::Race,
                "{store}: slot {n} was won twice"
            );
        }
    }
    let secs = started.elapsed().as_secs_f64();
    if mode == Mode::Distinct {
        assert_eq!(
            won_total, claims,
            "{store}: a fresh (job, slot) claim was lost"
        );
    }
    let (mut round_trips, mut rejections) = (0, 0);
    if mode == Mode::Floor {
        round_trips = claims;
    }
    for (s, b) in stores.iter().zip(before) {
        let a = s.engine().stats();
        round_trips += a.round_trips() - b.round_trips();
        rejections += a.rejections - b.rejections;
    }
    Row {
        store,
        mode,
        claims,
        won: won_total,
        secs,
        round_trips,
        rejections,
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` runs it once quickly.
    let quick = !std::env::args().any(|a| a == "--bench");
    let secs = std::env::var("COORD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(if quick { 0.2 } else { 3.0 });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(INSTANCES)
        .enable_all()
        .build()
        .expect("runtime");

    let temp = std::env::temp_dir().join(format!("coord-claims-bench-{}", unique()));
    std::fs::create_dir_all(&temp).expect("temp dir");
    let namespace = format!("bench-claims-{}", unique());
    let stores = common::stores(&temp, "claims.db", &namespace);

    println!(
        "slot claims, {INSTANCES} instances (each its own client + RunStore), {secs} s per row{}",
        if quick {
            " (quick run: use cargo bench)"
        } else {
            ""
        }
    );
    println!(
        "{:<9} {:<9} {:>8} {:>11} {:>13} {:>19} {:>16}",
        "store", "mode", "claims", "claims/s", "slots/s", "round trips/claim", "rejected/claim"
    );
    let mut postgres_rate = None;
    for (store, url, var) in stores {
        let Some(url) = url else {
            println!("{store:<9} SKIPPED: {var} is unset");
            continue;
        };
        for mode in [Mode::Distinct, Mode::Race, Mode::Floor] {
            let row = runtime.block_on(measure(store, &url, mode, secs));
            let rate = row.claims as f64 / row.secs;
            if store == "postgres" && mode == Mode::Distinct {
                postgres_rate = Some(rate);
            }
            println!(
                "{:<9} {:<9} {:>8} {:>11.0} {:>13.0} {:>19.2} {:>16.2}",
                row.store,
                match row.mode {
                    Mode::Distinct => "distinct",
                    Mode::Race => "race",
                    Mode::Floor => "floor-txn",
                },
                row.claims,
                rate,
                row.won as f64 / row.secs,
                row.round_trips as f64 / row.claims.max(1) as f64,
                row.rejections as f64 / row.claims.max(1) as f64,
            );
        }
    }
    match postgres_rate {
        Some(rate) => {
            println!(
            "PostgreSQL target {POSTGRES_TARGET:.0} claims/s (distinct): {} ({rate:.0} claims/s)",
            if rate >= POSTGRES_TARGET { "MET" } else { "NOT MET" }
        )
        }
        None => println!("PostgreSQL target {POSTGRES_TARGET:.0} claims/s: not measured (SKIPPED)"),
    }
    let _ = std::fs::remove_dir_all(&temp);
}
