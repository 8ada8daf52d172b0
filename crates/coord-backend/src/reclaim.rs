//! Reclaiming tombstones: the one maintenance operation of a store.
//!
//! A delete keeps a tombstone: the key's version counter, so that a
//! re-created key never gets a version it had before (a stale assert could
//! pass again: ABA). Kept forever, tombstones make storage grow with every
//! key ever written. [`Backend::reclaim`](crate::Backend::reclaim) removes
//! them without giving that guarantee up:
//!
//! - every store keeps one **floor** per namespace, a version that only ever
//!   rises;
//! - one reclaim removes tombstones and, **in the same atomic step**, raises
//!   the floor to at least the highest version among them;
//! - a key written where no record exists (never written, or reclaimed)
//!   starts at `floor + 1`.
//!
//! So the rule of [`Version`](crate::Version) becomes: every write moves a
//! key's version by exactly 1, and once its tombstone is reclaimed a
//! re-created key starts above every version it ever had (and above every
//! version of every key reclaimed before it). A fresh namespace has floor 0,
//! so its keys start at 1 as before.
//!
//! Why no grace period: a tombstone reads as a missing key, and so does no
//! record at all; the only thing a tombstone holds is its counter, and the
//! floor takes that over in the same step. No reader, writer or late
//! answer can tell a reclaimed tombstone from a kept one, except by the
//! higher version a re-create gets, which is exactly what stays safe. A
//! txn that asserts "missing" on a key while its tombstone is being
//! reclaimed either runs before the reclaim (and writes on the tombstone)
//! or after it (and starts above the raised floor); stores order the two
//! like any two txns on that key.
//!
//! A reclaim removes at most [`ReclaimOptions::max_tombstones`] tombstones
//! and says whether more are left. SQLite, PostgreSQL and Redis find them
//! without reading live keys (a partial index, a sorted set); etcd, whose
//! ranges cannot filter on values, reads the namespace's keys, live ones
//! too, until a reclaim has marked the namespace clean (a new etcd
//! namespace starts clean: docs/shapes.md). Run it again until
//! [`Reclaimed::more`] is false. Several reclaims may run at once, also
//! from several processes.
//!
//! # Mixed versions: storage formats
//!
//! The floor works only if every client honours it: a client built before
//! it (or before some later change of what a reclaim leaves) writes a key
//! with no record at version 1 and hands out a version it had before. So
//! every client of the SQLite, PostgreSQL, Redis and etcd stores
//! **announces** the storage format it writes ([`STORAGE_FORMAT`]) in the
//! namespace: one small record per client (a random id, the format, the
//! client's wall-clock time), written before its first txn and again before
//! a txn once [`ANNOUNCE_EVERY`] has passed (not a write per txn);
//! announcements older than [`ANNOUNCEMENT_TTL`] are removed by the next
//! announcement, so the records stay as many as the clients of the last
//! quarter hour. Beside them one record per namespace holds the oldest
//! format that may write the namespace (its *required* format):
//! [`STORAGE_FORMAT`] when the first announcement found the namespace empty,
//! `0` when it already held records, written by clients from before
//! announcements (which announce nothing and cannot be seen).
//!
//! A reclaim, in the same atomic step as its deletes, refuses with
//! [`Error::FormatMismatch`] while
//!
//! - a client announced an older format within [`ANNOUNCEMENT_TTL`]
//!   (upgrade or stop it; its announcement then ages out), or
//! - the namespace's required format is older than this client's (records
//!   from before announcements: once every older client is stopped or
//!   upgraded, run one reclaim with
//!   [`ReclaimOptions::older_clients_stopped`], `coordctl gc
//!   --older-clients-stopped`, which raises it).
//!
//! And a client refuses to write (same error, on its announcement) in a
//! namespace whose required format is newer than its own: a later coord
//! that changes what a reclaim leaves raises it, and an older client must
//! not guess. Clocks only decide when an announcement ages out: a skew
//! below `ANNOUNCEMENT_TTL - ANNOUNCE_EVERY` (14 minutes) cannot hide a
//! client that is writing. The memory store is one process of one build
//! and announces nothing.

use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Error;

/// The storage format the stores of this build write and announce (see
/// the module docs). 1: no floor (before reclaim existed); 2: the floor,
/// without announcements; 3: announcements and required formats.
pub const STORAGE_FORMAT: u32 = 3;

/// How often a client that writes renews its announcement.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(60);

/// How long an announcement counts as "seen recently".
pub const ANNOUNCEMENT_TTL: Duration = Duration::from_secs(15 * 60);

/// One client's announcements (shared by a backend's clones): its id and
/// format, and when it last announced.
#[derive(Debug)]
pub struct Announcer {
    id: String,
    format: u32,
    last: Mutex<Option<Instant>>,
}

impl Announcer {
    /// A client announcing `format` (the stores pass [`STORAGE_FORMAT`]; a
    /// test may build an older client) under a new random id.
    pub fn new(format: u32) -> Self {
        let random = || {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        };
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
        );
        hasher.write_u32(std::process::id());
        Announcer {
            id: format!("{:016x}{:016x}", random(), hasher.finish()),
            format,
            last: Mutex::new(None),
        }
    }

    /// The client's id (never empty: the empty id is the namespace's record).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The format it announces.
    pub fn format(&self) -> u32 {
        self.format
    }

    /// Whether the next write must announce first.
    pub fn due(&self) -> bool {
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.is_none_or(|at| at.elapsed() >= ANNOUNCE_EVERY)
    }

    /// Record an announcement that was sent at `sent` and committed.
    pub fn announced(&self, sent: Instant) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(sent);
    }
}

