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
//! Per store, three measurements on one warm client, sequential (one caller,
//! uncontended):
//!
//! - **raw txn**: `Backend::txn` asserting one key's version and putting it
//!   (a 128-byte value): one round trip, the floor every adapter operation
//!   pays. `3 × raw` is the ideal for an execute (acquire + ownership check +
//!   complete).
//! - **execute**: `Runner::execute` of a fresh idempotency key on one of
//!   [`RESOURCES`] resources, with an apply step that does nothing but return
//!   the fence. Every execute must answer `Applied`.
//! - **replay**: `Runner::execute` of a key completed moments before: the
//!   stored result comes back, the apply step is not called (ideal: one round
//!   trip, the assert-only txn that confirms the cached "completed").
//!
//! Round trips are the side-effect adapter's CAS-engine counters (snapshots +
//! txns) divided by the executes; rejected txns are counted in them too.
//! Each measurement runs for `COORD_BENCH_SECS` seconds (default 2), split in
//! [`SLICES`] slices interleaved with the other two measurements, so drifting
//! load on a shared machine hits all three alike. Stores whose `COORD_TEST_*`
//! variable is unset print SKIPPED. Without `--bench` (`cargo test
//! --benches`) every measurement runs 0.1 s, as a smoke test.

mod common;
use common::unique;

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::sideeffect::{Action, EffectResult, Outcome, Runner, SideEffectAdapter};
use coord_backend::{Assert, Backend, BackendExt, Mutation, Version};

/// Resources the executes cycle over (a small, warm set).
const RESOURCES: usize = 4;
/// Keys the raw baseline cycles over.
const RAW_KEYS: usize = 4;
/// Each measurement's time is split into this many interleaved slices.
const SLICES: u32 = 4;
/// Completed keys the replay measurement cycles over (recent, so warm).
const REPLAY_KEYS: usize = 256;
/// Executes before measuring (connections, prepared statements, scripts, cache).
const WARMUP: usize = 20;
const TTL: Duration = Duration::from_secs(30);
const TARGET_ROUND_TRIPS: f64 = 3.0;

/// Calls and time of one measurement, summed over its slices.
#[derive(Default)]
struct Tally {
    calls: u64,
    busy: Duration,
    round_trips: u64,
    rejections: u64,
    latencies: Vec<Duration>,
}

impl Tally {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.busy.as_secs_f64().max(f64::EPSILON)
    }

    fn mean_us(&self) -> f64 {
        self.busy.as_secs_f64() * 1e6 / self.calls.max(1) as f64
    }

    fn p99_us(&mut self) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() as f64) * 0.99).ceil() as usize;
        self.latencies[i.clamp(1, self.latencies.len()) - 1].as_secs_f64() * 1e6
    }

    fn per_call(&self, n: u64) -> f64 {
        n as f64 / self.calls.max(1) as f64
    }
}

struct Bench {
    backend: Arc<dyn Backend>,
    adapter: Arc<SideEffectAdapter>,
    runner: Runner,
    run: String,
    raw_versions: Vec<Version>,
    next_raw: usize,
    next_key: u64,
    completed: Vec<String>,
    next_replay: usize,
}

impl Bench {
    async fn open(url: &str, run: String) -> Bench {
        let backend = coord::connect(url)
            .await
            .unwrap_or_else(|e| panic!("connect {url}: {e}"));
        let adapter = Arc::new(SideEffectAdapter::new(backend.clone()));
        let runner = Runner::new(adapter.clone());
        let mut raw_versions = Vec::with_capacity(RAW_KEYS);
        for i in 0..RAW_KEYS {
            raw_versions.push(
                backend
                    .get(&format!("bench/raw/{run}/{i}"))
                    .await
                    .expect("read raw key")
                    .version,
            );
        }
        Bench {
            backend,
            adapter,
            runner,
            run,
            raw_versions,
            next_raw: 0,
            next_key: 0,
            completed: Vec::new(),
            next_replay: 0,
        }
    }

