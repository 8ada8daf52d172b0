//! Checks of what reads return: a snapshot's shape, `keys(prefix)` taken
//! literally and sorted, and namespaces that never see each other's keys.

use std::collections::BTreeMap;
use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Mutation, Version};

use super::{must_apply, must_reject, names, require_empty, set_up};
use crate::{ensure, unique_namespace, BackendFactory, CheckResult};

/// A snapshot returns one entry per distinct key in the order of first
/// appearance, missing keys as version 0 without value, and nothing for an
/// empty key list.
pub async fn snapshot_semantics(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "snapshot_semantics").await?;
    set_up(
        backend,
        &[Mutation::put("x", "vx"), Mutation::put("z", "vz")],
    )
    .await?;
    let empty = backend.snapshot(&[]).await?;
    ensure!(empty.is_empty(), "a snapshot of no keys returned {empty:?}");
    let seen = backend
        .snapshot(&names(&["z", "x", "y", "x", "z", "y"]))
        .await?;
    let expected = vec![
        Entry::present("z", Version(1), b"vz".to_vec()),
        Entry::present("x", Version(1), b"vx".to_vec()),
        Entry::missing("y"),
    ];
    ensure!(
        seen == expected,
        "snapshot [z, x, y, x, z, y] returned {seen:?} (expected {expected:?}: duplicates once, \
         first-appearance order, missing as v0 without value)"
    );
    let missing = backend.snapshot(&names(&["nope"])).await?;
    ensure!(
        missing == vec![Entry::missing("nope")],
        "a never-written key reads as {missing:?}"
    );
    Ok(())
}

/// Keys a LIKE pattern, a glob, a regex or a case-/accent-insensitive
/// collation would confuse with each other.
#[rustfmt::skip]
const LITERAL_KEYS: &[&str] = &[
    "a", "A", "a_", "a_b", "ab", "abc", "a%", "a%c", "a*", "a*x", "aa", "a?", "a?b", "a.b", "a.c",
    "a^", "a|b", "a b", "a[b]", "[a]", "[a]x", "a", "b", "{a}", "{", "}", "\\", "\\x", "x\\y", "%",
    "_", "*", "?", "$", "é", "éa", "É", "e", "ea", "e\u{301}", "中", "中文", "😀", "😀x", "a\u{7f}",
    "a\u{ff}", "a\u{10FFFF}",
];

#[rustfmt::skip]
const LITERAL_PREFIXES: &[&str] = &[
    "", "a", "a_", "a%", "a*", "a?", "a.", "a[", "[a]", "[", "{", "}", "\\", "x\\", "%", "_", "*",
    "?", "é", "e", "É", "E", "中", "😀", "A", "a b", "zzz",
];

/// `keys(prefix)` lists existing keys sorted by bytes, never deleted ones, and
/// matches the prefix literally: `a_` does not match `ab`, `a%` not `abc`,
/// `a*` not `aa`, `[a]` and `\` only themselves, `é` not `e`, `a` not `A`.
/// The empty prefix lists every key of the namespace. `first_keys(prefix, n)`
/// is the head of that listing, n keys long (deleted keys do not count).
pub async fn keys_literal_prefix(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "keys_literal_prefix").await?;
    let mut stored: Vec<String> = LITERAL_KEYS.iter().map(|k| (*k).to_owned()).collect();
    stored.sort();
    stored.dedup();
    let mutations: Vec<Mutation> = stored
        .iter()
        .map(|k| Mutation::put(k, k.as_bytes().to_vec()))
        .chain(["a_gone", "gone"].map(|k| Mutation::put(k, "x")))
        .collect();
    // In calls the store accepts (etcd takes fewer keys per call than most).
    for chunk in mutations.chunks(backend.limits().max_keys_per_call.max(1)) {
        must_apply(backend, &[], chunk, "write the literal keys").await?;
    }
    must_apply(
        backend,
        &[],
        &[Mutation::delete("a_gone"), Mutation::delete("gone")],
        "delete two keys",
    )
    .await?;
    let prefixes = LITERAL_PREFIXES
        .iter()
        .copied()
        .chain(stored.iter().map(String::as_str));
    for prefix in prefixes {
        let listed = backend.keys(prefix).await?;
        let expected = starting_with(&stored, prefix);
        ensure!(
            listed == expected,
            "keys({prefix:?}) returned {listed:?}, expected {expected:?} (sorted by bytes, \
             prefix matched literally, deleted keys excluded)"
        );
        for limit in [1, 2, 3, expected.len() + 1] {
            let first = backend.first_keys(prefix, limit).await?;
            let head = &expected[..limit.min(expected.len())];
            ensure!(
                first == head,
                "first_keys({prefix:?}, {limit}) returned {first:?}, expected {head:?} (the \
                 head of what keys lists)"
            );
        }
    }
    Ok(())
}

