//! The table and the txn function, created once per database (or schema).
//!
//! Creation is idempotent and safe when many processes start at once: it runs
//! in one transaction holding `pg_advisory_xact_lock(SCHEMA_LOCK)`, so only one
//! session at a time issues `CREATE TABLE IF NOT EXISTS` (which alone races on
//! the catalog's unique indexes) and `CREATE OR REPLACE FUNCTION` (which alone
//! fails with "tuple concurrently updated"). A comment on the function records
//! the schema revision; sessions that find the current revision skip the
//! transaction (and the lock) entirely.

use sqlx::{Connection, PgConnection};

/// The `pg_advisory_xact_lock` key serialising schema creation (`"coord_v1"` in ASCII).
const SCHEMA_LOCK: i64 = 0x636f_6f72_645f_7631;

/// The comment [`SCHEMA_SQL`] puts on `coord_txn`; bump both when the SQL changes.
///
/// r2: `coord_txn` refuses to run at an isolation level other than READ
/// COMMITTED (SQLSTATE `CO001`). A client of r1 and one of r2 on one database
/// each reinstall their own revision when they connect (the comparison is
/// for equality); both are correct at READ COMMITTED, which r2 clients force,
/// so this costs DDL, not safety; upgrade every client.
///
/// r3: an applied txn that wrote something calls `pg_notify` on the
/// namespace's channel (`coord_` + md5 of the namespace) with the written
/// keys (change notifications, see `changes.rs`), unless the session set
/// `coord.notify = off`. An r2 and an r3 client on
/// one database reinstall their revisions in turn as above; while r2 is
/// installed no notification is sent, which costs r3 waiters latency (they
/// fall back to polling), never correctness.
///
/// r4: the notification moves into `coord_notify(ns, keys)`, which the
/// single-key fast path (`fast.rs`) calls too; an r3 client's single-key
/// writes would wake nobody, so upgrade every client.
///
/// r5: bounded storage. `coord_floor` keeps one floor per namespace; a key
/// written where no row exists starts at `coord_next_version(ns)` = floor +
/// 1 instead of 1; `coord_reclaim(ns, max)` deletes tombstones under the
/// txns' advisory locks and raises the floor in the same transaction; two
/// partial indexes keep listings off tombstones and reclaims off live rows.
/// An r4 client would create keys at version 1, below the floor: upgrade
/// every client before the first reclaim.
///
/// r6: `coord_reclaim` always plans its queries for the namespace at hand
/// (`plan_cache_mode = force_custom_plan`). From a pooled session's sixth
/// call on, PL/pgSQL's generic plan walked the primary key past every row
/// an earlier batch had deleted, and a reclaim of N tombstones cost O(N²):
/// 100,000 took 90 s, 20 times what a planned batch costs. An r5 client
/// reinstalls the slow body while it is the last to connect; nothing else
/// changes.
///
/// r7: `coord_notify` notifies only while a listener's lease on the
/// namespace is live (table `coord_watch`, written by the listeners of r7
/// clients): NOTIFY's global commit lock is no longer paid by writes nobody
/// watches. A listener of an older client registers no lease, so while r7
/// is installed its waiters get no notification and poll (latency, not
/// correctness); an older client reinstalling its revision notifies always.
/// Upgrade every client.
///
/// r8: the check for a lease takes no advisory lock. What orders a writer's
/// check against a new listener is the `ACCESS SHARE` lock every statement
/// that reads `coord_watch` takes before its snapshot and holds until
/// commit: a new listener, having committed its lease, waits until every
/// transaction that held that lock at that moment has ended (`changes.rs`).
/// The single-key statements check inline (no PL/pgSQL call while nobody
/// watches) and call `coord_notify_send` only while a lease is live;
/// `coord_notify` keeps its signature for r7 clients. An r7 listener waits
/// on the advisory lock, which r8 writers no longer take, so its first
/// wake-ups may be late (latency, not correctness). Upgrade every client.
///
/// r9: bounded storage beside older clients. `coord_clients` holds, per
/// namespace, the storage format each client announced and when, and
/// (client `''`) the namespace's required format (`coord_backend::reclaim`,
/// "Mixed versions"); r9 clients announce before writing and refuse a
/// reclaim while an older client was seen. Nothing else changes; an r8
/// client neither announces nor checks: upgrade every client before the
/// first reclaim (namespaces written by r8 clients need the operator's
/// word, `older_clients_stopped`, for their first reclaim).
///
/// r10: an applied `coord_txn` answers one row `(true, key, version, NULL)`
/// per key it put, the version the put stored (`floor + 1` for a row it
/// created, one above a tombstone's), or the one row `(true, NULL, NULL,
/// NULL)` when it put nothing; the client reports them
/// (`TxnOutcome::written`). Same signature and result type. Clients of
/// r9 and before read only the first row's `applied`, so they run
/// unchanged on r10; an r10 client on r9 (the two reinstall their
/// revisions in turn as above) gets the one row and reports no version,
/// which costs the CAS engine a guess, never correctness.
///
/// r11: `coord_txn` takes the advisory lock of a key it only asserts
/// shared (`pg_advisory_xact_lock_shared`), and exclusive as before for a
/// key it puts or deletes. Txns that assert one hot key without writing it
/// (every completion of a task asserts its board's retention cursor) no
/// longer wait for each other's commits; a writer of the key still waits
/// for them and they for it, so every assert still holds until commit.
/// Same signature and results. An r10 body takes every lock exclusive,
/// which conflicts with an r11 body's shared lock as it must: clients of
/// both revisions on one database stay correct (the slower one costs
/// throughput, never safety).
/// r12: the same answers from fewer statements (a third less server time
/// per multi-key txn, measured with pgbench): the asserts are checked with
/// one `EXISTS`; the puts and deletes are one `INSERT … ON CONFLICT`,
/// whose new rows read the floor in the statement (a snapshot taken after
/// the locks, as `coord_next_version` did per row); the lease check of
/// `coord_notify` is inlined. Same signature, locks and results; every
/// function an older client calls stays. Clients of r11 and r12 on one
/// database reinstall their revisions in turn as above, each correct.
pub(crate) const SCHEMA_TAG: &str = "coord schema r12";