    /// One conditional write: assert the key's version, put it.
    async fn raw_txn(&mut self) {
        let i = self.next_raw % RAW_KEYS;
        self.next_raw += 1;
        let key = format!("bench/raw/{}/{i}", self.run);
        let out = self
            .backend
            .txn(
                &[Assert::at(key.clone(), self.raw_versions[i])],
                &[Mutation::put(key, vec![b'x'; 128])],
            )
            .await
            .expect("raw txn");
        assert!(out.applied, "raw txn rejected: nobody else writes its key");
        self.raw_versions[i] = Version(self.raw_versions[i].0 + 1);
    }

    /// One execute of a fresh key; it must apply.
    async fn execute_fresh(&mut self) {
        let n = self.next_key;
        self.next_key += 1;
        let key = format!("bench/{}/{n}", self.run);
        let action = Action::new(key.clone(), format!("bench-res-{}", n as usize % RESOURCES));
        let execution = self
            .runner
            .execute(&action, TTL, |lease| async move {
                Ok::<_, std::io::Error>(EffectResult::from(lease.fence.0.to_string().as_bytes()))
            })
            .await
            .expect("execute");
        assert_eq!(
            execution.outcome,
            Outcome::Applied,
            "a fresh key on a free resource must apply"
        );
        if self.completed.len() < REPLAY_KEYS {
            self.completed.push(key);
        } else {
            let slot = n as usize % REPLAY_KEYS;
            self.completed[slot] = key;
        }
    }

    /// One execute of a completed key; it must replay without applying.
    async fn execute_replay(&mut self) {
        let key = self.completed[self.next_replay % self.completed.len()].clone();
        self.next_replay += 1;
        // The resource of a replayed key is not read (the key decides first).
        let action = Action::new(key, "bench-res-0");
        let execution = self
            .runner
            .execute(&action, TTL, |_lease| async {
                Err::<EffectResult, _>(std::io::Error::other("a completed key was applied again"))
            })
            .await
            .expect("replay");
        assert_eq!(execution.outcome, Outcome::Replayed);
    }
}

#[derive(Clone, Copy)]
enum Op {
    Raw,
    Execute,
    Replay,
}

/// Run `op` for `slice`, adding to `tally`.
async fn slice(bench: &mut Bench, op: Op, slice: Duration, tally: &mut Tally) {
    let before = bench.adapter.engine().stats();
    let started = Instant::now();
    let deadline = started + slice;
    loop {
        let t = Instant::now();
        match op {
            Op::Raw => bench.raw_txn().await,
            Op::Execute => bench.execute_fresh().await,
            Op::Replay => bench.execute_replay().await,
        }
        let done = Instant::now();
        tally.latencies.push(done - t);
        tally.calls += 1;
        if done >= deadline {
            break;
        }
    }
    tally.busy += started.elapsed();
    let after = bench.adapter.engine().stats();
    tally.round_trips += after.round_trips() - before.round_trips();
    tally.rejections += after.rejections - before.rejections;
}

/// The three measurements of one store: (raw, execute, replay).
async fn measure(url: &str, run: String, secs: f64) -> (Tally, Tally, Tally) {
    let mut bench = Bench::open(url, run).await;
    for _ in 0..WARMUP {
        bench.raw_txn().await;
        bench.execute_fresh().await;
        bench.execute_replay().await;
    }
    let per_slice = Duration::from_secs_f64(secs / f64::from(SLICES));
    let (mut raw, mut exec, mut replay) = (Tally::default(), Tally::default(), Tally::default());
    for _ in 0..SLICES {
        slice(&mut bench, Op::Raw, per_slice, &mut raw).await;
        slice(&mut bench, Op::Execute, per_slice, &mut exec).await;
        slice(&mut bench, Op::Replay, per_slice, &mut replay).await;
    }
    (raw, exec, replay)
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
            runtime.block_on(measure(&url, format!("{store}-{run}"), secs));
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
