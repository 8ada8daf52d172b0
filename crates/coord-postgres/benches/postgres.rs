//! coord-postgres next to a raw sqlx baseline measured in the same run, on the
//! same server, through pools configured alike:
//!
//! - `txn` (one `coord_txn` call: assert `k @ v`, put `k`) vs `raw_update`:
//!   `UPDATE coord_bench_raw SET value = $1, version = version + 1 WHERE k = $2 AND version = $3`;
//! - `snapshot` (one key) vs `raw_select`: `SELECT version, value … WHERE k = $1`.
//!
//! Both with the server's durable commits and with `synchronous_commit=off`
//! on both sides (which leaves the CPU cost of the function visible).
//! After criterion, an interleaved loop prints ops/s and the ratios, and a
//! counting proxy prints client→server flushes per op (round trips, plus the
//! Sync ping sqlx sends when a connection returns to its pool).
//!
//! `COORD_TEST_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!  cargo bench -p coord-postgres --bench postgres -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_backend::{Assert, Backend, Mutation, StoreUrl, Version};
use coord_conformance::support::bench_runtime;
use coord_postgres::{PostgresBackend, PostgresOptions};
use criterion::{criterion_group, criterion_main, Criterion};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const VALUE: [u8; 64] = [7; 64];
const KEY: &str = "k";
const RAW_UPDATE: &str =
    "UPDATE coord_bench_raw SET value = $1, version = version + 1 WHERE k = $2 AND version = $3";
const RAW_SELECT: &str = "SELECT version, value FROM coord_bench_raw WHERE k = $1";

fn base_url() -> Option<String> {
    coord_conformance::server_env("COORD_TEST_POSTGRES_URL")
}

fn with_params(base: &str, params: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{params}")
}

/// The store and its version tracker (one writer: every txn must apply).
struct Coord {
    store: PostgresBackend,
    version: AtomicU64,
}

async fn coord(url: &str) -> Coord {
    let namespace = format!("bench{:x}", std::process::id());
    let url = StoreUrl::parse(&with_params(url, &format!("namespace={namespace}"))).unwrap();
    let store =
        PostgresBackend::connect_with(&url, PostgresOptions::default().with_max_connections(4))
            .await
            .unwrap();
    let version = store
        .snapshot(&[KEY.to_owned()])
        .await
        .unwrap()
        .remove(0)
        .version;
    Coord {
        store,
        version: AtomicU64::new(version.0),
    }
}

async fn coord_txn(c: &Coord) {
    let v = c.version.load(Ordering::Relaxed);
    let out = c
        .store
        .txn(
            &[Assert::at(KEY, Version(v))],
            &[Mutation::put(KEY, VALUE.to_vec())],
        )
        .await
        .unwrap();
    assert!(out.applied);
    c.version.store(v + 1, Ordering::Relaxed);
}

async fn coord_snapshot(c: &Coord) {
    black_box(c.store.snapshot(&[KEY.to_owned()]).await.unwrap());
}

/// The baseline: a pool set up like the store's (no ping before use, same
/// statement timeout), a comparable table, and its version tracker.
struct Raw {
    pool: PgPool,
    version: AtomicU64,
}

async fn raw(url: &str) -> Raw {
    let options: PgConnectOptions = url.parse().unwrap();
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .connect_with(options.options([("statement_timeout", 5000)]))
        .await
        .unwrap();
    sqlx::raw_sql(
        r#"CREATE TABLE IF NOT EXISTS coord_bench_raw (
               k text COLLATE "C" PRIMARY KEY, version bigint NOT NULL, value bytea);
           INSERT INTO coord_bench_raw VALUES ('k', 0, NULL) ON CONFLICT DO NOTHING;"#,
    )
    .execute(&pool)
    .await
    .unwrap();
    let version: i64 = sqlx::query_scalar("SELECT version FROM coord_bench_raw WHERE k = 'k'")
        .fetch_one(&pool)
        .await
        .unwrap();
    Raw {
        pool,
        version: AtomicU64::new(version as u64),
    }
}

async fn raw_update(r: &Raw) {
    let v = r.version.load(Ordering::Relaxed);
    let done = sqlx::query(RAW_UPDATE)
        .bind(&VALUE[..])
        .bind(KEY)
        .bind(v as i64)
        .execute(&r.pool)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 1);
    r.version.store(v + 1, Ordering::Relaxed);
}

async fn raw_select(r: &Raw) {
    let row: (i64, Option<Vec<u8>>) = sqlx::query_as(RAW_SELECT)
        .bind(KEY)
        .fetch_one(&r.pool)
        .await
        .unwrap();
    black_box(row);
}