/// The full signature of the txn function (for `to_regprocedure`).
const TXN_SIGNATURE: &str = "coord_txn(text,text[],bigint[],text[],bytea[],text[])";

/// The schema: one table for every namespace, and the one-round-trip txn function.
///
/// `key` uses `COLLATE "C"` so that ordering, range scans and the primary key
/// compare bytes (UTF-8 byte order = code point order), whatever the database's
/// default collation. `value IS NULL` marks a tombstone: the row keeps the
/// key's version counter after a delete, so versions are never reused.
pub const SCHEMA_SQL: &str = r#"
CREATE TABLE IF NOT EXISTS coord_kv (
    ns      text NOT NULL,
    key     text COLLATE "C" NOT NULL,
    version bigint NOT NULL CHECK (version >= 0),
    value   bytea,
    PRIMARY KEY (ns, key)
);

-- The floor of each namespace (see coord_reclaim): a key written where no
-- row exists starts above it, so a reclaimed tombstone's versions are
-- never handed out again.
CREATE TABLE IF NOT EXISTS coord_floor (
    ns    text PRIMARY KEY,
    floor bigint NOT NULL CHECK (floor >= 0)
);

-- The storage format each client announced (and when, in ms since the
-- epoch on its clock); client '' holds the namespace's required format.
CREATE TABLE IF NOT EXISTS coord_clients (
    ns      text NOT NULL,
    client  text NOT NULL,
    format  integer NOT NULL CHECK (format >= 0),
    seen_ms bigint NOT NULL,
    PRIMARY KEY (ns, client)
);

-- Listings read live rows only; reclaims read tombstones only.
CREATE INDEX IF NOT EXISTS coord_kv_live ON coord_kv (ns, key) WHERE value IS NOT NULL;
CREATE INDEX IF NOT EXISTS coord_kv_dead ON coord_kv (ns, key) WHERE value IS NULL;

-- The version of a key written where no row exists. PL/pgSQL (never
-- inlined) and VOLATILE: its query takes a fresh snapshot when called, so a
-- statement that waited for a key's advisory lock sees the floor a reclaim
-- committed while it waited, not the one of the statement's start.
CREATE OR REPLACE FUNCTION coord_next_version(p_ns text) RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN coalesce((SELECT floor FROM coord_floor WHERE ns = p_ns), 0) + 1;
END
$fn$;

