//! Random sequences of the three primitives, run against the store and a
//! small reference model side by side (proptest, shrinking to a minimal
//! failing sequence).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use coord_backend::{Assert, Entry, Mutation, TxnOutcome, Version};
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

use super::names;
use crate::{ensure, unique_namespace, BackendFactory, CheckResult, Failure};

/// Options of [`model_sequences`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelOptions {
    /// Random sequences to run (each in a fresh namespace).
    pub cases: u32,
    /// Most operations in one sequence.
    pub max_ops: usize,
    /// Seed of the generator; `None` = random (the failure message names the seed used).
    pub seed: Option<u64>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        ModelOptions {
            cases: 64,
            max_ops: 30,
            seed: None,
        }
    }
}

/// A small alphabet with keys that are prefixes of each other and look like patterns.
const MODEL_KEYS: &[&str] = &["a", "ab", "a_b", "a%", "b", "é"];
const MODEL_PREFIXES: &[&str] = &["", "a", "a_", "a%", "ab", "b", "e", "é", "x"];
const MODEL_VALUES: &[&[u8]] = &[b"", b"x", b"yy", &[0, 255]];

/// Which version an assert of a generated txn names, resolved against the
/// model when the operation runs (so "correct" stays correct after shrinking).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// The key's current version.
    Current,
    /// Version 0 (true only when the key is missing).
    Missing,
    /// The current version plus this (always false).
    Ahead(u64),
    /// This exact version (true only by coincidence).
    Exactly(u64),
}

/// One generated operation; printed as the minimal failing sequence.
#[derive(Clone, PartialEq, Eq)]
enum Op {
    Snapshot(Vec<&'static str>),
    Txn {
        asserts: Vec<(&'static str, Expect)>,
        /// `None` = delete.
        mutations: Vec<(&'static str, Option<&'static [u8]>)>,
    },
    Keys(&'static str),
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Snapshot(keys) => write!(f, "snapshot {keys:?}"),
            Op::Keys(prefix) => write!(f, "keys {prefix:?}"),
            Op::Txn { asserts, mutations } => {
                write!(f, "txn asserts [")?;
                for (i, (key, expect)) in asserts.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    match expect {
                        Expect::Current => write!(f, "{sep}{key:?}@current")?,
                        Expect::Missing => write!(f, "{sep}{key:?}@missing")?,
                        Expect::Ahead(n) => write!(f, "{sep}{key:?}@current+{n}")?,
                        Expect::Exactly(v) => write!(f, "{sep}{key:?}@v{v}")?,
                    }
                }
                write!(f, "] mutations [")?;
                for (i, (key, value)) in mutations.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    match value {
                        Some(v) => write!(f, "{sep}put {key:?}={v:?}")?,
                        None => write!(f, "{sep}delete {key:?}")?,
                    }
                }
                write!(f, "]")
            }
        }
    }
}

fn op_strategy() -> impl Strategy<Value = Op> {
    use proptest::prelude::*;
    use proptest::sample::select;
    let key = select(MODEL_KEYS);
    let expect = prop_oneof![
        3 => Just(Expect::Current),
        1 => Just(Expect::Missing),
        1 => (1u64..3).prop_map(Expect::Ahead),
        1 => (0u64..4).prop_map(Expect::Exactly),
    ];
    let snapshot = proptest::collection::vec(key.clone(), 0..5).prop_map(Op::Snapshot);
    let txn = (
        proptest::collection::vec((key.clone(), expect), 0..4),
        proptest::collection::vec((key, proptest::option::of(select(MODEL_VALUES))), 0..4),
    )
        .prop_map(|(asserts, mutations)| {
            // A repeated assert repeats the first one's expectation (two
            // different versions for one key would be invalid input); a key is
            // written at most once per txn.
            let mut first: HashMap<&str, Expect> = HashMap::new();
            let asserts = asserts
                .into_iter()
                .map(|(k, e)| (k, *first.entry(k).or_insert(e)))
                .collect();
            let mut written = HashSet::new();
            let mutations = mutations
                .into_iter()
                .filter(|(k, _)| written.insert(*k))
                .collect();
            Op::Txn { asserts, mutations }
        });
    let keys = select(MODEL_PREFIXES).prop_map(Op::Keys);
    prop_oneof![2 => snapshot, 5 => txn, 2 => keys]
}

/// The reference: the memory store's semantics in a few lines.
#[derive(Default)]
struct Model {
    /// key -> (hidden counter, value); `None` = tombstone.
    cells: BTreeMap<String, (u64, Option<Vec<u8>>)>,
}

impl Model {
    fn entry(&self, key: &str) -> Entry {
        match self.cells.get(key) {
            Some((version, Some(value))) => Entry::present(key, Version(*version), value.clone()),
            _ => Entry::missing(key),
        }
    }

    fn snapshot(&self, keys: &[String]) -> Vec<Entry> {
        let mut seen = HashSet::new();
        keys.iter()
            .filter(|k| seen.insert(k.as_str()))
            .map(|k| self.entry(k))
            .collect()
    }

    fn txn(&mut self, asserts: &[Assert], mutations: &[Mutation]) -> TxnOutcome {
        if asserts
            .iter()
            .any(|a| self.entry(&a.key).version != a.version)
        {
            let keys: Vec<String> = asserts.iter().map(|a| a.key.clone()).collect();
            return TxnOutcome::rejected(self.snapshot(&keys));
        }
        let mut written = Vec::new();
        for mutation in mutations {
            let cell = self.cells.entry(mutation.key().to_owned()).or_default();
            cell.0 += 1;
            cell.1 = match mutation {
                Mutation::Put { value, .. } => {
                    written.push((mutation.key().to_owned(), Version(cell.0)));
                    Some(value.clone())
                }
                Mutation::Delete { .. } => None,
            };
        }
        // Every put's version: a store may report any of them.
        TxnOutcome::applied_at(written)
    }