fn primitives(c: &mut Criterion) {
    let Some(url) = base_url() else { return };
    let rt = bench_runtime();
    // Durable commits (the server's default) are dominated by the WAL flush;
    // with `synchronous_commit=off` on both sides the CPU cost of the
    // function itself shows.
    let async_commit = with_params(&url, "options=-c%20synchronous_commit%3Doff");
    for (group_name, url) in [("postgres", &url), ("postgres_async_commit", &async_commit)] {
        let (store, baseline) = rt.block_on(async { (coord(url).await, raw(url).await) });
        let mut group = c.benchmark_group(group_name);
        group.bench_function("txn", |b| b.to_async(&rt).iter(|| coord_txn(&store)));
        group.bench_function("raw_update", |b| {
            b.to_async(&rt).iter(|| raw_update(&baseline))
        });
        group.bench_function("snapshot", |b| {
            b.to_async(&rt).iter(|| coord_snapshot(&store))
        });
        group.bench_function("raw_select", |b| {
            b.to_async(&rt).iter(|| raw_select(&baseline))
        });
        group.finish();
        println!("{group_name}:");
        rt.block_on(interleaved(&store, &baseline));
    }
    rt.block_on(flushes_per_op(&url));
}

/// Alternate short batches of each operation so drift hits all alike; print ops/s and ratios.
async fn interleaved(store: &Coord, baseline: &Raw) {
    const BATCH: u32 = 50;
    const ROUNDS: u32 = 40;
    let mut spent = [Duration::ZERO; 4];
    for round in 0..ROUNDS {
        // Alternate which side goes first, so neither always follows the other's background pings.
        let order: [usize; 4] = if round % 2 == 0 {
            [0, 1, 2, 3]
        } else {
            [1, 0, 3, 2]
        };
        for which in order {
            let t = Instant::now();
            for _ in 0..BATCH {
                match which {
                    0 => coord_txn(store).await,
                    1 => raw_update(baseline).await,
                    2 => coord_snapshot(store).await,
                    _ => raw_select(baseline).await,
                }
            }
            spent[which] += t.elapsed();
        }
    }
    let ops = f64::from(BATCH * ROUNDS);
    let per_sec = |d: Duration| ops / d.as_secs_f64();
    println!("interleaved, {} ops each, one task:", BATCH * ROUNDS);
    println!(
        "  txn        {:>8.0} ops/s   raw_update {:>8.0} ops/s   time ratio txn/raw = {:.2}",
        per_sec(spent[0]),
        per_sec(spent[1]),
        spent[0].as_secs_f64() / spent[1].as_secs_f64()
    );
    println!(
        "  snapshot   {:>8.0} ops/s   raw_select {:>8.0} ops/s   time ratio snapshot/raw = {:.2}",
        per_sec(spent[2]),
        per_sec(spent[3]),
        spent[2].as_secs_f64() / spent[3].as_secs_f64()
    );
}

/// A loopback proxy that counts client→server chunks (each one a flush the
/// client made). Used outside the timed runs.
async fn counting_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicU64::new(0));
    let counter = count.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let Ok(mut server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut cr, mut cw) = client.split();
                let (mut sr, mut sw) = server.split();
                let up = async {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        let n = cr.read(&mut buf).await?;
                        if n == 0 {
                            return Ok::<_, std::io::Error>(());
                        }
                        counter.fetch_add(1, Ordering::Relaxed);
                        sw.write_all(&buf[..n]).await?;
                    }
                };
                let down = tokio::io::copy(&mut sr, &mut cw);
                let _ = tokio::join!(up, down);
            });
        }
    });
    (addr, count)
}

async fn flushes_per_op(url: &str) {
    // Through the proxy in clear text (the proxy counts chunks, TLS would not change them).
    let options: PgConnectOptions = url.parse().unwrap();
    let upstream = tokio::net::lookup_host((options.get_host(), options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap();
    let (addr, count) = counting_proxy(upstream).await;
    let user = options.get_username();
    let db = options.get_database().unwrap_or("postgres");
    let proxied = format!("postgres://{user}@{addr}/{db}?sslmode=disable");
    let store = coord(&proxied).await;
    let baseline = raw(&proxied).await;
    // Warm up: pooled connections opened, statements prepared.
    coord_txn(&store).await;
    coord_snapshot(&store).await;
    raw_update(&baseline).await;
    raw_select(&baseline).await;
    tokio::time::sleep(Duration::from_millis(100)).await;

    const N: u64 = 200;
    let mut report = Vec::new();
    for name in ["txn", "raw_update", "snapshot", "raw_select"] {
        let before = count.load(Ordering::Relaxed);
        for _ in 0..N {
            match name {
                "txn" => coord_txn(&store).await,
                "raw_update" => raw_update(&baseline).await,
                "snapshot" => coord_snapshot(&store).await,
                _ => raw_select(&baseline).await,
            }
        }
        // Let the background release pings finish.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let flushes = count.load(Ordering::Relaxed) - before;
        report.push(format!("{name} {:.2}", flushes as f64 / N as f64));
    }
    println!(
        "client→server flushes per op (1 = the request; sqlx adds 1 Sync ping on release, \
         off the caller's path): {}",
        report.join(", ")
    );
}

criterion_group!(benches, primitives);
criterion_main!(benches);