-- Delete up to p_max tombstones of p_ns and raise the floor to their
-- highest version, in the caller's transaction. Takes the advisory lock of
-- each key first (the same locks, in the same sorted order, as coord_txn),
-- so a txn on one of these keys runs wholly before (and the tombstone it
-- wrote stays) or wholly after (and starts above the raised floor).
CREATE OR REPLACE FUNCTION coord_reclaim(p_ns text, p_max integer)
RETURNS TABLE (removed bigint, more boolean)
LANGUAGE plpgsql VOLATILE
-- A generic plan cannot use coord_kv_dead for "this namespace's
-- tombstones" as well as a plan made for p_ns: it walks the primary key.
SET plan_cache_mode = force_custom_plan AS $fn$
DECLARE
    candidates text[];
    hashes bigint[];
    h bigint;
    n bigint;
    top bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'coord_reclaim needs READ COMMITTED, the transaction runs at %',
                        current_setting('transaction_isolation')
              USING ERRCODE = 'CO001';
    END IF;
    SELECT array_agg(t.key) INTO candidates
      FROM (SELECT c.key FROM coord_kv c
             WHERE c.ns = p_ns AND c.value IS NULL
             ORDER BY c.key LIMIT p_max) AS t;
    IF candidates IS NULL THEN
        RETURN QUERY SELECT 0::bigint, false;
        RETURN;
    END IF;
    SELECT array_agg(DISTINCT hashtextextended(p_ns || '/' || x, 0)
                     ORDER BY hashtextextended(p_ns || '/' || x, 0))
      INTO hashes
      FROM unnest(candidates) AS x;
    FOREACH h IN ARRAY hashes LOOP
        PERFORM pg_advisory_xact_lock((h >> 32)::int4,
                                      ((h & 4294967295) - 2147483648)::int4);
    END LOOP;
    -- A fresh snapshot, under the locks: a key re-created meanwhile is live
    -- and stays.
    WITH gone AS (
        DELETE FROM coord_kv c
         WHERE c.ns = p_ns AND c.key = ANY(candidates) AND c.value IS NULL
        RETURNING c.version)
    SELECT count(*), max(gone.version) INTO n, top FROM gone;
    IF top IS NOT NULL THEN
        INSERT INTO coord_floor AS f (ns, floor) VALUES (p_ns, top)
        ON CONFLICT (ns) DO UPDATE SET floor = greatest(f.floor, EXCLUDED.floor);
    END IF;
    RETURN QUERY SELECT n, EXISTS (SELECT 1 FROM coord_kv c
                                    WHERE c.ns = p_ns AND c.value IS NULL);
END
$fn$;

-- Who listens: one lease per namespace, written by every client that
-- LISTENs on its channel and renewed while it does (changes.rs). UNLOGGED:
-- renewals wait for no WAL flush; crash recovery empties it, and the
-- listeners, whose connections broke, register again.
CREATE UNLOGGED TABLE IF NOT EXISTS coord_watch (
    ns    text PRIMARY KEY,
    until timestamptz NOT NULL
);

-- Change notifications for the keys a writing transaction wrote, sent by
-- coord_txn and by the single-key statements (fast.rs), only while a
-- listener's lease on the namespace is live: NOTIFY serialises the commits
-- of notifying transactions on one global lock, which an unwatched
-- namespace need not pay. NOTIFY is delivered only when the transaction
-- commits. The payload lists the keys, one per line; when a key holds a
-- newline or the list would pass NOTIFY's 8000-byte limit it is empty
-- ("anything may have changed"). Always true, so a statement can call it in
-- a WHERE clause. No check: the caller found a live lease.
CREATE OR REPLACE FUNCTION coord_notify_send(p_ns text, p_keys text[]) RETURNS boolean
LANGUAGE plpgsql AS $fn$
DECLARE
    payload text;
BEGIN
    payload := array_to_string(p_keys, E'\n');
    IF octet_length(payload) > 7000
       OR EXISTS (SELECT 1 FROM unnest(p_keys) AS w WHERE strpos(w, E'\n') > 0) THEN
        payload := '';
    END IF;
    PERFORM pg_notify('coord_' || md5(p_ns), payload);
    RETURN true;
END
$fn$;

-- The check, then coord_notify_send. Sessions whose client turned
-- notifications off (setting `coord.notify`,
-- PostgresOptions::notify_changes) skip it. The lookup is a statement of its
-- own: it takes ACCESS SHARE on coord_watch before its snapshot and holds it
-- until commit, and a new listener, having committed its lease, waits for
-- every transaction holding that lock (changes.rs): a writer that did not
-- see the lease has committed before the listener's watch returns.
CREATE OR REPLACE FUNCTION coord_notify(p_ns text, p_keys text[]) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF cardinality(p_keys) > 0
       AND coalesce(current_setting('coord.notify', true), '') <> 'off'
       AND EXISTS (SELECT 1 FROM coord_watch
                    WHERE ns = p_ns AND until > clock_timestamp()) THEN
        PERFORM coord_notify_send(p_ns, p_keys);
    END IF;
    RETURN true;
