//! The single-key fast path of `txn`: one assert and one write on the same
//! key, as one prepared statement instead of a `coord_txn` call.
//!
//! The statement keeps the protocol of `coord_txn` (see the crate docs,
//! "Atomicity boundary"): it takes the same `pg_advisory_xact_lock` on the
//! key (the same hash, the same two-int4 form) before it writes, holds it
//! until it commits, and writes with `version + 1`, a tombstone for a
//! delete, exactly as `coord_txn` does. What it does not do is answer a
//! rejection: when its condition does not hold it writes nothing and returns
//! no row, and the caller then runs the whole txn through `coord_txn`, which
//! checks again under the lock and answers with the current entry. A rejected
//! single-key txn therefore costs two round trips; an applied one, one.
//!
//! Why the check is correct at READ COMMITTED, for each shape:
//! - **assert live at `v`** (`UPDATE … FROM lock WHERE version = v AND value
//!   IS NOT NULL`): the row is updated only after the join produced it, that
//!   is after the advisory lock was granted. If a writer committed a newer
//!   version of the row after this statement's snapshot, PostgreSQL re-reads
//!   the latest committed version and re-checks the condition on it
//!   (EvalPlanQual); a writer still running holds the lock, so this statement
//!   is still waiting. A row created after the snapshot is not seen: no row
//!   back, and `coord_txn` decides.
//! - **assert missing** (`INSERT … SELECT FROM lock ON CONFLICT DO UPDATE …
//!   WHERE value IS NULL`): the lock is taken before anything is inserted;
//!   the conflict check sees every committed row, and the `WHERE` of
//!   `DO UPDATE` is evaluated on the latest committed, locked version.
//!
//! At REPEATABLE READ or SERIALIZABLE the statement takes no lock and
//! matches nothing, so the call falls through to `coord_txn`, which refuses
//! to run (SQLSTATE `CO001`).

use coord_backend::{Assert, Mutation};

/// The advisory lock of `coord_txn` on key `$2` of namespace `$1`, as a
/// one-row CTE, empty unless the transaction runs at READ COMMITTED.
macro_rules! key_lock_cte {
    () => {
        "WITH h AS MATERIALIZED ( \
             SELECT hashtextextended($1::text || '/' || $2::text, 0) AS h \
              WHERE current_setting('transaction_isolation') = 'read committed'), \
         l AS MATERIALIZED ( \
             SELECT pg_advisory_xact_lock((h >> 32)::int4, \
                                          ((h & 4294967295) - 2147483648)::int4) AS locked \
               FROM h) "
    };
}

/// The end of both statements: the written row's version, after the
/// namespace's watchers were woken, the check of `coord_notify` (schema.rs)
/// inlined: a PL/pgSQL call only while a listener's lease is live. The
/// filter is evaluated once per written row, never when nothing was written;
/// `CASE` keeps its order. The statement takes `ACCESS SHARE` on
/// `coord_watch` when it is bound, before its snapshot, and holds it until
/// commit: a new listener waits for it (changes.rs), so a writer whose
/// snapshot predates the lease has committed before that listener's first
/// watch returns.
macro_rules! notify_written {
    () => {
        "SELECT w.version FROM w WHERE CASE \
           WHEN coalesce(current_setting('coord.notify', true), '') = 'off' THEN true \
           WHEN NOT EXISTS (SELECT 1 FROM coord_watch \
                             WHERE ns = $1 AND until > clock_timestamp()) THEN true \
           ELSE coord_notify_send($1::text, ARRAY[$2::text]) END"
    };
}

/// Assert `$2` live at version `$4`; write `$3` (NULL = delete). One row back iff applied.
pub(crate) const WRITE_IF_AT_SQL: &str = concat!(
    key_lock_cte!(),
    ", w AS (UPDATE coord_kv AS c SET version = c.version + 1, value = $3::bytea FROM l \
      WHERE c.ns = $1 AND c.key = $2 AND c.version = $4 AND c.value IS NOT NULL \
      RETURNING c.version) ",
    notify_written!()
);

/// Assert `$2` missing (absent or a tombstone); write `$3` (NULL = delete).
/// One row back iff applied.
pub(crate) const WRITE_IF_MISSING_SQL: &str = concat!(
    key_lock_cte!(),
    ", w AS (INSERT INTO coord_kv AS c (ns, key, version, value) \
     SELECT $1, $2, coord_next_version($1::text), $3::bytea FROM l \
     ON CONFLICT (ns, key) DO UPDATE SET version = c.version + 1, value = EXCLUDED.value \
      WHERE c.value IS NULL \
     RETURNING c.version) ",
    notify_written!()
);

/// A txn the fast path can run: one assert and one mutation on the same key.
pub(crate) struct SingleKey<'a> {
    /// The key.
    pub(crate) key: &'a str,
    /// The asserted version (0 = missing), already mapped by `version_param`.
    pub(crate) version: i64,
    /// The value to write; `None` deletes (writes a tombstone).
    pub(crate) value: Option<&'a [u8]>,
}

impl SingleKey<'_> {
    /// The statement for this shape.
    pub(crate) fn sql(&self) -> &'static str {
        if self.version == 0 {
            WRITE_IF_MISSING_SQL
        } else {
            WRITE_IF_AT_SQL
        }
    }
}

/// The fast-path shape of `asserts` + `mutations`, if they have it.
pub(crate) fn single_key<'a>(
    asserts: &'a [Assert],
    mutations: &'a [Mutation],
    version_param: fn(coord_backend::Version) -> i64,
) -> Option<SingleKey<'a>> {
    let ([assert], [mutation]) = (asserts, mutations) else {
        return None;
    };
    if assert.key != mutation.key() {
        return None;
    }
    let value = match mutation {
        Mutation::Put { value, .. } => Some(value.as_slice()),
        Mutation::Delete { .. } => None,
    };
    Some(SingleKey {
        key: &assert.key,
        version: version_param(assert.version),
        value,
    })
}
