//! The backend suite: the contract of the three primitives.
//!
//! Run it with [`backend_tests!`](crate::backend_tests) or call the checks directly.
//!
//! Every check is a plain `async fn`. Checks that take an `Arc<dyn Backend>`
//! expect an **empty namespace** (they refuse to run otherwise, so a leftover
//! key can never make a check pass or fail by accident); checks that take a
//! [`BackendFactory`](crate::BackendFactory) open several clients themselves, also several clients of
//! one namespace, so stores with per-client connections are raced for real.
//!
//! What the suite pins down (each bullet is one check):
//!
//! - [`concurrent_txn`]: exactly one of N racing writers commits;
//! - [`increment_race`]: W×M compare-and-swap increments from separate clients end at exactly W×M;
//! - [`snapshot_consistency`]: a snapshot never sees a multi-key txn half applied;
//! - [`disjoint_write_skew`]: two txns asserting `{A, B}`, one writing A and one B, never both commit;
//! - [`version_monotonic`]: +1 per write, deletes too, never reused after a re-create (ABA);
//! - [`reported_versions_are_stored`]: versions an applied txn reports for its puts are the stored ones;
//! - [`assert_missing`]: create-if-missing, also after a delete;
//! - [`all_or_nothing`]: one false assert writes nothing; puts and deletes of one txn apply together;
//! - [`rejected_txn_current`]: a rejected txn returns the true current entries of the asserted keys;
//! - [`snapshot_semantics`]: duplicates once, missing keys as version 0, order of first appearance;
//! - [`keys_literal_prefix`]: sorted, no deleted keys, prefixes are data (`%`, `_`, `*`, `[`, `\`, é, 中, …);
//! - [`namespace_isolation`]: namespaces `Xa`, `Xab`, `Xa:b` never see each other;
//! - [`bad_input`]: [`Error::InvalidInput`](coord_backend::Error::InvalidInput) and nothing stored changes;
//! - [`large_values`]: a value of exactly the size limit, and an empty value, round-trip byte-exact;
//! - [`model_sequences`]: random sequences of the three primitives against a reference model (proptest, shrinking).
//!
//! Not in the suite, for stores that report the version of every put (run from their own tests):
//! [`every_put_reports_its_version`], also over a tombstone and after a reclaim.
//!
//! The boundary: these checks observe a store only through the [`Backend`]
//! trait. What the trait cannot show (durability, replication, behaviour when
//! the connection breaks) belongs to the store's own tests and to
//! [`crate::fault`].
//!
//! Layout: the checks live in one private file per theme (`races`, `txn`,
//! `reads`, `limits`, `model`) and are re-exported here, so each keeps its
//! path `backend::<check>`; this file holds the helpers they share, the case
//! list and [`backend_tests!`](crate::backend_tests).

use coord_backend::{Assert, Backend, Entry, Mutation, TxnOutcome};

use crate::{ensure, CheckResult, Failure};

mod limits;
mod model;
mod races;
mod reads;
mod txn;

pub use limits::{bad_input, large_values};
pub use model::{model_sequences, ModelOptions};
pub use races::{
    concurrent_txn, disjoint_write_skew, increment_race, snapshot_consistency, IncrementRace,
    SnapshotRace,
};
pub use reads::{keys_literal_prefix, namespace_isolation, snapshot_semantics};
pub use txn::{
    all_or_nothing, assert_missing, every_put_reports_its_version, rejected_txn_current,
    reported_versions_are_stored, version_monotonic,
};

use races::{
    case_concurrent_txn, case_disjoint_write_skew, case_increment_race, case_snapshot_consistency,
};

async fn require_empty(backend: &dyn Backend, check: &str) -> CheckResult {
    let keys = backend.keys("").await?;
    ensure!(
        keys.is_empty(),
        "{check} needs an empty namespace; {:?} holds {keys:?}",
        backend.namespace()
    );
    Ok(())
}

