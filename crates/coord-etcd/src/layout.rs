//! How coord keys and values are laid out in etcd's key space.
//!
//! - etcd key = `coord/` + escaped namespace + `/` + coord key. The namespace
//!   escapes `%` as `%25` and `/` as `%2F`, so it never contains the `/` that
//!   ends it: the prefixes of two different namespaces are never prefixes of
//!   each other (`a`, `ab`, `a:b`, `a/b` are four disjoint ranges).
//! - etcd value = one tag byte, then the payload: [`LIVE_TAG`] + bytes for an
//!   existing key, exactly [`TOMBSTONE`] for a deleted one. Anything else is a
//!   malformed record.

use coord_backend::{Entry, Error, Result, Version};

/// First byte of the etcd value of an existing key; the coord value follows.
pub(crate) const LIVE_TAG: u8 = b'v';

/// The whole etcd value of a deleted key (a tombstone keeps etcd's per-key
/// version counting, so a re-create never reuses a version).
pub(crate) const TOMBSTONE: &[u8] = b"x";

/// The etcd key prefix of a namespace: `coord/<escaped namespace>/`.
pub(crate) fn namespace_prefix(namespace: &str) -> Vec<u8> {
    let mut prefix = b"coord/".to_vec();
    for byte in namespace.bytes() {
        match byte {
            b'%' => prefix.extend_from_slice(b"%25"),
            b'/' => prefix.extend_from_slice(b"%2F"),
            other => prefix.push(other),
        }
    }
    prefix.push(b'/');
    prefix
}

/// The etcd value of a live key holding `value`.
pub(crate) fn encode_live(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(value.len() + 1);
    out.push(LIVE_TAG);
    out.extend_from_slice(value);
    out
}

/// What an etcd key holds, as coord sees it, plus etcd's own version (which
/// also counts tombstone writes and is what txn compares are made on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// No etcd key at all (never written by coord).
    Absent,
    /// A tombstone written at etcd version `.0`: coord reads it as missing.
    Tombstone(i64),
    /// A live key: etcd version (= coord version) and the coord value.
    Live(i64, Vec<u8>),
}

impl Stored {
    /// Decode an etcd (version, value) pair; `key` names the record in errors.
    pub(crate) fn decode(key: &str, etcd_version: i64, mut value: Vec<u8>) -> Result<Stored> {
        if etcd_version <= 0 {
            return Err(Error::malformed(
                key,
                format!("etcd reports version {etcd_version} for an existing key"),
            ));
        }
        match value.first() {
            Some(&LIVE_TAG) => {
                value.remove(0);
                Ok(Stored::Live(etcd_version, value))
            }
            _ if value == TOMBSTONE => Ok(Stored::Tombstone(etcd_version)),
            Some(tag) => Err(Error::malformed(
                key,
                format!("etcd value starts with unknown tag byte 0x{tag:02x} (not written by coord-etcd)"),
            )),
            None => Err(Error::malformed(
                key,
                "empty etcd value (not written by coord-etcd)",
            )),
        }
    }

    /// The version coord reports: tombstones and absent keys are missing.
    pub(crate) fn coord_version(&self) -> Version {
        match self {
            Stored::Live(v, _) => Version(*v as u64),
            Stored::Absent | Stored::Tombstone(_) => Version::MISSING,
        }
    }

    /// The coord entry for `key`.
    pub(crate) fn into_entry(self, key: &str) -> Entry {
        match self {
            Stored::Live(v, value) => Entry::present(key, Version(v as u64), value),
            Stored::Absent | Stored::Tombstone(_) => Entry::missing(key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_prefixes_are_prefix_free() {
        let names = ["a", "ab", "a:b", "a/b", "a%2Fb", "a%b", "%", "/"];
        for x in names {
            for y in names {
                if x == y {
                    continue;
                }
                let (px, py) = (namespace_prefix(x), namespace_prefix(y));
                assert!(
                    !px.starts_with(&py),
                    "prefix of {x:?} ({}) starts with that of {y:?} ({})",
                    String::from_utf8_lossy(&px),
                    String::from_utf8_lossy(&py)
                );
            }
        }
        assert_eq!(namespace_prefix("a/b"), b"coord/a%2Fb/".to_vec());
    }

    #[test]
    fn values_round_trip_and_garbage_is_malformed() {
        assert_eq!(
            Stored::decode("k", 3, encode_live(b"")).unwrap(),
            Stored::Live(3, Vec::new())
        );
        assert_eq!(
            Stored::decode("k", 3, encode_live(b"x")).unwrap(),
            Stored::Live(3, b"x".to_vec())
        );
        assert_eq!(
            Stored::decode("k", 4, TOMBSTONE.to_vec()).unwrap(),
            Stored::Tombstone(4)
        );
        assert_eq!(
            Stored::Tombstone(4).coord_version(),
            coord_backend::Version::MISSING
        );
        for garbage in [&b""[..], b"xx", b"hello", b"\0"] {
            assert!(matches!(
                Stored::decode("k", 1, garbage.to_vec()),
                Err(Error::MalformedRecord { .. })
            ));
        }
    }
}
