//! Checks at the edges of the input: bad keys, values and txns refused with
//! `InvalidInput` and nothing changed, and values at the size limit (or
//! empty) round-tripping byte-exact.

use std::fmt;
use std::sync::Arc;

use coord_backend::{Assert, Backend, Entry, Error, InvalidInput, Mutation, Version};

use super::{get, must_apply, must_create, must_reject, names, require_empty, set_up};
use crate::{ensure, CheckResult, Failure};

/// Whether an [`InvalidInput`] is the expected reason.
type IsReason = fn(&InvalidInput) -> bool;

fn expect_invalid<T: fmt::Debug>(
    result: coord_backend::Result<T>,
    what: &str,
    kind: IsReason,
) -> CheckResult {
    match result {
        Err(Error::InvalidInput(reason)) if kind(&reason) => Ok(()),
        Err(Error::InvalidInput(reason)) => Err(Failure::new(format!(
            "{what}: refused as invalid input, but for the wrong reason: {reason}"
        ))),
        other => Err(Failure::new(format!(
            "{what}: expected Error::InvalidInput, got {other:?}"
        ))),
    }
}

/// Bad input (empty key, key over the limit, NUL in a key, value over the
/// limit, one key written twice in a txn, NUL in a prefix) is refused with
/// [`Error::InvalidInput`] and nothing stored changes, also when the txn
/// carried valid writes next to the bad one. A key of exactly the limit is fine.
pub async fn bad_input(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "bad_input").await?;
    let limits = backend.limits();
    set_up(
        backend,
        &[Mutation::put("keep1", "one"), Mutation::put("keep2", "two")],
    )
    .await?;
    let kept = names(&["keep1", "keep2"]);
    let before = backend.snapshot(&kept).await?;
    let long_key = "k".repeat(limits.max_key_bytes + 1);
    let big_value = vec![7u8; limits.max_value_bytes + 1];
    // Each txn asserts the true versions and writes valid keys next to the bad
    // mutation: a store that validated late would apply them.
    let valid_asserts = [
        Assert::at("keep1", Version(1)),
        Assert::at("keep2", Version(1)),
    ];
    let bad: Vec<(&str, Vec<Mutation>, IsReason)> = vec![
        ("empty key", vec![Mutation::put("", "x")], |r| {
            matches!(r, InvalidInput::EmptyKey)
        }),
        (
            "key over max_key_bytes",
            vec![Mutation::put(long_key.clone(), "x")],
            |r| matches!(r, InvalidInput::KeyTooLong { .. }),
        ),
        ("NUL in key", vec![Mutation::put("nul\0key", "x")], |r| {
            matches!(r, InvalidInput::NulByte(_))
        }),
        (
            "value over max_value_bytes",
            vec![Mutation::put("big", big_value)],
            |r| matches!(r, InvalidInput::ValueTooLarge { .. }),
        ),
        (
            "one key written twice",
            vec![Mutation::put("twice", "a"), Mutation::delete("twice")],
            |r| matches!(r, InvalidInput::DuplicateMutation(_)),
        ),
        (
            "delete with an empty key",
            vec![Mutation::delete("")],
            |r| matches!(r, InvalidInput::EmptyKey),
        ),
    ];
    for (what, bad_mutations, kind) in bad {
        let mut mutations = vec![Mutation::put("keep1", "changed"), Mutation::delete("keep2")];
        mutations.extend(bad_mutations);
        expect_invalid(backend.txn(&valid_asserts, &mutations).await, what, kind)?;
        // Also when the bad mutation comes first.
        mutations.rotate_left(2);
        expect_invalid(backend.txn(&valid_asserts, &mutations).await, what, kind)?;
    }
    expect_invalid(
        backend
            .txn(&[Assert::missing("")], &[Mutation::put("keep1", "changed")])
            .await,
        "assert on an empty key",
        |r| matches!(r, InvalidInput::EmptyKey),
    )?;
    expect_invalid(
        backend
            .txn(
                &[Assert::missing("a\0")],
                &[Mutation::put("keep1", "changed")],
            )
            .await,
        "assert on a key with NUL",
        |r| matches!(r, InvalidInput::NulByte(_)),
    )?;
    expect_invalid(
        backend.snapshot(&names(&["keep1", ""])).await,
        "snapshot of an empty key",
        |r| matches!(r, InvalidInput::EmptyKey),
    )?;
    expect_invalid(
        backend.snapshot(std::slice::from_ref(&long_key)).await,
        "snapshot of a key over max_key_bytes",
        |r| matches!(r, InvalidInput::KeyTooLong { .. }),
    )?;
    expect_invalid(
        backend.snapshot(&names(&["x\0"])).await,
        "snapshot of a key with NUL",
        |r| matches!(r, InvalidInput::NulByte(_)),
    )?;
    expect_invalid(
        backend.keys("ke\0").await,
        "keys with NUL in the prefix",
        |r| matches!(r, InvalidInput::NulByte(_)),
    )?;
    let after = backend.snapshot(&kept).await?;
    ensure!(
        after == before,
        "refused txns changed stored keys: before {before:?}, after {after:?}"
    );
    let listed = backend.keys("").await?;
    ensure!(
        listed == kept,
        "refused txns created keys: the namespace holds {listed:?}"
    );
    // The limit itself is allowed.
    let max_key = "m".repeat(limits.max_key_bytes);
    must_create(backend, &max_key, "edge", "key of exactly max_key_bytes").await?;
    let edge = get(backend, &max_key).await?;
    ensure!(
        edge.value.as_deref() == Some(&b"edge"[..]),
        "a key of exactly max_key_bytes reads back as {:?}",
        edge.value
    );
    Ok(())
}

