//! Snapshot and txn of coord-redis next to the raw floor of the same server
//! in the same run: `PING` (one round trip, no work) and a minimal `EVALSHA`
//! (`return 1`: one round trip plus the script machinery).
//!
//! ```text
//! COORD_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench -p coord-redis --bench redis
//! ```
//!
//! Prints criterion's timings, then a summary: ops/s of each (single client,
//! sequential calls), the txn/EVALSHA ratio, and the commands each operation
//! sent, counted from the server's `INFO commandstats` (client-sent commands
//! only: PING, EVAL, EVALSHA, SCRIPT; run it on a server nobody else uses for
//! exact counts). Environment: `COORD_BENCH_SECS` (criterion measurement
//! time per bench, default 2).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_backend::{Assert, Backend, Mutation, StoreUrl, Version};
use coord_redis::RedisBackend;
use criterion::Criterion;
use redis::aio::ConnectionManager;
use redis::Script;

struct Fixture {
    store: RedisBackend,
    raw: ConnectionManager,
    one: Script,
    /// The version of `cas` the next txn asserts (calls are sequential).
    version: Arc<AtomicU64>,
}

impl Fixture {
    async fn ping(&self) {
        let pong: String = redis::cmd("PING")
            .query_async(&mut self.raw.clone())
            .await
            .unwrap();
        assert_eq!(pong, "PONG");
    }

    async fn evalsha(&self) {
        let one: i64 = self.one.invoke_async(&mut self.raw.clone()).await.unwrap();
        assert_eq!(one, 1);
    }

    async fn snapshot(&self) {
        let entries = self.store.snapshot(&["cas".to_owned()]).await.unwrap();
        assert!(entries[0].exists());
    }

    async fn txn(&self) {
        let version = self.version.load(Ordering::Relaxed);
        let out = self
            .store
            .txn(
                &[Assert::at("cas", Version(version))],
                &[Mutation::put("cas", version.to_le_bytes().to_vec())],
            )
            .await
            .unwrap();
        assert!(out.applied, "the bench is the only writer of its namespace");
        self.version.store(version + 1, Ordering::Relaxed);
    }

    async fn run(&self, op: &str) {
        match op {
            "ping" => self.ping().await,
            "evalsha_return_1" => self.evalsha().await,
            "snapshot_1_key" => self.snapshot().await,
            "txn_cas_1_key" => self.txn().await,
            other => unreachable!("{other}"),
        }
    }
}

const OPS: [&str; 4] = [
    "ping",
    "evalsha_return_1",
    "snapshot_1_key",
    "txn_cas_1_key",
];

/// Client-sent commands so far, from `INFO commandstats`.
async fn client_commands(raw: &ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw.clone())
        .await
        .unwrap();
    info.lines()
        .filter(|line| {
            [
                "cmdstat_ping:",
                "cmdstat_eval:",
                "cmdstat_evalsha:",
                "cmdstat_script",
            ]
            .iter()
            .any(|p| line.starts_with(p))
        })
        .filter_map(|line| {
            let calls = line.split("calls=").nth(1)?;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

fn main() {
    let base = std::env::var("COORD_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let secs: u64 = std::env::var("COORD_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let fixture = rt.block_on(async {
        let ns = format!("bench-{:016x}", rand_u64());
        let url = StoreUrl::parse(&format!("{base}?namespace={ns}")).unwrap();
        let store = RedisBackend::connect(&url)
            .await
            .expect("bench needs a Redis server");
        let raw = ConnectionManager::new(redis::Client::open(base.as_str()).unwrap())
            .await
            .unwrap();
        let fixture = Fixture {
            store,
            raw,
            one: Script::new("return 1"),
            version: Arc::new(AtomicU64::new(0)),
        };
        fixture.txn().await; // creates `cas` and caches the scripts
        fixture.evalsha().await;
        fixture.snapshot().await;
        fixture
    });
    let fixture = Arc::new(fixture);

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(secs))
        .sample_size(20)
        .configure_from_args();
    {
        let mut group = criterion.benchmark_group("redis");
        for op in OPS {
            let fixture = fixture.clone();
            group.bench_function(op, |b| {
                b.to_async(&rt).iter(|| {
                    let fixture = fixture.clone();
                    async move { fixture.run(op).await }
                })
            });
        }
        group.finish();
    }
    criterion.final_summary();

    // The summary: same ops, measured back to back for the ratio and the command counts.
    let per_op = Duration::from_secs(secs);
    let rows: Vec<(&str, f64, f64)> = rt.block_on(async {
        let mut rows = Vec::new();
        for op in OPS {
            let before = client_commands(&fixture.raw).await;
            let started = Instant::now();
            let mut n = 0u64;
            while started.elapsed() < per_op {
                fixture.run(op).await;
                n += 1;
            }
            let elapsed = started.elapsed();
            // The INFO of `before` is not in the filter; nothing else of ours ran.
            let sent = client_commands(&fixture.raw).await - before;
            rows.push((op, n as f64 / elapsed.as_secs_f64(), sent as f64 / n as f64));
        }
        rows
    });
    println!("\nsummary ({base}, one client, sequential calls, {secs} s each):");
    println!(
        "{:<20} {:>12} {:>22}",
        "op", "ops/s", "commands sent per op"
    );
    for (op, rate, sent) in &rows {
        println!("{op:<20} {rate:>12.0} {sent:>22.2}");
    }
    let rate = |name: &str| rows.iter().find(|r| r.0 == name).map(|r| r.1).unwrap();
    println!(
        "txn/EVALSHA time ratio: {:.2}   snapshot/EVALSHA: {:.2}   EVALSHA/PING: {:.2}",
        rate("evalsha_return_1") / rate("txn_cas_1_key"),
        rate("evalsha_return_1") / rate("snapshot_1_key"),
        rate("ping") / rate("evalsha_return_1"),
    );
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    h.finish()
}
