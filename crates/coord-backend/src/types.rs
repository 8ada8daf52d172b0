use std::fmt;

/// The version of one key: 0 means "the key does not exist".
///
/// A store bumps a key's version by exactly 1 on every successful write (put
/// or delete) and never hands out the same version twice for one key, also
/// after a delete and a re-create: a deleted key keeps a tombstone (or an
/// equivalent counter) so that a stale assert can never pass again (ABA).
///
/// Precisely: +1 per write; once a key's tombstone was reclaimed
/// ([`crate::Backend::reclaim`]), a re-created key starts above every
/// version the key ever had (at the namespace's floor + 1), and from there
/// again +1 per write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u64);

impl Version {
    /// The version of a key that does not exist (never written, or deleted).
    pub const MISSING: Version = Version(0);

    /// Whether this is [`Version::MISSING`].
    pub fn is_missing(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// One key as a snapshot (or a rejected txn) saw it. `Debug` shows the
/// value's length, never its bytes (see [`crate::redact`]).
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// The key, relative to the backend's namespace.
    pub key: String,
    /// The current version; [`Version::MISSING`] when the key does not exist.
    pub version: Version,
    /// The current value (an independent copy); `None` when the key does not exist.
    pub value: Option<Vec<u8>>,
}

impl fmt::Debug for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Entry")
            .field("key", &self.key)
            .field("version", &self.version)
            .field("value", &self.value.as_deref().map(crate::redact::Bytes))
            .finish()
    }
}

impl Entry {
    /// An entry for a key that does not exist.
    pub fn missing(key: impl Into<String>) -> Self {
        Entry {
            key: key.into(),
            version: Version::MISSING,
            value: None,
        }
    }

    /// An entry for an existing key.
    pub fn present(key: impl Into<String>, version: Version, value: Vec<u8>) -> Self {
        Entry {
            key: key.into(),
            version,
            value: Some(value),
        }
    }

    /// Whether the key exists.
    pub fn exists(&self) -> bool {
        self.value.is_some()
    }
}

/// A txn precondition: the key's current version must equal `version`
/// ([`Version::MISSING`] = "the key must not exist").
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Assert {
    /// The key, relative to the backend's namespace.
    pub key: String,
    /// The version the key must have right now.
    pub version: Version,
}

impl Assert {
    /// Assert that `key` is at `version`.
    pub fn at(key: impl Into<String>, version: Version) -> Self {
        Assert {
            key: key.into(),
            version,
        }
    }

    /// Assert that `key` does not exist.
    pub fn missing(key: impl Into<String>) -> Self {
        Assert::at(key, Version::MISSING)
    }
}

/// A write applied by a successful txn. Each written key's version moves by exactly 1.
/// `Debug` shows a put's value length, never its bytes.
#[derive(Clone, PartialEq, Eq)]
pub enum Mutation {
    /// Create or overwrite `key` with `value`.
    Put {
        /// The key, relative to the backend's namespace.
        key: String,
        /// The new value.
        value: Vec<u8>,
    },
    /// Delete `key`. Its version still moves by 1 (kept in a tombstone), so a
    /// later re-create gets a version never seen before. Deleting a missing
    /// key is allowed and still bumps the hidden counter. A reclaim may
    /// remove the tombstone later; the namespace's floor then keeps the
    /// promise (see [`crate::reclaim`]).
    Delete {
        /// The key, relative to the backend's namespace.
        key: String,
    },
}

impl fmt::Debug for Mutation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mutation::Put { key, value } => f
                .debug_struct("Put")
                .field("key", key)
                .field("value", &crate::redact::Bytes(value))
                .finish(),
            Mutation::Delete { key } => f.debug_struct("Delete").field("key", key).finish(),
        }
    }
}

impl Mutation {
    /// A put.
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Mutation::Put {
            key: key.into(),
            value: value.into(),
        }
    }

    /// A delete.
    pub fn delete(key: impl Into<String>) -> Self {
        Mutation::Delete { key: key.into() }
    }

    /// The key this mutation writes.
    pub fn key(&self) -> &str {
        match self {
            Mutation::Put { key, .. } | Mutation::Delete { key } => key,
        }
    }
}

/// The answer of [`Backend::txn`](crate::Backend::txn).
///
/// `applied = false` is a normal answer, not an error: some assert did not
/// hold and nothing was written. `current` then holds the entries of every
/// asserted key as the store saw them when it checked (one per distinct key,
/// in assert order), so a CAS loop can decide again without another round
/// trip. When `applied = true`, `current` is empty.
///
/// When `applied = true`, `written` may hold the versions the store gave
/// keys the txn put. A writer can infer a put's version only over a key it
/// asserted present (one past the asserted version); the version of a key
/// created over "missing" depends on what the caller cannot see (a deleted
/// key's hidden counter, a reclaimed namespace's floor, a store's own
/// numbering), so a store that knows it reports it here. A store may report
/// nothing (empty): callers then know no created key's version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnOutcome {
    /// Whether every assert held and every mutation was applied.
    pub applied: bool,
    /// On rejection: the current entries of the asserted keys. Empty when applied.
    pub current: Vec<Entry>,
    /// When applied: `(key, version)` of puts whose version the store
    /// reports (any subset of the txn's puts, possibly none).
    pub written: Vec<(String, Version)>,
    /// On rejection, `Some(why)` when the store was asked to confirm that
    /// what it answers survives a failover and could not (Redis with
    /// `?replicas=N`: fewer replicas acknowledged): `current` may show
    /// writes a failover loses, the caller's own earlier txn among them.
    /// The rejection itself is final (the txn never applies later); only a
    /// conclusion drawn from `current` is in doubt. `None` otherwise.
    pub unconfirmed: Option<String>,
}

impl TxnOutcome {
    /// A successful txn (reporting no versions).
    pub fn applied() -> Self {
        Self::applied_at(Vec::new())
    }

    /// A successful txn that gave the keys in `written` these versions.
    pub fn applied_at(written: Vec<(String, Version)>) -> Self {
        TxnOutcome {
            applied: true,
            current: Vec::new(),
            written,
            unconfirmed: None,
        }
    }

    /// A rejected txn with the current entries of the asserted keys.
    pub fn rejected(current: Vec<Entry>) -> Self {
        TxnOutcome {
            applied: false,
            current,
            written: Vec::new(),
            unconfirmed: None,
        }
    }

    /// A rejected txn whose `current` the store could not confirm durable
    /// (see [`TxnOutcome::unconfirmed`]).
    pub fn rejected_unconfirmed(current: Vec<Entry>, why: String) -> Self {
        TxnOutcome {
            unconfirmed: Some(why),
            ..Self::rejected(current)
        }
    }

    /// The version this (applied) txn reports for `key`, if it reports one.
    pub fn written_version(&self, key: &str) -> Option<Version> {
        self.written
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, version)| *version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_no_value() {
        let entry = Entry::present("k", Version(3), b"top-secret".to_vec());
        let put = Mutation::put("k", b"top-secret".to_vec());
        let outcome = TxnOutcome::rejected(vec![entry.clone()]);
        for shown in [
            format!("{entry:?}"),
            format!("{put:?}"),
            format!("{outcome:?}"),
        ] {
            assert!(!shown.contains("top-secret"), "{shown}");
            assert!(shown.contains("<10 bytes>"), "{shown}");
        }
        assert_eq!(
            format!("{:?}", Mutation::delete("k")),
            "Delete { key: \"k\" }"
        );
    }
}