/// Milliseconds since the Unix epoch on this client's clock (what
/// announcements are stamped with).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The oldest announcement time that is still "recent" at `now_ms`.
pub fn recent_since(now_ms: u64) -> u64 {
    now_ms.saturating_sub(ANNOUNCEMENT_TTL.as_millis() as u64)
}

/// A client of format `ours` announcing in a namespace whose required
/// format is `required`: refused when the namespace needs a newer client.
pub fn check_announce(ours: u32, required: u32) -> Result<(), Error> {
    if required > ours {
        return Err(Error::FormatMismatch {
            ours,
            theirs: required,
            action: format!(
                "this namespace requires storage format {required} (a newer coord reclaimed it); \
                 this client writes format {ours} and could hand a version out twice: upgrade it"
            ),
        });
    }
    Ok(())
}

/// A reclaim by a client of format `ours` in a namespace whose required
/// format is `required`, where `older` is the most recent announcement of
/// an older format within [`ANNOUNCEMENT_TTL`] (format, milliseconds since
/// the epoch), if any; `stopped`: [`ReclaimOptions::older_clients_stopped`].
/// `Ok(true)`: go on and raise the required format to `ours` in the same
/// step; `Ok(false)`: go on.
pub fn check_reclaim(
    ours: u32,
    required: u32,
    older: Option<(u32, u64)>,
    stopped: bool,
) -> Result<bool, Error> {
    check_announce(ours, required)?;
    if let Some((format, seen_ms)) = older {
        let ago = Duration::from_millis(now_ms().saturating_sub(seen_ms));
        return Err(Error::FormatMismatch {
            ours,
            theirs: format,
            action: format!(
                "reclaim refused: a client writing storage format {format} announced itself in \
                 this namespace {}s ago and would hand out reclaimed versions again; upgrade or \
                 stop it, then retry once its announcement is {}s old",
                ago.as_secs(),
                ANNOUNCEMENT_TTL.as_secs()
            ),
        });
    }
    if required < ours {
        if stopped {
            return Ok(true);
        }
        return Err(Error::FormatMismatch {
            ours,
            theirs: required,
            action: "reclaim refused: this namespace holds records written before clients \
                     announced their storage format, and such clients (which ignore the floor) \
                     cannot be seen; once every client older than this one is stopped or \
                     upgraded, reclaim once with ReclaimOptions::with_older_clients_stopped \
                     (coordctl gc --older-clients-stopped)"
                .to_owned(),
        });
    }
    Ok(false)
}

/// Options of one [`Backend::reclaim`](crate::Backend::reclaim) call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReclaimOptions {
    /// The most tombstones this call removes (at least 1). Bounds the time
    /// one call holds the store's locks; default 1,000.
    pub max_tombstones: usize,
    /// The operator's word that no client older than this one writes the
    /// namespace any more: lets a reclaim go on in a namespace holding
    /// records from before storage formats were announced (and raises its
    /// required format, so later reclaims need it no more). Announced older
    /// clients still refuse it. Default `false`; see the module docs.
    pub older_clients_stopped: bool,
}

impl ReclaimOptions {
    /// The default options: at most 1,000 tombstones per call.
    pub const DEFAULT: ReclaimOptions = ReclaimOptions {
        max_tombstones: 1000,
        older_clients_stopped: false,
    };

    /// Options removing at most `max` tombstones (at least 1).
    pub const fn with_max_tombstones(mut self, max: usize) -> Self {
        self.max_tombstones = if max == 0 { 1 } else { max };
        self
    }

    /// Options with another [`older_clients_stopped`](Self::older_clients_stopped).
    pub const fn with_older_clients_stopped(mut self, stopped: bool) -> Self {
        self.older_clients_stopped = stopped;
        self
    }
}

impl Default for ReclaimOptions {
    fn default() -> Self {
        ReclaimOptions::DEFAULT
    }
}

/// What one reclaim did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reclaimed {
    /// How many tombstones this call removed.
    pub removed: u64,
    /// Whether tombstones may be left (the call stopped at its limit).
    pub more: bool,
}

impl Reclaimed {
    /// A report of `removed` tombstones, `more` possibly left.
    pub const fn new(removed: u64, more: bool) -> Self {
        Reclaimed { removed, more }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_decide_reclaims_and_announcements() {
        let ours = STORAGE_FORMAT;
        assert!(check_announce(ours, ours).is_ok());
        assert!(check_announce(ours, 0).is_ok());
        assert!(matches!(
            check_announce(ours, ours + 1),
            Err(Error::FormatMismatch { theirs, .. }) if theirs == ours + 1
        ));
        assert!(!check_reclaim(ours, ours, None, false).unwrap());
        assert!(matches!(
            check_reclaim(ours, ours, Some((ours - 1, now_ms())), true),
            Err(Error::FormatMismatch { theirs, .. }) if theirs == ours - 1
        ));
        assert!(matches!(
            check_reclaim(ours, 0, None, false),
            Err(Error::FormatMismatch { theirs: 0, .. })
        ));
        assert!(check_reclaim(ours, 0, None, true).unwrap());
        let a = Announcer::new(ours);
        assert!(a.due());
        a.announced(Instant::now());
        assert!(!a.due());
        assert_ne!(a.id(), Announcer::new(ours).id());
        assert!(!a.id().is_empty());
    }
}
