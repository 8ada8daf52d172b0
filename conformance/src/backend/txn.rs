//! Checks of what one txn does on its own: versions move by exactly one per
//! write and are never reused, create-if-missing, all or nothing, and the
//! current entries a rejected txn returns.

use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Mutation, Version};

use super::{applied, get, must_apply, must_create, must_reject, names, require_empty, set_up};
use crate::{ensure, CheckResult, Failure};

/// Versions move by exactly 1 per write (put or delete), a deleted key reads
/// as missing, deleting a missing key is allowed and still counts, and after a
/// delete and re-create the version is higher than any seen before, so a stale
/// assert never passes again (ABA).
pub async fn version_monotonic(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "version_monotonic").await?;
    let key = "mono";
    let mut expected = 0;
    for n in 1..=3 {
        must_apply(
            backend,
            &[Assert::at(key, Version(expected))],
            &[Mutation::put(key, format!("v{n}"))],
            &format!("put #{n}"),
        )
        .await?;
        expected += 1;
        let entry = get(backend, key).await?;
        ensure!(
            entry.version == Version(expected),
            "after {n} puts of a new key its version is {} (expected v{expected}: +1 per put)",
            entry.version
        );
    }
    must_apply(
        backend,
        &[Assert::at(key, Version(expected))],
        &[Mutation::delete(key)],
        "delete",
    )
    .await?;
    expected += 1;
    let deleted = get(backend, key).await?;
    ensure!(
        deleted == Entry::missing(key),
        "a deleted key reads as {deleted:?} (expected missing: version 0, no value)"
    );
    ensure!(
        backend.keys("").await?.is_empty(),
        "keys() lists a deleted key"
    );
    // Deleting a missing key is allowed and bumps the hidden counter too.
    must_apply(
        backend,
        &[Assert::missing(key)],
        &[Mutation::delete(key)],
        "delete of a missing key",
    )
    .await?;
    expected += 1;
    must_create(backend, key, "again", "re-create after delete").await?;
    expected += 1;
    let recreated = get(backend, key).await?;
    ensure!(
        recreated.version > Version(3),
        "re-created key got {} although v3 was seen before the delete: versions are reused",
        recreated.version
    );
    ensure!(
        recreated.version == Version(expected),
        "3 puts, 2 deletes and a re-create gave {} (expected v{expected}: every write, \
         deletes included, moves the hidden counter by exactly 1)",
        recreated.version
    );

    // ABA: a stale assert must not pass after delete + re-create reaches the same count.
    let aba = "aba";
    must_create(backend, aba, "1", "aba put 1").await?;
    let stale = Version(2);
    must_apply(
        backend,
        &[Assert::at(aba, Version(1))],
        &[Mutation::put(aba, "2")],
        "aba put 2",
    )
    .await?;
    must_apply(
        backend,
        &[Assert::at(aba, stale)],
        &[Mutation::delete(aba)],
        "aba delete",
    )
    .await?;
    must_create(backend, aba, "3", "aba re-create").await?;
    let now = get(backend, aba).await?.version;
    must_apply(
        backend,
        &[Assert::at(aba, now)],
        &[Mutation::put(aba, "4")],
        "aba put 4",
    )
    .await?;
    let current = get(backend, aba).await?;
    ensure!(
        current.version > stale,
        "after put, put, delete, put, put the version is {} (must exceed {stale})",
        current.version
    );
    let outcome = backend
        .txn(&[Assert::at(aba, stale)], &[Mutation::put(aba, "stale")])
        .await?;
    ensure!(
        !outcome.applied,
        "a txn asserting the stale {stale} (seen before a delete and re-create) was applied: ABA"
    );
    ensure!(
        get(backend, aba).await? == current,
        "a rejected stale txn changed the key"
    );
    Ok(())
}

/// Create-if-missing (assert version 0) succeeds once, a second one is
/// rejected with the existing entry, and it succeeds again after a delete. A
/// txn with asserts and no mutations applies and writes nothing.
pub async fn assert_missing(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "assert_missing").await?;
    let key = "once";
    must_create(backend, key, "first", "first create").await?;
    let created = get(backend, key).await?;
    ensure!(
        created == Entry::present(key, Version(1), b"first".to_vec()),
        "after a create the key reads {created:?}"
    );
    let current = must_reject(
        backend,
        &[Assert::missing(key)],
        &[Mutation::put(key, "second")],
        "second create-if-missing",
    )
    .await?;
    ensure!(
        current == vec![created.clone()],
        "the rejected create returned {current:?} (expected the existing entry {created:?})"
    );
    ensure!(
        get(backend, key).await? == created,
        "a rejected create changed the key"
    );
    must_apply(
        backend,
        &[Assert::at(key, Version(1))],
        &[Mutation::delete(key)],
        "delete",
    )
    .await?;
    must_create(backend, key, "third", "create-if-missing on a deleted key").await?;
    let recreated = get(backend, key).await?;
    ensure!(
        recreated.value.as_deref() == Some(&b"third"[..]),
        "re-created key reads {recreated:?}"
    );
    // Asserts only: applies, writes nothing.
    must_apply(backend, &[Assert::missing("never")], &[], "assert-only txn").await?;
    ensure!(
        get(backend, "never").await? == Entry::missing("never"),
        "an assert-only txn created a key"
    );
    Ok(())
}