END
$fn$;

CREATE OR REPLACE FUNCTION coord_txn(
    p_ns text,
    p_assert_keys text[],
    p_assert_versions bigint[],
    p_put_keys text[],
    p_put_values bytea[],
    p_delete_keys text[]
) RETURNS TABLE (applied boolean, k text, ver bigint, val bytea)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hashes bigint[];
    exclusive boolean[];
    h bigint;
BEGIN
    -- At REPEATABLE READ or SERIALIZABLE the snapshot was taken when the
    -- calling statement started, before the locks below: the asserts would be
    -- checked against stale versions (write skew). Refuse rather than guess.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'coord_txn needs READ COMMITTED, the transaction runs at %',
                        current_setting('transaction_isolation')
              USING ERRCODE = 'CO001',
                    HINT = 'SET TRANSACTION ISOLATION LEVEL READ COMMITTED before calling it';
    END IF;
    -- A NULL array is an empty one (a caller's own SQL may pass one): it
    -- must not turn the writes' guard below into NULL, a txn answered as
    -- applied that wrote nothing.
    p_assert_keys := coalesce(p_assert_keys, '{}');
    p_assert_versions := coalesce(p_assert_versions, '{}');
    p_put_keys := coalesce(p_put_keys, '{}');
    p_put_values := coalesce(p_put_values, '{}');
    p_delete_keys := coalesce(p_delete_keys, '{}');

    -- Lock every involved key, existing or not, in one global order (sorted
    -- 64-bit hashes), so two txns can never wait on each other in a cycle.
    -- A key this txn writes takes the lock exclusive; a key it only asserts
    -- takes it shared: txns that assert one key (a retention cursor every
    -- completion reads) do not queue behind each other, while a writer of
    -- that key waits for them and they for it. A hash shared by a written
    -- and an asserted key is locked exclusive. The two-int4 form keeps these
    -- locks apart from single-bigint advisory locks
    -- (pg_advisory_lock(hashtext(..)) of lock backends). A hash collision
    -- only serialises two unrelated keys; it never breaks a txn.
    SELECT array_agg(t.h ORDER BY t.h), array_agg(t.w ORDER BY t.h)
      INTO hashes, exclusive
      FROM (SELECT hashtextextended(p_ns || '/' || x.key, 0) AS h, bool_or(x.w) AS w
              FROM (SELECT a AS key, false AS w FROM unnest(p_assert_keys) AS a
                    UNION ALL
                    SELECT u, true FROM unnest(p_put_keys || p_delete_keys) AS u) AS x
             GROUP BY 1) AS t;
    IF hashes IS NOT NULL THEN
        FOR i IN 1 .. cardinality(hashes) LOOP
            h := hashes[i];
            IF exclusive[i] THEN
                PERFORM pg_advisory_xact_lock((h >> 32)::int4,
                                              ((h & 4294967295) - 2147483648)::int4);
            ELSE
                PERFORM pg_advisory_xact_lock_shared((h >> 32)::int4,
                                                     ((h & 4294967295) - 2147483648)::int4);
            END IF;
        END LOOP;
    END IF;

    -- Every writer of these keys holds their locks exclusive until it
    -- commits, and a lock is released only after its commit is visible; each statement below
    -- takes a fresh READ COMMITTED snapshot, so it sees the latest committed
    -- state of every locked key and nobody can change it before we commit.
    IF cardinality(p_assert_keys) > 0 AND EXISTS (
          SELECT 1
            FROM unnest(p_assert_keys, p_assert_versions) AS a(key, version)
            LEFT JOIN coord_kv c ON c.ns = p_ns AND c.key = a.key
           WHERE CASE WHEN c.value IS NULL THEN 0 ELSE c.version END <> a.version) THEN
        RETURN QUERY
            SELECT false, a.key, c.version, c.value
              FROM unnest(p_assert_keys) WITH ORDINALITY AS a(key, ord)
              LEFT JOIN coord_kv c ON c.ns = p_ns AND c.key = a.key
             ORDER BY a.ord;
        RETURN;
    END IF;

    IF cardinality(p_put_keys) + cardinality(p_delete_keys) > 0 THEN
        -- Puts and deletes in one statement (their keys are distinct: the
        -- client refuses a txn that writes one key twice). A delete writes a
        -- tombstone, of a missing key too: the counter moves on every write,
        -- as in the reference store. A row created here starts above the
        -- floor, read by this statement, whose snapshot postdates the locks:
        -- a reclaim of one of these keys has committed its floor by then.
        -- One row back per key put, at the version it stored (applied: true).
        RETURN QUERY
            WITH w AS (
                INSERT INTO coord_kv AS c (ns, key, version, value)
                    SELECT p_ns, u.key,
                           coalesce((SELECT f.floor FROM coord_floor f WHERE f.ns = p_ns), 0) + 1,
                           u.value
                      FROM (SELECT * FROM unnest(p_put_keys, p_put_values)
                            UNION ALL
                            SELECT d, NULL::bytea FROM unnest(p_delete_keys) AS d)
                           AS u(key, value)
                ON CONFLICT (ns, key) DO UPDATE SET version = c.version + 1, value = EXCLUDED.value
                RETURNING c.key, c.version, c.value IS NOT NULL AS put)
            SELECT true, w.key::text, w.version, NULL::bytea FROM w WHERE w.put;

        -- Wake the namespace's watchers (delivered only if this transaction
        -- commits; a rejected txn returned above): the check of
        -- coord_notify, inlined. Its own statement: it takes ACCESS SHARE
        -- on coord_watch before its snapshot (see coord_notify).
        IF coalesce(current_setting('coord.notify', true), '') <> 'off'
           AND EXISTS (SELECT 1 FROM coord_watch
                        WHERE ns = p_ns AND until > clock_timestamp()) THEN
            PERFORM coord_notify_send(p_ns, p_put_keys || p_delete_keys);
        END IF;
    END IF;

    -- Applied without a put: one row all the same.
    IF cardinality(p_put_keys) = 0 THEN
        RETURN QUERY SELECT true, NULL::text, NULL::bigint, NULL::bytea;
    END IF;