    fn keys(&self, prefix: &str) -> Vec<String> {
        self.cells
            .iter()
            .filter(|(k, (_, v))| k.starts_with(prefix) && v.is_some())
            .map(|(k, _)| k.clone())
            .collect()
    }
}

async fn run_sequence(factory: BackendFactory, ops: Vec<Op>) -> CheckResult {
    let backend = factory(unique_namespace("model")).await?;
    let mut model = Model::default();
    for (i, op) in ops.iter().enumerate() {
        let context =
            |e: coord_backend::Error| Failure::new(format!("op #{i} ({op:?}): store error: {e}"));
        match op {
            Op::Snapshot(keys) => {
                let keys = names(keys);
                let got = backend.snapshot(&keys).await.map_err(context)?;
                let want = model.snapshot(&keys);
                ensure!(
                    got == want,
                    "op #{i} ({op:?}): the store returned {got:?}, the model {want:?}"
                );
            }
            Op::Keys(prefix) => {
                let got = backend.keys(prefix).await.map_err(context)?;
                let want = model.keys(prefix);
                ensure!(
                    got == want,
                    "op #{i} ({op:?}): the store listed {got:?}, the model {want:?}"
                );
            }
            Op::Txn { asserts, mutations } => {
                let asserts: Vec<Assert> = asserts
                    .iter()
                    .map(|(key, expect)| {
                        let current = model.entry(key).version.0;
                        let version = match expect {
                            Expect::Current => current,
                            Expect::Missing => 0,
                            Expect::Ahead(n) => current + n,
                            Expect::Exactly(v) => *v,
                        };
                        Assert::at(*key, Version(version))
                    })
                    .collect();
                let mutations: Vec<Mutation> = mutations
                    .iter()
                    .map(|(key, value)| match value {
                        Some(v) => Mutation::put(*key, v.to_vec()),
                        None => Mutation::delete(*key),
                    })
                    .collect();
                let got = backend.txn(&asserts, &mutations).await.map_err(context)?;
                let want = model.txn(&asserts, &mutations);
                // A store reports none, some or all of its puts' versions.
                let reported_right = got.written.iter().all(|w| want.written.contains(w));
                ensure!(
                    got.applied == want.applied && got.current == want.current && reported_right,
                    "op #{i} ({op:?}, asserts resolved to {asserts:?}): the store answered \
                     {got:?}, the model {want:?}"
                );
            }
        }
    }
    Ok(())
}

/// Random sequences of snapshot / txn (asserts at current, missing, wrong and
/// arbitrary versions; puts and deletes) / keys(prefix) on a small key
/// alphabet, each in a fresh namespace, compared answer by answer with a
/// reference model (a map with tombstone counters). On a difference proptest
/// shrinks the sequence and the failure names the minimal one and the seed.
///
/// Needs a multi-thread tokio runtime: proptest's runner is synchronous, so
/// it runs inside [`tokio::task::block_in_place`] and drives each sequence
/// with the current runtime's handle (stores whose clients are bound to the
/// runtime keep working).
///
/// ```
/// use std::sync::Arc;
/// use coord_backend::Backend;
/// use coord_conformance::backend::{model_sequences, ModelOptions};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
/// # async fn main() {
/// let factory = coord_conformance::factory(|namespace| async move {
///     Ok(Arc::new(SingleProcessMemoryBackend::new(&namespace)?) as Arc<dyn Backend>)
/// });
/// let mut options = ModelOptions::default();
/// options.cases = 8;
/// options.seed = Some(7); // replay the seed a failure message named
/// model_sequences(factory, options).await.unwrap();
/// # }
/// ```
pub async fn model_sequences(factory: BackendFactory, options: ModelOptions) -> CheckResult {
    let handle = tokio::runtime::Handle::try_current()
        .map_err(|e| Failure::new(format!("model_sequences needs a tokio runtime: {e}")))?;
    ensure!(
        handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread,
        "model_sequences needs a multi-thread tokio runtime \
         (#[tokio::test(flavor = \"multi_thread\")]): it blocks one worker while proptest runs"
    );
    let seed = options.seed.unwrap_or_else(rand::random);
    let config = Config {
        cases: options.cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        // Bounded so a broken network store cannot shrink for minutes.
        max_shrink_iters: 2_000,
        max_shrink_time: 60_000,
        ..Config::default()
    };
    let strategy = proptest::collection::vec(op_strategy(), 1..=options.max_ops.max(1));
    let result = tokio::task::block_in_place(|| {
        let mut runner = TestRunner::new(config);
        runner.run(&strategy, |ops| {
            handle
                .block_on(run_sequence(factory.clone(), ops))
                .map_err(|failure| TestCaseError::fail(failure.message))
        })
    });
    match result {
        Ok(()) => Ok(()),
        Err(TestError::Fail(reason, ops)) => {
            let listing: String = ops
                .iter()
                .enumerate()
                .map(|(i, op)| format!("\n  #{i}: {op:?}"))
                .collect();
            Err(Failure::new(format!(
                "a random sequence failed against the reference model (seed {seed}): {reason}\n\
                 minimal failing sequence ({} ops, each in a fresh namespace):{listing}",
                ops.len()
            )))
        }
        Err(TestError::Abort(reason)) => Err(Failure::new(format!(
            "model test aborted (seed {seed}): {reason}"
        ))),
    }
}