/// One false assert among several makes the whole txn write nothing (every key
/// checked unchanged); several puts and deletes of one applied txn all land,
/// each moving its key's version by exactly 1.
pub async fn all_or_nothing(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "all_or_nothing").await?;
    let all = names(&["k1", "k2", "k3", "k4"]);
    must_apply(
        backend,
        &[
            Assert::missing("k1"),
            Assert::missing("k2"),
            Assert::missing("k3"),
        ],
        &[
            Mutation::put("k1", "one"),
            Mutation::put("k2", "two"),
            Mutation::put("k3", "three"),
        ],
        "create three keys in one txn",
    )
    .await?;
    let before = backend.snapshot(&all).await?;
    let expected_before = vec![
        Entry::present("k1", Version(1), b"one".to_vec()),
        Entry::present("k2", Version(1), b"two".to_vec()),
        Entry::present("k3", Version(1), b"three".to_vec()),
        Entry::missing("k4"),
    ];
    ensure!(
        before == expected_before,
        "three puts in one txn read back as {before:?}"
    );
    let writes = [
        Mutation::put("k1", "x"),
        Mutation::delete("k2"),
        Mutation::put("k4", "x"),
        Mutation::delete("k3"),
    ];
    let false_asserts: [&[Assert]; 3] = [
        // the last of several asserts is false
        &[
            Assert::at("k1", Version(1)),
            Assert::at("k2", Version(1)),
            Assert::at("k3", Version(7)),
        ],
        // the first is false
        &[Assert::at("k1", Version(2)), Assert::at("k2", Version(1))],
        // a key that is not written is asserted present but is missing
        &[
            Assert::at("k1", Version(1)),
            Assert::at("k2", Version(1)),
            Assert::at("elsewhere", Version(1)),
        ],
    ];
    for asserts in false_asserts {
        must_reject(backend, asserts, &writes, &format!("asserts {asserts:?}")).await?;
        let after = backend.snapshot(&all).await?;
        ensure!(
            after == before,
            "a txn with one false assert among {asserts:?} changed keys: before {before:?}, \
             after {after:?}"
        );
        ensure!(
            get(backend, "elsewhere").await? == Entry::missing("elsewhere"),
            "a rejected txn created a key"
        );
    }
    must_apply(
        backend,
        &[
            Assert::at("k1", Version(1)),
            Assert::at("k2", Version(1)),
            Assert::at("k3", Version(1)),
            Assert::missing("k4"),
        ],
        &writes,
        "two puts and two deletes with true asserts",
    )
    .await?;
    let after = backend.snapshot(&all).await?;
    let expected = vec![
        Entry::present("k1", Version(2), b"x".to_vec()),
        Entry::missing("k2"),
        Entry::missing("k3"),
        Entry::present("k4", Version(1), b"x".to_vec()),
    ];
    ensure!(
        after == expected,
        "after one txn of puts and deletes: {after:?} (expected {expected:?})"
    );
    let listed = backend.keys("k").await?;
    ensure!(
        listed == names(&["k1", "k4"]),
        "keys(\"k\") lists {listed:?} after deleting k2 and k3"
    );
    // The deletes of the multi-key txn counted: re-creating k2 gives v3.
    must_create(backend, "k2", "back", "re-create k2").await?;
    let k2 = get(backend, "k2").await?;
    ensure!(
        k2.version == Version(3),
        "k2 (put, deleted in a multi-key txn, re-created) is at {} (expected v3)",
        k2.version
    );
    Ok(())
}

/// A rejected txn returns the TRUE current entries of the asserted keys: one
/// per distinct key, in assert order, with the current version and value,
/// missing and deleted keys as missing; never stale, never empty.
pub async fn rejected_txn_current(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "rejected_txn_current").await?;
    set_up(
        backend,
        &[
            Mutation::put("a", "a1"),
            Mutation::put("b", "b1"),
            Mutation::put("d", vec![0u8, 255, 7]),
        ],
    )
    .await?;
    must_apply(
        backend,
        &[],
        &[Mutation::put("a", "a2"), Mutation::delete("b")],
        "setup 2",
    )
    .await?;
    // a: v2 "a2"; b: deleted (tombstone at v2); c: never written; d: v1.
    let asserts = [
        Assert::at("a", Version(1)), // stale
        Assert::missing("b"),        // true
        Assert::at("c", Version(5)), // false: c is missing
        Assert::at("a", Version(1)), // duplicate, same version
        Assert::at("d", Version(1)), // true
    ];
    let current = must_reject(
        backend,
        &asserts,
        &[Mutation::put("a", "never"), Mutation::put("e", "never")],
        "txn with a stale assert",
    )
    .await?;
    let expected = vec![
        Entry::present("a", Version(2), b"a2".to_vec()),
        Entry::missing("b"),
        Entry::missing("c"),
        Entry::present("d", Version(1), vec![0u8, 255, 7]),
    ];
    ensure!(
        current == expected,
        "a rejected txn returned current entries {current:?}; the store holds {expected:?} \
         (one per distinct asserted key, in assert order)"
    );
    let after = backend.snapshot(&names(&["a", "b", "c", "d", "e"])).await?;
    let mut unchanged = expected.clone();
    unchanged.push(Entry::missing("e"));
    ensure!(
        after == unchanged,
        "the rejected txn changed something: {after:?} (expected {unchanged:?})"
    );
    // After another writer moved the key, the entries are the new ones.
    must_apply(
        backend,
        &[Assert::at("a", Version(2))],
        &[Mutation::put("a", "a3")],
        "move a",
    )
    .await?;
    let current = must_reject(
        backend,
        &[Assert::at("a", Version(2))],
        &[Mutation::delete("a")],
        "txn asserting the previous version",
    )
    .await?;
    let expected = vec![Entry::present("a", Version(3), b"a3".to_vec())];
    ensure!(
        current == expected,
        "after a moved to v3, a rejected txn returned {current:?} (expected {expected:?})"
    );
    Ok(())
}

