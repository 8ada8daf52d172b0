//! Input checks every store runs first, so all stores refuse the same input the same way.

use std::collections::HashMap;

use crate::{Assert, InvalidInput, Limits, Mutation, Version};

/// A key is a prefix that is not empty.
fn validate_key(key: &str, limits: &Limits) -> Result<(), InvalidInput> {
    if key.is_empty() {
        return Err(InvalidInput::EmptyKey);
    }
    validate_prefix(key, limits)
}

/// Check the keys of a snapshot.
pub fn validate_keys(keys: &[String], limits: &Limits) -> Result<(), InvalidInput> {
    for key in keys {
        validate_key(key, limits)?;
    }
    let distinct = keys.iter().collect::<std::collections::HashSet<_>>().len();
    if distinct > limits.max_keys_per_call {
        return Err(InvalidInput::TooManyKeys {
            count: distinct,
            max: limits.max_keys_per_call,
        });
    }
    Ok(())
}

/// The distinct keys of a call, in order of first appearance (the order in
/// which snapshots and rejected txns return entries).
pub fn distinct_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut seen = std::collections::HashSet::new();
    keys.into_iter().filter(|k| seen.insert(*k)).collect()
}

/// Check a prefix for [`crate::Backend::keys`] (the empty prefix lists everything).
pub fn validate_prefix(prefix: &str, limits: &Limits) -> Result<(), InvalidInput> {
    if prefix.len() > limits.max_key_bytes {
        return Err(InvalidInput::KeyTooLong {
            len: prefix.len(),
            max: limits.max_key_bytes,
        });
    }
    if prefix.contains('\0') {
        return Err(InvalidInput::NulByte(prefix.to_owned()));
    }
    Ok(())
}

/// Check a txn: valid keys, values within the limit, no key written twice,
/// no key asserted at two versions, not too many distinct keys.
pub fn validate_txn(
    asserts: &[Assert],
    mutations: &[Mutation],
    limits: &Limits,
) -> Result<(), InvalidInput> {
    let mut asserted: HashMap<&str, Version> = HashMap::new();
    for assert in asserts {
        validate_key(&assert.key, limits)?;
        if let Some(previous) = asserted.insert(&assert.key, assert.version) {
            if previous != assert.version {
                return Err(InvalidInput::ConflictingAsserts(assert.key.clone()));
            }
        }
    }
    let mut written = std::collections::HashSet::new();
    for mutation in mutations {
        validate_key(mutation.key(), limits)?;
        if !written.insert(mutation.key()) {
            return Err(InvalidInput::DuplicateMutation(mutation.key().to_owned()));
        }
        if let Mutation::Put { key, value } = mutation {
            if value.len() > limits.max_value_bytes {
                return Err(InvalidInput::ValueTooLarge {
                    key: key.clone(),
                    len: value.len(),
                    max: limits.max_value_bytes,
                });
            }
        }
    }
    let distinct = asserted
        .keys()
        .copied()
        .chain(written.iter().copied())
        .collect::<std::collections::HashSet<_>>()
        .len();
    if distinct > limits.max_keys_per_call {
        return Err(InvalidInput::TooManyKeys {
            count: distinct,
            max: limits.max_keys_per_call,
        });
    }
    Ok(())
}

/// Check a namespace: 1 to 128 bytes, no NUL, no `{` or `}` (Redis stores
/// use the namespace as a cluster hash tag).
pub fn validate_namespace(namespace: &str) -> Result<(), InvalidInput> {
    let reason = if namespace.is_empty() {
        Some("empty")
    } else if namespace.len() > 128 {
        Some("longer than 128 bytes")
    } else if namespace.contains(['\0', '{', '}']) {
        Some("contains NUL, '{' or '}'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(InvalidInput::Namespace {
            namespace: namespace.to_owned(),
            reason: reason.to_owned(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_txns() {
        let limits = Limits::DEFAULT.with_max_value_bytes(4);
        assert_eq!(
            validate_txn(&[], &[Mutation::put("", b"x".to_vec())], &limits),
            Err(InvalidInput::EmptyKey)
        );
        assert!(matches!(
            validate_txn(&[], &[Mutation::put("k", b"12345".to_vec())], &limits),
            Err(InvalidInput::ValueTooLarge { .. })
        ));
        assert!(matches!(
            validate_txn(
                &[],
                &[Mutation::put("k", b"1".to_vec()), Mutation::delete("k")],
                &limits
            ),
            Err(InvalidInput::DuplicateMutation(_))
        ));
        assert!(matches!(
            validate_txn(
                &[Assert::at("k", Version(1)), Assert::missing("k")],
                &[],
                &limits
            ),
            Err(InvalidInput::ConflictingAsserts(_))
        ));
        assert!(matches!(
            validate_keys(&["a\0b".into()], &limits),
            Err(InvalidInput::NulByte(_))
        ));
        assert!(validate_txn(
            &[Assert::missing("k")],
            &[Mutation::put("k", b"1234".to_vec())],
            &limits
        )
        .is_ok());
    }

    #[test]
    fn namespaces() {
        assert!(validate_namespace("a:b").is_ok());
        assert!(validate_namespace("").is_err());
        assert!(validate_namespace("{x}").is_err());
    }
}
