//! coord-etcd's primitives next to a raw etcd-client baseline measured in the
//! same run against the same server:
//!
//! - `txn/coord`: `txn([key @ v], [put key])`, uncontended (v tracked locally):
//!   ONE etcd Txn `If(version == v) Then(put) Else(get)` (the store wrote
//!   version v itself, so it knows v is live and needs no tombstone compare);
//! - `txn/raw`: one raw `Txn If(version == v) Then(put)`;
//! - `snapshot/coord`: `snapshot([key])`: ONE read-only Txn with one get;
//! - `snapshot/raw`: one raw range `get(key)`.
//!
//! Round trips per op: 1 for each of the four (by construction: one gRPC
//! call each). A summary with ops/s and the coord/raw ratio is printed at the
//! end (coord and raw alternating in short slices, so both see the same load
//! on a shared machine; after criterion's own report).
//!
//! ```text
//! scripts/start-etcd.sh
//! COORD_TEST_ETCD_ENDPOINTS=127.0.0.1:2379 cargo bench -p coord-etcd --bench etcd -- \
//!     --warm-up-time 1 --measurement-time 3
//! ```

use std::hint::black_box;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_backend::{Assert, Backend, Mutation, Version};
use coord_conformance::support::bench_runtime;
use coord_etcd::{EtcdBackend, EtcdOptions};
use criterion::Criterion;
use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};

const VALUE: [u8; 64] = [7; 64];

struct Setup {
    store: Arc<EtcdBackend>,
    raw: Client,
    /// The coord key's current version.
    coord_version: Arc<AtomicI64>,
    /// The raw key's current etcd version.
    raw_version: Arc<AtomicI64>,
    raw_key: Vec<u8>,
}

async fn setup(endpoints: &str) -> Setup {
    let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
    let namespace = format!("bench-{:x}", std::process::id());
    let store = EtcdBackend::connect_endpoints(&endpoints, &namespace, EtcdOptions::default())
        .await
        .unwrap();
    assert!(
        store
            .txn(
                &[Assert::missing("k")],
                &[Mutation::put("k", VALUE.to_vec())]
            )
            .await
            .unwrap()
            .applied
    );
    let mut raw = Client::connect(&endpoints, None).await.unwrap();
    let raw_key = format!("bench-raw/{namespace}/k").into_bytes();
    raw.put(raw_key.clone(), VALUE.to_vec(), None)
        .await
        .unwrap();
    Setup {
        store: Arc::new(store),
        raw,
        coord_version: Arc::new(AtomicI64::new(1)),
        raw_version: Arc::new(AtomicI64::new(1)),
        raw_key,
    }
}

async fn coord_txn(s: &Setup) {
    let v = s.coord_version.load(Ordering::Relaxed);
    let out = s
        .store
        .txn(
            &[Assert::at("k", Version(v as u64))],
            &[Mutation::put("k", VALUE.to_vec())],
        )
        .await
        .unwrap();
    assert!(out.applied);
    s.coord_version.store(v + 1, Ordering::Relaxed);
}

async fn raw_txn(s: &Setup) {
    let v = s.raw_version.load(Ordering::Relaxed);
    let txn = Txn::new()
        .when([Compare::version(s.raw_key.clone(), CompareOp::Equal, v)])
        .and_then([TxnOp::put(s.raw_key.clone(), VALUE.to_vec(), None)]);
    let out = s.raw.clone().txn(txn).await.unwrap();
    assert!(out.succeeded());
    s.raw_version.store(v + 1, Ordering::Relaxed);
}

async fn coord_snapshot(s: &Setup) {
    black_box(s.store.snapshot(&["k".to_owned()]).await.unwrap());
}

async fn raw_get(s: &Setup) {
    black_box(s.raw.clone().get(s.raw_key.clone(), None).await.unwrap());
}

/// Runs `op` for `for_how_long`; returns (ops, seconds).
async fn run_for<F, Fut>(for_how_long: Duration, mut op: F) -> (u64, f64)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < for_how_long {
        op().await;
        n += 1;
    }
    (n, started.elapsed().as_secs_f64())
}

/// ops/s of coord and raw, alternating 200 ms slices so both see the same
/// (shared, noisy) machine.
async fn interleaved(s: &Setup, txn: bool, rounds: u32) -> (f64, f64) {
    let slice = Duration::from_millis(200);
    let (mut coord, mut raw) = ((0u64, 0f64), (0u64, 0f64));
    for _ in 0..rounds {
        let (n, t) = if txn {
            run_for(slice, || coord_txn(s)).await
        } else {
            run_for(slice, || coord_snapshot(s)).await
        };
        coord = (coord.0 + n, coord.1 + t);
        let (n, t) = if txn {
            run_for(slice, || raw_txn(s)).await
        } else {
            run_for(slice, || raw_get(s)).await
        };
        raw = (raw.0 + n, raw.1 + t);
    }
    (coord.0 as f64 / coord.1, raw.0 as f64 / raw.1)
}

fn main() {
    let Ok(endpoints) = std::env::var("COORD_TEST_ETCD_ENDPOINTS") else {
        eprintln!(
            "SKIPPED: COORD_TEST_ETCD_ENDPOINTS is unset (start etcd with scripts/start-etcd.sh)"
        );
        return;
    };
    let rt = bench_runtime();
    let s = rt.block_on(setup(&endpoints));
    let mut c = Criterion::default().configure_from_args();
    {
        let mut group = c.benchmark_group("txn");
        group.bench_function("coord", |b| b.to_async(&rt).iter(|| coord_txn(&s)));
        group.bench_function("raw", |b| b.to_async(&rt).iter(|| raw_txn(&s)));
        group.finish();
    }
    {
        let mut group = c.benchmark_group("snapshot");
        group.bench_function("coord", |b| b.to_async(&rt).iter(|| coord_snapshot(&s)));
        group.bench_function("raw", |b| b.to_async(&rt).iter(|| raw_get(&s)));
        group.finish();
    }
    c.final_summary();

    let rounds = 10;
    let ((coord_t, raw_t), (coord_s, raw_s)) = rt.block_on(async {
        (
            interleaved(&s, true, rounds).await,
            interleaved(&s, false, rounds).await,
        )
    });
    println!("summary (one client, one op at a time, coord and raw alternating in 200 ms slices, {rounds} rounds):");
    println!(
        "  txn      coord {coord_t:>8.0} ops/s   raw compare+put txn {raw_t:>8.0} ops/s   ratio {:.2}   round trips/op 1 vs 1",
        coord_t / raw_t
    );
    println!(
        "  snapshot coord {coord_s:>8.0} ops/s   raw get             {raw_s:>8.0} ops/s   ratio {:.2}   round trips/op 1 vs 1",
        coord_s / raw_s
    );
}
