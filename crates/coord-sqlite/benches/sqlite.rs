//! The primitives on memory and SQLite, next to a raw sqlx baseline measured
//! in the same run: one conditional `UPDATE … WHERE k = ? AND version = ?`
//! (and one point `SELECT`) on a comparable table in the same kind of file
//! (WAL, same `synchronous`, same busy timeout).
//!
//! `cargo bench -p coord-sqlite --bench sqlite -- --warm-up-time 1 --measurement-time 3`

use std::future::Future;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{Assert, Backend, Mutation, Version};
use coord_conformance::support::bench_runtime;
use coord_memory::SingleProcessMemoryBackend;
use coord_sqlite::{Durability, SqliteBackend, SqliteOptions};
use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion};
use sqlx::sqlite::SqliteSynchronous;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use tokio::runtime::Runtime;

const VALUE: [u8; 64] = [7; 64];
const KEYS: [&str; 8] = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];

fn bench_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coord-sqlite-bench");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn sqlite(path: &Path, durability: Durability) -> Arc<dyn Backend> {
    let mut options = SqliteOptions::default();
    options.durability = durability;
    let store = SqliteBackend::open_with(path, "bench", options)
        .await
        .unwrap();
    Arc::new(store)
}

/// The raw baseline's table, in a file opened like coord-sqlite opens its own.
async fn raw(path: &Path, durability: Durability) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5))
        .synchronous(match durability {
            Durability::Normal => SqliteSynchronous::Normal,
            _ => SqliteSynchronous::Full,
        });
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS t (k TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL, \
         value BLOB) STRICT, WITHOUT ROWID",
    )
    .execute(&pool)
    .await
    .unwrap();
    for key in KEYS {
        sqlx::query("INSERT INTO t (k, version, value) VALUES (?, 1, ?)")
            .bind(key)
            .bind(&VALUE[..])
            .execute(&pool)
            .await
            .unwrap();
    }
    pool
}

async fn seed(store: &Arc<dyn Backend>) {
    let puts: Vec<_> = KEYS.iter().map(|k| Mutation::put(*k, VALUE)).collect();
    assert!(store.txn(&[], &puts).await.unwrap().applied);
}

fn snapshots(c: &mut Criterion) {
    let rt = bench_runtime();
    let dir = bench_dir();
    let memory: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("bench").unwrap());
    let sqlite = rt.block_on(sqlite(&dir.join("snapshot.db"), Durability::Full));
    let pool = rt.block_on(raw(&dir.join("raw-snapshot.db"), Durability::Full));
    rt.block_on(seed(&memory));
    rt.block_on(seed(&sqlite));
    let one = vec![KEYS[0].to_owned()];
    let eight: Vec<String> = KEYS.iter().map(|k| k.to_string()).collect();

    let mut group = c.benchmark_group("snapshot");
    for (name, store) in [("memory", &memory), ("sqlite", &sqlite)] {
        group.bench_function(format!("{name}/1key"), |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(store.snapshot(&one).await.unwrap()) })
        });
        group.bench_function(format!("{name}/8keys"), |b| {
            b.to_async(&rt)
                .iter(|| async { black_box(store.snapshot(&eight).await.unwrap()) })
        });
    }
    group.bench_function("raw_select/1key", |b| {
        b.to_async(&rt).iter(|| async {
            let row: (i64, Vec<u8>) = sqlx::query_as("SELECT version, value FROM t WHERE k = ?")
                .bind(KEYS[0])
                .fetch_one(&pool)
                .await
                .unwrap();
            black_box(row)
        })
    });
    group.finish();
}

/// Benchmarks `write(v)` as `name`: one uncontended CAS of `KEYS[0]` that
/// knows its version `v`, which starts at 1 and goes up by one a write.
fn bench_cas<F, Fut>(group: &mut BenchmarkGroup<'_, WallTime>, rt: &Runtime, name: String, write: F)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = ()>,
{
    let version = AtomicU64::new(1);
    group.bench_function(name, |b| {
        b.to_async(rt).iter(|| async {
            let v = version.load(Ordering::Relaxed);
            write(v).await;
            version.store(v + 1, Ordering::Relaxed);
        })
    });
}

fn txns(c: &mut Criterion) {
    let rt = bench_runtime();
    let dir = bench_dir();
    let mut group = c.benchmark_group("txn_cas_1key");

    let cas = |name: String, store: Arc<dyn Backend>, group: &mut BenchmarkGroup<'_, WallTime>| {
        rt.block_on(seed(&store));
        bench_cas(group, &rt, name, |v| {
            let store = store.clone();
            async move {
                let out = store
                    .txn(
                        &[Assert::at(KEYS[0], Version(v))],
                        &[Mutation::put(KEYS[0], VALUE)],
                    )
                    .await
                    .unwrap();
                assert!(out.applied);
            }
        });
    };
    let raw_cas = |name: String, pool: SqlitePool, group: &mut BenchmarkGroup<'_, WallTime>| {
        bench_cas(group, &rt, name, |v| {
            let pool = pool.clone();
            async move {
                let done = sqlx::query(
                    "UPDATE t SET value = ?, version = version + 1 WHERE k = ? AND version = ?",
                )
                .bind(&VALUE[..])
                .bind(KEYS[0])
                .bind(v as i64)
                .execute(&pool)
                .await
                .unwrap();
                assert_eq!(done.rows_affected(), 1);
            }
        });
    };

    let memory: Arc<dyn Backend> = Arc::new(SingleProcessMemoryBackend::new("bench").unwrap());
    cas("memory".into(), memory, &mut group);
    for (label, durability) in [("full", Durability::Full), ("normal", Durability::Normal)] {
        let store = rt.block_on(sqlite(&dir.join(format!("txn-{label}.db")), durability));
        cas(format!("sqlite/{label}"), store, &mut group);
        let pool = rt.block_on(raw(&dir.join(format!("raw-{label}.db")), durability));
        raw_cas(format!("raw_update/{label}"), pool, &mut group);
    }
    group.finish();
}

criterion_group!(benches, snapshots, txns);
criterion_main!(benches);