fn describe_bytes(expected: &[u8], got: Option<&[u8]>) -> String {
    match got {
        None => format!("missing (expected {} bytes)", expected.len()),
        Some(got) => {
            let first_diff = expected.iter().zip(got).position(|(a, b)| a != b);
            format!(
                "{} bytes read back for {} written, first difference at {first_diff:?}",
                got.len(),
                expected.len()
            )
        }
    }
}

/// A value of exactly `limits().max_value_bytes` random bytes (every byte
/// value, 0x00 and 0xFF included) round-trips byte-exact through a put, a
/// snapshot and a rejected txn's entries; a zero-length value exists (it is
/// not missing).
pub async fn large_values(backend: Arc<dyn Backend>) -> CheckResult {
    let backend = &*backend;
    require_empty(backend, "large_values").await?;
    let max = backend.limits().max_value_bytes;
    for round in 1..=2u64 {
        let mut value = vec![0u8; max];
        rand::Rng::fill(&mut rand::rng(), &mut value[..]);
        for (i, byte) in value.iter_mut().take(256).enumerate() {
            *byte = i as u8;
        }
        if let Some(last) = value.last_mut() {
            *last = 0xFF;
        }
        must_apply(
            backend,
            &[Assert::at("big", Version(round - 1))],
            &[Mutation::put("big", value.clone())],
            &format!("put of {max} bytes"),
        )
        .await?;
        let read = get(backend, "big").await?;
        ensure!(
            read.value.as_deref() == Some(&value[..]) && read.version == Version(round),
            "value of {max} bytes: {} (version {})",
            describe_bytes(&value, read.value.as_deref()),
            read.version
        );
        let current = must_reject(
            backend,
            &[Assert::missing("big")],
            &[Mutation::delete("big")],
            "txn asserting the big key missing",
        )
        .await?;
        ensure!(
            current.len() == 1 && current[0].value.as_deref() == Some(&value[..]),
            "a rejected txn's entry for a value of {max} bytes: {}",
            describe_bytes(&value, current.first().and_then(|e| e.value.as_deref()))
        );
    }
    must_create(backend, "empty", Vec::new(), "put of an empty value").await?;
    let empty = get(backend, "empty").await?;
    ensure!(
        empty == Entry::present("empty", Version(1), Vec::new()),
        "an empty value reads back as {empty:?} (expected present at v1 with 0 bytes)"
    );
    ensure!(
        backend.keys("em").await? == names(&["empty"]),
        "keys() does not list a key holding an empty value"
    );
    must_reject(
        backend,
        &[Assert::missing("empty")],
        &[Mutation::put("empty", "x")],
        "assert missing on a key holding an empty value",
    )
    .await?;
    Ok(())
}
