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
    let distinct = distinct_keys(keys.iter().map(String::as_str)).len();
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
    let mut seen = KeyMap::default();
    keys.into_iter()
        .filter(|k| seen.insert(k, ()).is_none())
        .collect()
}

/// Keys seen so far, each with a value. A call names a handful of keys,
/// and hashing them costs more than comparing them (two hash sets and a
/// map per txn were about 5,000 instructions of a lock cycle): a list is
/// scanned up to [`KeyMap::SCAN_UP_TO`] keys, a hash map holds more.
struct KeyMap<'a, V> {
    few: Vec<(&'a str, V)>,
    many: HashMap<&'a str, V>,
}

impl<V> Default for KeyMap<'_, V> {
    fn default() -> Self {
        KeyMap {
            few: Vec::new(),
            many: HashMap::new(),
        }
    }
}

impl<'a, V: Copy> KeyMap<'a, V> {
    const SCAN_UP_TO: usize = 16;

    /// Add `key` unless it is there; returns the value it had.
    fn insert(&mut self, key: &'a str, value: V) -> Option<V> {
        if !self.many.is_empty() {
            return match self.many.entry(key) {
                std::collections::hash_map::Entry::Occupied(seen) => Some(*seen.get()),
                std::collections::hash_map::Entry::Vacant(new) => {
                    new.insert(value);
                    None
                }
            };
        }
        if let Some((_, seen)) = self.few.iter().find(|(k, _)| *k == key) {
            return Some(*seen);
        }
        if self.few.len() == Self::SCAN_UP_TO {
            self.many.extend(self.few.drain(..));
            self.many.insert(key, value);
        } else {
            self.few.push((key, value));
        }
        None
    }

    fn contains(&self, key: &str) -> bool {
        self.many.contains_key(key) || self.few.iter().any(|(k, _)| *k == key)
    }

    fn len(&self) -> usize {
        self.few.len() + self.many.len()
    }

    fn keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.few
            .iter()
            .map(|(k, _)| *k)
            .chain(self.many.keys().copied())
    }
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
    let mut asserted: KeyMap<'_, Version> = KeyMap::default();
    for assert in asserts {
        validate_key(&assert.key, limits)?;
        if let Some(previous) = asserted.insert(&assert.key, assert.version) {
            if previous != assert.version {
                return Err(InvalidInput::ConflictingAsserts(assert.key.clone()));
            }
        }
    }
    let mut written: KeyMap<'_, ()> = KeyMap::default();
    for mutation in mutations {
        validate_key(mutation.key(), limits)?;
        if written.insert(mutation.key(), ()).is_some() {
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
    let distinct = asserted.len() + written.keys().filter(|k| !asserted.contains(k)).count();
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

    fn keys_at_most(max: usize) -> Limits {
        Limits {
            max_keys_per_call: max,
            ..Limits::DEFAULT
        }
    }

    /// Duplicates are found on both sides of the switch from a scanned list
    /// to a hash map, and keys asserted and written count once.
    #[test]
    fn many_keys_are_counted_and_checked_like_few() {
        let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let with_repeats: Vec<&str> = keys
            .iter()
            .chain(keys.iter().rev())
            .map(String::as_str)
            .collect();
        let all: Vec<&str> = keys.iter().map(String::as_str).collect();
        assert_eq!(distinct_keys(with_repeats.iter().copied()), all);
        for late in [3, 16, 17, 39] {
            let mut mutations: Vec<Mutation> =
                keys.iter().map(|k| Mutation::delete(k.as_str())).collect();
            mutations.push(Mutation::delete(keys[late].as_str()));
            assert_eq!(
                validate_txn(&[], &mutations, &Limits::DEFAULT),
                Err(InvalidInput::DuplicateMutation(keys[late].clone())),
                "a key written again after {late} others"
            );
            let mut asserts: Vec<Assert> =
                keys.iter().map(|k| Assert::missing(k.as_str())).collect();
            asserts.push(Assert::at(keys[late].as_str(), Version(1)));
            assert_eq!(
                validate_txn(&asserts, &[], &Limits::DEFAULT),
                Err(InvalidInput::ConflictingAsserts(keys[late].clone()))
            );
        }
        let asserts: Vec<Assert> = keys.iter().map(|k| Assert::missing(k.as_str())).collect();
        let mutations: Vec<Mutation> = keys[20..]
            .iter()
            .chain(["extra".to_owned()].iter())
            .map(|k| Mutation::delete(k.as_str()))
            .collect();
        let limits = keys_at_most(41);
        assert!(validate_txn(&asserts, &mutations, &limits).is_ok());
        assert_eq!(
            validate_txn(&asserts, &mutations, &keys_at_most(40)),
            Err(InvalidInput::TooManyKeys { count: 41, max: 40 })
        );
        assert_eq!(
            validate_keys(&[keys.clone(), keys.clone()].concat(), &keys_at_most(39)),
            Err(InvalidInput::TooManyKeys { count: 40, max: 39 })
        );
    }

    #[test]
    fn namespaces() {
        assert!(validate_namespace("a:b").is_ok());
        assert!(validate_namespace("").is_err());
        assert!(validate_namespace("{x}").is_err());
    }
}