/// An applied txn that reports the versions it gave the keys it put
/// ([`TxnOutcome::written`](coord_backend::TxnOutcome)) reports the stored
/// ones: for a new key, a key put again, and a key created again after a
/// delete (whose hidden counter moved on, so "1" would be wrong). A store
/// may report nothing.
pub async fn reported_versions_are_stored(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "reported_versions_are_stored").await?;
    lifecycle_reports(backend, "reported", false).await?;
    Ok(())
}

/// Create `key`, put it again, delete it and create it over its tombstone,
/// each asserting the version read before; every version a txn reports must
/// be the one read after, none for the delete, and, when `every`, each put
/// must report one. The key's last version.
async fn lifecycle_reports(
    backend: &dyn Backend,
    key: &str,
    every: bool,
) -> Result<Version, Failure> {
    let mut at = Version::MISSING;
    for step in ["create", "put again", "delete", "create over the tombstone"] {
        let mutation = if step == "delete" {
            Mutation::delete(key)
        } else {
            Mutation::put(key, step.as_bytes().to_vec())
        };
        let outcome = applied(backend, &[Assert::at(key, at)], &[mutation], step).await?;
        at = get(backend, key).await?.version;
        for (written, version) in &outcome.written {
            ensure!(
                written == key && step != "delete",
                "{step}: the txn reports a version for {written:?}, which it did not put"
            );
            ensure!(
                *version == at,
                "{step}: the txn reports {written:?} at {version}, the store holds it at {at}"
            );
        }
        ensure!(
            !every || step == "delete" || !outcome.written.is_empty(),
            "{step}: the txn reports no version for {key:?} (the store holds it at {at})"
        );
    }
    Ok(at)
}

/// For a store that reports every put's version (not part of the suite: the
/// contract lets a store report none, and etcd reports only asserted puts;
/// the memory, SQLite, Redis and PostgreSQL stores run it from their own
/// tests): every put of an applied txn is reported, at exactly the version a
/// later read returns, and no delete is. Covers a new key, a key put again, a
/// key created over its tombstone, and, where the store reclaims, one txn
/// after a reclaim raised the namespace's floor that creates a reclaimed key,
/// puts a never-written key without asserting it, puts a live key and
/// deletes one.
pub async fn every_put_reports_its_version(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "every_put_reports_its_version").await?;
    let key = "reported";
    let at = lifecycle_reports(backend, key, true).await?;

    // A floor above 0: a key deleted, then reclaimed.
    let gone = "reclaimed";
    applied(
        backend,
        &[],
        &[Mutation::put(gone, "x")],
        "put of the key to reclaim",
    )
    .await?;
    let version = get(backend, gone).await?.version;
    let delete = [Mutation::delete(gone)];
    applied(
        backend,
        &[Assert::at(gone, version)],
        &delete,
        "delete of the key to reclaim",
    )
    .await?;
    match backend
        .reclaim(&coord_backend::ReclaimOptions::DEFAULT)
        .await
    {
        Ok(_) | Err(coord_backend::Error::Unsupported { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let (blind, doomed) = ("blind", "doomed");
    set_up(backend, &[Mutation::put(doomed, "d")]).await?;
    let doomed_at = get(backend, doomed).await?.version;
    let asserts = [
        Assert::missing(gone),
        Assert::at(key, at),
        Assert::at(doomed, doomed_at),
    ];
    let mutations = [
        Mutation::put(gone, "again"),
        Mutation::put(blind, "unasserted"),
        Mutation::put(key, "live"),
        Mutation::delete(doomed),
    ];
    let outcome = applied(backend, &asserts, &mutations, "one txn after a reclaim").await?;
    let mut want = Vec::new();
    for put in [gone, blind, key] {
        want.push((put.to_owned(), get(backend, put).await?.version));
    }
    let mut got = outcome.written.clone();
    got.sort();
    want.sort();
    ensure!(
        got == want,
        "after a reclaim, a txn creating {gone:?}, putting {blind:?} unasserted, putting \
         {key:?} and deleting {doomed:?} reports {:?}; the store holds {want:?}",
        outcome.written
    );
    Ok(())
}
