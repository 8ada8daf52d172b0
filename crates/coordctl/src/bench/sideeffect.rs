//! What at-most-once costs: `Runner::execute` next to the store's own
//! one-round-trip conditional write, on one warm client, one caller,
//! uncontended. Shared by `coordctl bench` and `cargo bench -p coordctl
//! --bench sideeffect` (included there with `#[path]`, next to `measure.rs`).
//!
//! Three measurements, interleaved slice by slice (see `measure.rs`):
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
//! txns) divided by the calls; rejected txns are counted in them too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use coord_adapters::sideeffect::{Action, EffectResult, Outcome, Runner, SideEffectAdapter};
use coord_backend::{Assert, Backend, BackendExt, Mutation, Version};

use super::measure::{Budget, Failure, Tally};

/// Resources the executes cycle over (a small, warm set).
pub(crate) const RESOURCES: usize = 4;
/// Keys the raw baseline cycles over.
const RAW_KEYS: usize = 4;
/// Completed keys the replay measurement cycles over (recent, so warm).
const REPLAY_KEYS: usize = 256;
/// Lease of each execute.
const TTL: Duration = Duration::from_secs(30);

/// The fixture: one store, one side-effect adapter, the keys measured.
pub(crate) struct Bench {
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

/// One of the three measurements.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// One conditional write through `Backend::txn`.
    Raw,
    /// `Runner::execute` of a fresh key.
    Execute,
    /// `Runner::execute` of a completed key.
    Replay,
}

impl Bench {
    /// Open `backend` for a run whose keys all contain `run`.
    pub(crate) async fn open(backend: Arc<dyn Backend>, run: String) -> Result<Bench, Failure> {
        let adapter = Arc::new(SideEffectAdapter::new(backend.clone()));
        let runner = Runner::new(adapter.clone());
        let mut raw_versions = Vec::with_capacity(RAW_KEYS);
        for i in 0..RAW_KEYS {
            let key = format!("bench/raw/{run}/{i}");
            let entry = backend
                .get(&key)
                .await
                .map_err(|e| format!("reading {key}: {e}"))?;
            raw_versions.push(entry.version);
        }
        Ok(Bench {
            backend,
            adapter,
            runner,
            run,
            raw_versions,
            next_raw: 0,
            next_key: 0,
            completed: Vec::new(),
            next_replay: 0,
        })
    }

    /// One conditional write: assert the key's version, put it.
    pub(crate) async fn raw_txn(&mut self) -> Result<(), Failure> {
        let i = self.next_raw % RAW_KEYS;
        self.next_raw += 1;
        let key = format!("bench/raw/{}/{i}", self.run);
        let out = self
            .backend
            .txn(
                &[Assert::at(key.clone(), self.raw_versions[i])],
                &[Mutation::put(key.clone(), vec![b'x'; 128])],
            )
            .await
            .map_err(|e| format!("raw txn on {key}: {e}"))?;
        if !out.applied {
            return Err(format!(
                "raw txn on {key} rejected: another writer uses the bench's keys"
            ));
        }
        // +1 per write from the first version on, which the store chooses
        // (an etcd namespace in floor mode starts at the create revision).
        self.raw_versions[i] = if self.raw_versions[i].is_missing() {
            self.backend
                .get(&key)
                .await
                .map_err(|e| format!("reading {key}: {e}"))?
                .version
        } else {
            Version(self.raw_versions[i].0 + 1)
        };
        Ok(())
    }

    /// One execute of a fresh key; it must apply.
    pub(crate) async fn execute_fresh(&mut self) -> Result<(), Failure> {
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
            .map_err(|e| format!("execute {key}: {e}"))?;
        expect_outcome(&key, "fresh", execution.outcome, Outcome::Applied)?;
        if self.completed.len() < REPLAY_KEYS {
            self.completed.push(key);
        } else {
            let slot = n as usize % REPLAY_KEYS;
            self.completed[slot] = key;
        }
        Ok(())
    }

    /// One execute of a completed key; it must replay without applying.
    pub(crate) async fn execute_replay(&mut self) -> Result<(), Failure> {
        if self.completed.is_empty() {
            self.execute_fresh().await?;
        }
        let key = self.completed[self.next_replay % self.completed.len()].clone();
        self.next_replay += 1;
        // The resource of a replayed key is not read (the key decides first).
        let action = Action::new(key.clone(), "bench-res-0");
        let execution = self
            .runner
            .execute(&action, TTL, |_lease| async {
                Err::<EffectResult, _>(std::io::Error::other("a completed key was applied again"))
            })
            .await
            .map_err(|e| format!("replay {key}: {e}"))?;
        expect_outcome(&key, "completed", execution.outcome, Outcome::Replayed)
    }

    async fn call(&mut self, op: Op) -> Result<(), Failure> {
        match op {
            Op::Raw => self.raw_txn().await,
            Op::Execute => self.execute_fresh().await,
            Op::Replay => self.execute_replay().await,
        }
    }

    /// Run `op` for one slice of `budget`, adding to `tally` (with the
    /// adapter's round trips and rejections).
    pub(crate) async fn slice(
        &mut self,
        op: Op,
        budget: Budget,
        tally: &mut Tally,
    ) -> Result<(), Failure> {
        let before = self.adapter.engine().stats();
        let started = Instant::now();
        let mut calls = 0;
        while !budget.done(started, calls) {
            let t = Instant::now();
            self.call(op).await?;
            tally.record(t.elapsed());
            calls += 1;
        }
        let after = self.adapter.engine().stats();
        tally.round_trips += after.round_trips() - before.round_trips();
        tally.rejections += after.rejections - before.rejections;
        Ok(())
    }
}

/// The three measurements of one store: (raw, execute, replay), each run for
/// `budget` split in `slices` interleaved slices after `warmup` calls of each.
/// `on_slice` is called after every slice.
pub(crate) async fn measure(
    backend: Arc<dyn Backend>,
    run: String,
    budget: Budget,
    slices: u32,
    warmup: u32,
    mut on_slice: impl FnMut(),
) -> Result<(Tally, Tally, Tally), Failure> {
    let mut bench = Bench::open(backend, run).await?;
    for _ in 0..warmup {
        bench.raw_txn().await?;
        bench.execute_fresh().await?;
        bench.execute_replay().await?;
    }
    let (mut raw, mut exec, mut replay) = (Tally::default(), Tally::default(), Tally::default());
    for index in 0..slices.max(1) {
        let per_slice = budget.slice(index, slices);
        for (op, tally) in [
            (Op::Raw, &mut raw),
            (Op::Execute, &mut exec),
            (Op::Replay, &mut replay),
        ] {
            bench.slice(op, per_slice, tally).await?;
            on_slice();
        }
    }
    Ok((raw, exec, replay))
}

/// An execute of the `state` (fresh, completed) key `key` must answer `want`.
fn expect_outcome(key: &str, state: &str, got: Outcome, want: Outcome) -> Result<(), Failure> {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "execute of the {state} key {key} answered {got:?}, not {want:?}"
        ))
    }
}
