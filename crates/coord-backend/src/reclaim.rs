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
//! A reclaim removes at most [`ReclaimOptions::max_tombstones`] tombstones,
//! finds them without reading live keys (each store keeps them findable:
//! docs/shapes.md), and says whether more are left; run it again until
//! [`Reclaimed::more`] is false. Several reclaims may run at once, also
//! from several processes.

/// Options of one [`Backend::reclaim`](crate::Backend::reclaim) call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReclaimOptions {
    /// The most tombstones this call removes (at least 1). Bounds the time
    /// one call holds the store's locks; default 1,000.
    pub max_tombstones: usize,
}

impl ReclaimOptions {
    /// The default options: at most 1,000 tombstones per call.
    pub const DEFAULT: ReclaimOptions = ReclaimOptions {
        max_tombstones: 1000,
    };

    /// Options removing at most `max` tombstones (at least 1).
    pub const fn with_max_tombstones(mut self, max: usize) -> Self {
        self.max_tombstones = if max == 0 { 1 } else { max };
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
