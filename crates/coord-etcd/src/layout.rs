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

/// The etcd key of a namespace's floor marker: `coord-meta/<escaped
/// namespace>/floor`, outside every namespace's range (`coord-meta/` is not
/// `coord/`). Created by the namespace's first reclaim, never deleted; its
/// value is [`MARKER_DIRTY`] until a reclaim found no tombstone left, then
/// [`MARKER_CLEAN`].
pub(crate) fn marker_key(namespace: &str) -> Vec<u8> {
    let mut key = b"coord-meta/".to_vec();
    key.extend_from_slice(&namespace_prefix(namespace)["coord/".len()..]);
    key.extend_from_slice(b"floor");
    key
}

/// The etcd key prefix of a namespace's announcements of storage formats:
/// `coord-meta/<escaped namespace>/clients/` + client id, value
/// `<format>:<milliseconds>` (see `coord_backend::reclaim`, "Mixed versions").
pub(crate) fn clients_prefix(namespace: &str) -> Vec<u8> {
    let mut key = b"coord-meta/".to_vec();
    key.extend_from_slice(&namespace_prefix(namespace)["coord/".len()..]);
    key.extend_from_slice(b"clients/");
    key
}

/// The etcd key of a namespace's required storage format (a decimal):
/// `coord-meta/<escaped namespace>/required`.
pub(crate) fn required_key(namespace: &str) -> Vec<u8> {
    let mut key = b"coord-meta/".to_vec();
    key.extend_from_slice(&namespace_prefix(namespace)["coord/".len()..]);
    key.extend_from_slice(b"required");
    key
}

/// Marker value: tombstones written before the marker may be left.
pub(crate) const MARKER_DIRTY: &[u8] = b"d";
/// Marker value: no tombstone is left (none can be written any more).
pub(crate) const MARKER_CLEAN: &[u8] = b"c";

/// How a namespace's records map to coord versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No marker: a delete writes a tombstone, and coord's version of a key
    /// is etcd's per-key version.
    Tombstones,
    /// The marker exists, created at etcd revision `floor`: a delete is a
    /// real etcd delete, and a key created at revision `c >= floor` has
    /// coord version `c + v - 1` at etcd version `v`. Records created
    /// before keep etcd's version (and may be tombstones until reclaimed).
    Floor {
        /// The marker's create revision.
        floor: i64,
        /// Whether a reclaim found no tombstone left.
        clean: bool,
    },
}

impl Mode {
    /// The mode a read of the marker shows (`None` = no marker).
    pub(crate) fn from_marker(marker: Option<(i64, &[u8])>) -> Mode {
        match marker {
            None => Mode::Tombstones,
            Some((create_revision, value)) => Mode::Floor {
                floor: create_revision,
                clean: value == MARKER_CLEAN,
            },
        }
    }
}

/// What an etcd key holds, as coord sees it, with etcd's own version and
/// create revision (what txn compares are made on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stored {
    /// No etcd key at all (never written by coord, deleted, or reclaimed).
    Absent,
    /// A tombstone written at etcd version `.0`: coord reads it as missing.
    Tombstone(i64),
    /// A live key.
    Live {
        /// etcd's per-key version.
        version: i64,
        /// etcd's create revision of the key (the start of this lifetime).
        create: i64,
        /// The coord value.
        value: Vec<u8>,
    },
}

impl Stored {
    /// Decode an etcd record; `key` names it in errors.
    pub(crate) fn decode(
        key: &str,
        etcd_version: i64,
        create_revision: i64,
        mut value: Vec<u8>,
    ) -> Result<Stored> {
        if etcd_version <= 0 {
            return Err(Error::malformed(
                key,
                format!("etcd reports version {etcd_version} for an existing key"),
            ));
        }
        match value.first() {
            Some(&LIVE_TAG) => {
                value.remove(0);
                Ok(Stored::Live {
                    version: etcd_version,
                    create: create_revision,
                    value,
                })
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

    /// The version coord reports under `mode`: tombstones and absent keys
    /// are missing.
    pub(crate) fn coord_version(&self, mode: Mode) -> Version {
        match self {
            Stored::Live {
                version, create, ..
            } => Version(coord_version_of(*version, *create, mode)),
            Stored::Absent | Stored::Tombstone(_) => Version::MISSING,
        }
    }

    /// The coord entry for `key` under `mode`.
    pub(crate) fn into_entry(self, key: &str, mode: Mode) -> Entry {
        let version = self.coord_version(mode);
        match self {
            Stored::Live { value, .. } => Entry::present(key, version, value),
            Stored::Absent | Stored::Tombstone(_) => Entry::missing(key),
        }
    }
}

/// coord's version of a live record at etcd version `version`, created at
/// revision `create`, under `mode`.
pub(crate) fn coord_version_of(version: i64, create: i64, mode: Mode) -> u64 {
    match mode {
        Mode::Floor { floor, .. } if create >= floor => (create + version - 1) as u64,
        _ => version as u64,
    }
}

/// The etcd version at which a record created at revision `create` has
/// coord version `coord` under `mode` (`None`: no etcd version of that
/// lifetime has it).
pub(crate) fn etcd_version_of(coord: Version, create: i64, mode: Mode) -> Option<i64> {
    let coord = i64::try_from(coord.0).ok()?;
    let version = match mode {
        Mode::Floor { floor, .. } if create >= floor => coord - create + 1,
        _ => coord,
    };
    (version >= 1).then_some(version)
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
        let live = |version, value: &[u8]| Stored::Live {
            version,
            create: 7,
            value: value.to_vec(),
        };
        assert_eq!(
            Stored::decode("k", 3, 7, encode_live(b"")).unwrap(),
            live(3, b"")
        );
        assert_eq!(
            Stored::decode("k", 3, 7, encode_live(b"x")).unwrap(),
            live(3, b"x")
        );
        assert_eq!(
            Stored::decode("k", 4, 7, TOMBSTONE.to_vec()).unwrap(),
            Stored::Tombstone(4)
        );
        assert_eq!(
            Stored::Tombstone(4).coord_version(Mode::Tombstones),
            coord_backend::Version::MISSING
        );
        for garbage in [&b""[..], b"xx", b"hello", b"\0"] {
            assert!(matches!(
                Stored::decode("k", 1, 1, garbage.to_vec()),
                Err(Error::MalformedRecord { .. })
            ));
        }
    }

    #[test]
    fn versions_under_a_floor() {
        let floor = Mode::Floor {
            floor: 100,
            clean: false,
        };
        // Created before the marker: etcd's version, as without one.
        assert_eq!(coord_version_of(5, 40, floor), 5);
        assert_eq!(etcd_version_of(Version(5), 40, floor), Some(5));
        // Created at revision 120: starts at 120, +1 per write.
        assert_eq!(coord_version_of(1, 120, floor), 120);
        assert_eq!(coord_version_of(3, 120, floor), 122);
        assert_eq!(etcd_version_of(Version(122), 120, floor), Some(3));
        assert_eq!(etcd_version_of(Version(119), 120, floor), None);
        assert_eq!(coord_version_of(3, 120, Mode::Tombstones), 3);
        assert!(!marker_key("a").starts_with(&namespace_prefix("a")));
        assert_eq!(marker_key("a/b"), b"coord-meta/a%2Fb/floor".to_vec());
    }
}