/// The first write of a check: `mutations`, asserting nothing; it must apply.
async fn set_up(backend: &dyn Backend, mutations: &[Mutation]) -> CheckResult {
    must_apply(backend, &[], mutations, "setup").await
}

async fn get(backend: &dyn Backend, key: &str) -> Result<Entry, Failure> {
    let mut entries = backend.snapshot(&[key.to_owned()]).await?;
    ensure!(
        entries.len() == 1,
        "a snapshot of one key returned {} entries",
        entries.len()
    );
    Ok(entries.remove(0))
}

/// Run a txn that must apply (also used by the reclaim suite); its outcome.
pub(crate) async fn applied(
    backend: &dyn Backend,
    asserts: &[Assert],
    mutations: &[Mutation],
    what: &str,
) -> Result<TxnOutcome, Failure> {
    let outcome = backend.txn(asserts, mutations).await?;
    ensure!(
        outcome.applied,
        "{what}: txn was rejected, expected it to apply (current: {:?})",
        outcome.current
    );
    Ok(outcome)
}

/// Create `key` holding `value`, asserting it missing: a txn that must apply
/// (also used by the reclaim suite).
pub(crate) async fn created(
    backend: &dyn Backend,
    key: &str,
    value: impl Into<Vec<u8>>,
    what: &str,
) -> Result<TxnOutcome, Failure> {
    let put = Mutation::put(key, value);
    applied(backend, &[Assert::missing(key)], &[put], what).await
}

/// [`created`], answering as an applied txn does (no entries).
async fn must_create(
    backend: &dyn Backend,
    key: &str,
    value: impl Into<Vec<u8>>,
    what: &str,
) -> CheckResult {
    let put = Mutation::put(key, value);
    must_apply(backend, &[Assert::missing(key)], &[put], what).await
}

/// Run a txn that must apply, and answer as an applied txn does (no entries).
async fn must_apply(
    backend: &dyn Backend,
    asserts: &[Assert],
    mutations: &[Mutation],
    what: &str,
) -> CheckResult {
    let outcome = applied(backend, asserts, mutations, what).await?;
    ensure!(
        outcome.current.is_empty(),
        "{what}: an applied txn returned entries {:?} (must be empty)",
        outcome.current
    );
    Ok(())
}

async fn must_reject(
    backend: &dyn Backend,
    asserts: &[Assert],
    mutations: &[Mutation],
    what: &str,
) -> Result<Vec<Entry>, Failure> {
    let outcome = backend.txn(asserts, mutations).await?;
    ensure!(
        !outcome.applied,
        "{what}: txn applied, expected a rejection"
    );
    Ok(outcome.current)
}

fn names(keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| (*k).to_owned()).collect()
}

crate::__define_suite! {$
    /// The backend suite's one list of cases (see [`crate::__define_suite!`]).
    // A check over one backend gets a client of a namespace named after it.
    __backend_suite "backend" |factory, check, name| async move {
        check(factory(crate::unique_namespace(name)).await?).await
    };
    /// Every case of the backend suite.
    cases;
    /// Expand the backend suite into one `#[tokio::test]` per case for a
    /// [`BackendFactory`](crate::BackendFactory) expression (evaluated once per test).
    backend_tests(backend);
    concurrent_txn => |factory| case_concurrent_txn(factory),
    increment_race => |factory| case_increment_race(factory),
    snapshot_consistency => |factory| case_snapshot_consistency(factory),
    disjoint_write_skew => |factory| case_disjoint_write_skew(factory),
    version_monotonic,
    reported_versions_are_stored,
    assert_missing,
    all_or_nothing,
    rejected_txn_current,
    snapshot_semantics,
    keys_literal_prefix,
    namespace_isolation => |factory| namespace_isolation(factory),
    bad_input,
    large_values,
    model_sequences => |factory| model_sequences(factory, ModelOptions::default()),
}