END
$fn$;

COMMENT ON FUNCTION coord_txn(text, text[], bigint[], text[], bytea[], text[]) IS 'coord schema r12';
"#;

/// Create the table and the function unless this revision is already installed.
pub(crate) async fn ensure_schema(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    if installed_tag(conn).await?.as_deref() == Some(SCHEMA_TAG) {
        return Ok(());
    }
    // Simple protocol, constants inlined: nothing is left prepared on a
    // server session that a transaction pooler lends to other clients
    // (docs/shapes.md, "Poolers").
    let mut tx = conn
        .begin_with("BEGIN ISOLATION LEVEL READ COMMITTED")
        .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"
    )))
    .execute(&mut *tx)
    .await?;
    // Another process may have finished while we waited for the lock.
    if installed_tag(&mut tx).await?.as_deref() != Some(SCHEMA_TAG) {
        sqlx::raw_sql(SCHEMA_SQL).execute(&mut *tx).await?;
    }
    tx.commit().await
}

/// With schema creation off: fail clearly when the schema is not installed.
pub(crate) async fn check_schema(conn: &mut PgConnection) -> coord_backend::Result<()> {
    let tag = installed_tag(conn)
        .await
        .map_err(|e| crate::errors::before_sending("checking the coord schema", e))?;
    if tag.as_deref() == Some(SCHEMA_TAG) {
        Ok(())
    } else {
        Err(coord_backend::Error::Config(format!(
            "the coord schema ({SCHEMA_TAG}) is not installed in this database (found {tag:?}); \
             run coord_postgres::SCHEMA_SQL or enable PostgresOptions::with_create_schema"
        )))
    }
}

async fn installed_tag(conn: &mut PgConnection) -> Result<Option<String>, sqlx::Error> {
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT obj_description(to_regprocedure('{TXN_SIGNATURE}'), 'pg_proc')"
    )))
    .fetch_one(conn)
    .await?;
    sqlx::Row::try_get(&row, 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn schema_sql_tags_its_revision() {
        let comment = format!(
            "COMMENT ON FUNCTION {} IS '{}';",
            super::TXN_SIGNATURE.replace(',', ", "),
            super::SCHEMA_TAG
        );
        assert!(super::SCHEMA_SQL.contains(&comment), "{comment}");
    }
}