/// Backends of namespaces `<root>a`, `<root>ab` and `<root>a:b` never see each
/// other's keys: not via snapshot, keys or txn asserts. The key sets are chosen
/// so that a store joining namespace and key by concatenation (`a`+`bk` =
/// `ab`+`k`) or with a `:` (`a`:`b:x` = `a:b`:`x`) collides.
pub async fn namespace_isolation(factory: BackendFactory) -> CheckResult {
    let root = unique_namespace("iso");
    // (namespace suffix, [(key, how many puts)]): colliding keys get different versions.
    let plan: [(&str, &[(&str, u64)]); 3] = [
        ("a", &[("k", 3), ("b:x", 1), ("bk", 2), ("b", 1)]),
        ("ab", &[("k", 1), ("x", 2)]),
        ("a:b", &[("x", 3), ("k", 2)]),
    ];
    let mut all_keys: Vec<String> = plan
        .iter()
        .flat_map(|(_, keys)| keys.iter().map(|(k, _)| (*k).to_owned()))
        .collect();
    all_keys.sort();
    all_keys.dedup();
    let mut stores = Vec::new();
    for (suffix, keys) in plan {
        let namespace = format!("{root}{suffix}");
        let backend = factory(namespace.clone()).await?;
        let mut own = BTreeMap::new();
        for (key, puts) in keys {
            for n in 1..=*puts {
                let value = format!("{suffix}/{key}/{n}");
                must_apply(
                    &*backend,
                    &[Assert::at(*key, Version(n - 1))],
                    &[Mutation::put(*key, value.clone())],
                    &format!("namespace {namespace:?}: put #{n} of {key:?} (another namespace's key is visible)"),
                )
                .await?;
                own.insert(
                    (*key).to_owned(),
                    Entry::present(*key, Version(n), value.into_bytes()),
                );
            }
        }
        stores.push((namespace, backend, own));
    }
    for (namespace, backend, own) in &stores {
        let listed = backend.keys("").await?;
        let expected: Vec<String> = own.keys().cloned().collect();
        ensure!(
            listed == expected,
            "namespace {namespace:?}: keys(\"\") returned {listed:?}, it holds {expected:?}"
        );
        for prefix in ["b", "k", "x", "a"] {
            let listed = backend.keys(prefix).await?;
            let expected = starting_with(own.keys(), prefix);
            ensure!(
                listed == expected,
                "namespace {namespace:?}: keys({prefix:?}) returned {listed:?}, expected {expected:?}"
            );
        }
        let seen = backend.snapshot(&all_keys).await?;
        let expected: Vec<Entry> = all_keys
            .iter()
            .map(|k| own.get(k).cloned().unwrap_or_else(|| Entry::missing(k)))
            .collect();
        ensure!(
            seen == expected,
            "namespace {namespace:?}: snapshot returned {seen:?}, it holds {expected:?}"
        );
        for key in &all_keys {
            let mine = own.get(key).map_or(Version::MISSING, |e| e.version);
            must_apply(
                &**backend,
                &[Assert::at(key, mine)],
                &[],
                &format!("namespace {namespace:?}: assert {key:?} at its own {mine}"),
            )
            .await?;
            for (other, _, theirs) in stores.iter().filter(|(n, _, _)| n != namespace) {
                let Some(entry) = theirs.get(key) else {
                    continue;
                };
                if entry.version == mine {
                    continue;
                }
                must_reject(
                    &**backend,
                    &[Assert::at(key, entry.version)],
                    &[],
                    &format!(
                        "namespace {namespace:?}: assert {key:?} at {} (its version in {other:?})",
                        entry.version
                    ),
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// The keys of `keys` that start with `prefix`, in their order.
fn starting_with<'a>(keys: impl IntoIterator<Item = &'a String>, prefix: &str) -> Vec<String> {
    keys.into_iter()
        .filter(|k| k.starts_with(prefix))
        .cloned()
        .collect()
}
