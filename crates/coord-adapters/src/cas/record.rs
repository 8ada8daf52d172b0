//! Typed records: the one way an adapter keeps its state in a value.
//!
//! Every adapter stores JSON records and reads them back through
//! [`Record`]: a malformed value becomes [`Error::MalformedRecord`] naming the key
//! and what was expected there, and every write goes through
//! [`Record::put`], which stamps the record's [`Nonce`] afresh. The nonce is
//! what lets the engine recognise its own bytes after a txn whose answer was
//! lost (see the [engine's docs](super)): no two writes are byte-identical,
//! even when they change nothing else.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use coord_backend::{Error, Mutation};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

use super::View;
use crate::mint_token;

/// A per-write token inside a record (see the [module docs](self)). Its
/// value means nothing but "this write"; [`Record::put`] replaces it.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Nonce(String);

impl std::fmt::Debug for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Nonce(..)")
    }
}

/// A lease as every record keeps it: whose it is (a secret token) and when
/// it ends, by the adapter's clock (ms since the epoch). Records with more to
/// say about a holder embed it flattened, so its fields sit beside theirs.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// The grant's token: only its holder knows it.
    pub token: String,
    /// When the lease ends.
    pub expires_ms: u64,
}

impl LeaseRecord {
    /// The lease of `token` until `expires_ms`.
    pub fn new(token: impl Into<String>, expires_ms: u64) -> Self {
        LeaseRecord {
            token: token.into(),
            expires_ms,
        }
    }

    /// Whether the lease is unexpired at `now`.
    pub fn is_live(&self, now: u64) -> bool {
        self.expires_ms > now
    }

    /// Whether `token`'s lease is unexpired at `now`.
    pub fn is_held_by(&self, token: &str, now: u64) -> bool {
        self.token == token && self.is_live(now)
    }

    /// When the lease ends, as a time (see [`time_at`]).
    pub(crate) fn expires_at(&self) -> SystemTime {
        time_at(self.expires_ms)
    }

    /// Extend the lease to `until`, never shorten it (a clock stepping back
    /// must not take back time it already granted).
    pub fn extend(&mut self, until: u64) {
        self.expires_ms = self.expires_ms.max(until);
    }
}

impl std::fmt::Debug for LeaseRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseRecord")
            .field("token", &coord_backend::redact::Hidden)
            .field("expires_ms", &self.expires_ms)
            .finish()
    }
}

/// An adapter's record: JSON in the store, with a [`Nonce`] stamped on every write.
pub trait Record: Serialize + DeserializeOwned {
    /// What the record is, for the error a malformed value gets ("a lock record").
    const KIND: &'static str;

    /// The record's nonce, which [`Record::put`] stamps.
    fn nonce_mut(&mut self) -> &mut Nonce;

    /// The record stored under `key` in `view`; `None` when the key is missing.
    fn read(view: &View, key: &str) -> Result<Option<Self>, Error> {
        Self::from_value(key, view.value(key))
    }

    /// The record in an entry's value read from `key`; `None` when missing.
    fn from_value(key: &str, value: Option<&[u8]>) -> Result<Option<Self>, Error> {
        value.map(|bytes| Self::from_bytes(key, bytes)).transpose()
    }

    /// The record in `bytes`, read from `key`.
    fn from_bytes(key: &str, bytes: &[u8]) -> Result<Self, Error> {
        serde_json::from_slice(bytes)
            .map_err(|e| Error::malformed(key, format!("not {}: {e}", Self::KIND)))
    }

    /// The record's bytes as they are (no new nonce): for comparisons and tests.
    fn to_bytes(&self) -> Vec<u8> {
        // Plain structs with string keys: serializing cannot fail.
        serde_json::to_vec(self)
            .unwrap_or_else(|e| panic!("{} does not serialize: {e}", Self::KIND))
    }

    /// Stamp a fresh nonce and write the record under `key`.
    fn put(&mut self, key: impl Into<String>) -> Mutation {
        *self.nonce_mut() = Nonce(mint_token());
        Mutation::put(key, self.to_bytes())
    }
}

/// `impl Record for $record` whose nonce is its `nonce` field.
macro_rules! record_kind {
    ($record:ty, $kind:literal) => {
        impl $crate::cas::Record for $record {
            const KIND: &'static str = $kind;
            fn nonce_mut(&mut self) -> &mut $crate::cas::Nonce {
                &mut self.nonce
            }
        }
    };
}
pub(crate) use record_kind;

/// `d` in whole milliseconds, rounded up (a lease of 0.5 ms lasts 1 ms, not
/// none) and saturating at `u64::MAX`: how every record stores a length of time.
pub fn whole_millis(d: Duration) -> u64 {
    let ms = d.as_millis();
    let ms = if Duration::from_millis(ms as u64) < d {
        ms + 1
    } else {
        ms
    };
    u64::try_from(ms).unwrap_or(u64::MAX)
}

/// The time `ms` milliseconds after the epoch: a time a record stores (in
/// milliseconds, see [`whole_millis`]) as callers are shown it.
pub(crate) fn time_at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Probe {
        n: u64,
        nonce: Nonce,
    }

    impl Record for Probe {
        const KIND: &'static str = "a probe record";
        fn nonce_mut(&mut self) -> &mut Nonce {
            &mut self.nonce
        }
    }

    #[test]
    fn every_put_stamps_a_new_nonce() {
        let mut probe = Probe {
            n: 1,
            nonce: Nonce::default(),
        };
        let first = probe.put("k");
        let second = probe.put("k");
        assert_ne!(first, second, "two writes of the same record must differ");
        let Mutation::Put { value, .. } = second else {
            panic!("a put")
        };
        assert_eq!(Probe::from_bytes("k", &value).unwrap().n, 1);
    }

    #[test]
    fn a_malformed_value_names_its_key_and_kind() {
        let error = match Probe::from_bytes("p/x", b"{") {
            Err(error) => error.to_string(),
            Ok(_) => panic!("read a broken value"),
        };
        assert!(
            error.contains("p/x") && error.contains("a probe record"),
            "{error}"
        );
    }

    /// Records that embed a lease keep the layout they had before it was
    /// shared: `token` and `expires_ms` beside the record's own fields.
    #[test]
    fn an_embedded_lease_keeps_the_stored_layout() {
        #[derive(Serialize, Deserialize)]
        struct Holder {
            fence: u64,
            #[serde(flatten)]
            lease: LeaseRecord,
        }
        let old = br#"{"token":"t","fence":3,"expires_ms":9}"#;
        let holder: Holder = serde_json::from_slice(old).unwrap();
        assert_eq!((holder.fence, holder.lease.token.as_str()), (3, "t"));
        assert!(holder.lease.is_live(8) && !holder.lease.is_live(9));
        let written: serde_json::Value = serde_json::to_value(&holder).unwrap();
        assert_eq!(
            written,
            serde_json::json!({"fence": 3, "token": "t", "expires_ms": 9})
        );
    }

    #[test]
    fn a_lease_is_extended_never_shortened() {
        let mut lease = LeaseRecord::new("t", 100);
        lease.extend(50);
        assert_eq!(
            lease.expires_ms, 100,
            "a clock stepping back takes nothing back"
        );
        lease.extend(150);
        assert!(lease.is_held_by("t", 149) && !lease.is_held_by("u", 149));
    }

    #[test]
    fn whole_millis_rounds_up_and_saturates() {
        assert_eq!(whole_millis(Duration::from_micros(500)), 1);
        assert_eq!(whole_millis(Duration::from_millis(7)), 7);
        assert_eq!(whole_millis(Duration::MAX), u64::MAX);
    }
}
