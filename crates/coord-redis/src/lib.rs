//! coord's store on Redis, standalone (optionally found through Sentinels)
//! or Redis Cluster: each primitive is **one Lua script call**.
//!
//! # Shape
//!
//! Every key `K` of namespace `NS` is a hash at `coord:{NS}:k:K` with field
//! `v` (the version counter) and field `d` (the value). A delete removes `d`
//! and bumps `v`: the hash stays as a **tombstone**, so a re-created key
//! continues from the old counter and a version is never handed out twice
//! (no ABA). Tombstones stay until [`Backend::reclaim`](coord_backend::Backend::reclaim)
//! removes them and raises the namespace's floor (`coord:{NS}:floor`) in the
//! same script; tombstones are found through the set `coord:{NS}:dead`
//! (tombstones written before that set existed are not in it and stay).
//! Clients announce their storage format in the hash `coord:{NS}:clients`,
//! and a reclaim refuses while an older one was seen
//! (`coord_backend::reclaim`, "Mixed versions").
//! The live keys are also members of the sorted set `coord:{NS}:idx` (all
//! scores 0), maintained by the same script that writes them.
//!
//! | primitive | what runs | round trips |
//! | --- | --- | --- |
//! | [`snapshot`](coord_backend::Backend::snapshot) | one script: `HMGET v d` per key | 1 (`EVALSHA`) |
//! | [`txn`](coord_backend::Backend::txn) | one script: read + check every touched key, compare every assert, then `HINCRBY v` / `HSET d` or `HDEL d` / `ZADD` or `ZREM`; a put over the one live key it asserts, a smaller script touching only that hash | 1 (`EVALSHA`) |
//! | [`keys`](coord_backend::Backend::keys) | one script: `ZRANGEBYLEX idx [prefix (prefix\xff` | 1 (`EVALSHA`) |
//!
//! A script the server has not cached yet costs one extra `SCRIPT LOAD` round
//! trip, once per server (the `NOSCRIPT` fallback of [`redis::Script`]).
//! Prefixes are bytes in a lexicographic range, never a pattern (`KEYS` and
//! `SCAN` are neither atomic nor cluster-safe): `*`, `?`, `[`, `%`, `{` match
//! only themselves. UTF-8 never contains the byte `0xFF`, so
//! `(prefix 0xFF` is an exact upper bound of "starts with prefix".
//!
//! # Atomicity boundary
//!
//! - **One script is atomic**: Redis runs one script at a time, nothing else
//!   interleaves. Each script reads and checks everything before its first
//!   write, so a script that fails never leaves half a txn behind.
//! - **No isolation between scripts**: a snapshot and a later txn are two
//!   steps; the txn's version asserts are what makes the pair safe (CAS).
//! - **One namespace = one hash slot = one shard**: every Redis key of a
//!   namespace carries the `{NS}` hash tag and every key a script touches is
//!   passed in `KEYS`, so scripts run on Redis Cluster. The flip side: a
//!   namespace never spreads over several shards; use several namespaces to
//!   spread load.
//! - **Durability is Redis's**: replication is asynchronous, so a failover
//!   can lose writes that were acknowledged (a lock granted twice, a side
//!   effect run twice). `?replicas=N` (below) narrows that window without
//!   closing it. With persistence off, a restart forgets everything. Use
//!   PostgreSQL or etcd when that is not acceptable.
//!
//! # Connections and errors
//!
//! - `redis://[user:password@]host:port[/db]` and `rediss://…` (TLS, feature
//!   `tls`, on by default: rustls with the `ring` provider and the OS trust
//!   store): one multiplexed connection, made again (with
//!   [`RedisOptions::reconnect_retries`]) by the first call after it broke.
//! - `redis+cluster://[user:password@]host:port,host:port,…` and
//!   `rediss+cluster://…`: a [`redis::cluster_async::ClusterConnection`]
//!   seeded with those nodes (it discovers the others and reconnects itself).
//! - `redis+sentinel://[user:password@]host:port,host:port/MASTER_NAME`:
//!   the primary that the Sentinels name for `MASTER_NAME` (each Sentinel
//!   asked in turn; one that does not know the name, or reports its master
//!   down, is passed over), which must answer `ROLE` as a master. User,
//!   password, `?protocol=` and `?db=` are the data nodes'; the Sentinels
//!   are asked without authentication or TLS. Any other parameter is
//!   [`Error::Config`](coord_backend::Error::Config).
//!   **Failover**: after a connection failure, or a `-READONLY` reply (a
//!   write that reached a demoted primary; it ran nothing), the next
//!   connection asks the Sentinels again, so no write goes to a replica. A
//!   `READONLY` txn is sent again (at most [`RedisOptions::redirect_retries`]
//!   times), then is [`Error::Unavailable`](coord_backend::Error::Unavailable);
//!   a txn whose connection dropped stays
//!   [`Error::Indeterminate`](coord_backend::Error::Indeterminate). Reads
//!   go to the same connection: until it is found broken, a demoted primary
//!   answers them (Sentinel closes client connections when it reconfigures
//!   a server, so this is short). The change subscriber ends once the store
//!   reconnected to a (re)discovered primary: watches fail, waiters poll,
//!   the next watch subscribes on the new primary. No Sentinel names a
//!   usable primary (unknown name, or none reachable):
//!   [`Error::Unavailable`](coord_backend::Error::Unavailable) naming the
//!   Sentinels and the master, never the password.
//! - `?namespace=NAME` selects the namespace (see [`coord_backend::StoreUrl`]);
//!   other query parameters go to the redis client (e.g. `protocol=resp3`).
//!
//! # Replication acknowledgement: `?replicas=N&replica_timeout_ms=T`
//!
//! Off by default; any URL form. Every txn script is followed, in the same
//! pipeline and on the same connection (on Cluster, the master of the
//! namespace's slot, where the script ran), by a write to the namespace's
//! barrier key `coord:{NS}:ack` and `WAIT N T` ([`server::ReplicaAck`]):
//! **still one round trip**, which now lasts until N replicas acknowledged
//! the connection's writes or T ms passed (default 1000). An applied txn
//! that fewer than N replicas acknowledged is
//! [`Error::Indeterminate`](coord_backend::Error::Indeterminate), never
//! success: it is **not rolled back**, stays readable on the primary, and
//! may or may not survive a failover. A rejected txn is judged too: the
//! state that rejected it may be a write no replica holds yet (the caller's
//! own earlier txn among them, whose lost answer the CAS engine settles by
//! sending it again and reading the rejection), so short of N the rejection
//! is marked [`TxnOutcome::unconfirmed`](coord_backend::TxnOutcome::unconfirmed)
//! and the engine does not conclude "my first send applied" from it (the
//! caller gets `Indeterminate`); a rejection is final, so any other use of
//! it is unchanged. The barrier is why `WAIT` covers that state: since
//! Redis 7.2, `WAIT` counts replicas up to the connection's last *propagated*
//! write, and a script that wrote nothing propagates nothing (up to 7.0 the
//! mark moved after every command, so there the barrier only costs a SET). What it
//! promises: a txn reported applied, directly or by the engine's settling of
//! a lost answer, was held by N replicas when the reply came. What it does not: `WAIT` is not
//! consensus; Sentinel (or Cluster) may still promote a replica that did not
//! get it, losing an acknowledged write. Reclaims, format announcements and
//! reads are not waited for.
//!
//! Connecting reads `maxmemory-policy` once (`CONFIG GET`, on every master
//! of a cluster) and refuses, with [`Error::Config`](coord_backend::Error::Config),
//! a server that may evict keys: an evicted record takes its version counter
//! and tombstone with it, so a version could be handed out again. Only
//! `noeviction` is accepted, unless [`RedisOptions::allow_eviction`] is set.
//! Where `CONFIG` is renamed or denied, a warning is logged (`tracing`) and
//! the connection is kept. Later calls cost no extra round trip.
//!
//! A call that found no connection and could not make one (refused, timed
//! out, reset during the handshake) sent nothing and is
//! [`Error::Unavailable`](coord_backend::Error::Unavailable), like a server
//! error that runs nothing (`LOADING`, `BUSY`, `OOM`, `NOSCRIPT`).
//! An I/O error, a timeout or a dropped connection while a txn script was
//! in flight is [`Error::Indeterminate`](coord_backend::Error::Indeterminate):
//! the script may have run. A txn is never resent by this crate after it may
//! have reached the server (the cluster client's own retries are off).
//! Cluster answers that say the script did not run are followed:
//! `MOVED` and `ASK` (a slot being resharded) send it to the node they name
//! (`ASK` as `ASKING` + `EVAL` in one pipeline), `TRYAGAIN` and `CLUSTERDOWN`
//! are waited out, at most [`RedisOptions::redirect_retries`] times in all.
//! Snapshots and keys are reads: they are retried a few times and then fail
//! as `Unavailable`. A script reply that is not what the scripts return, or
//! a record this crate did not write (a wrong type, a version field that is
//! not a decimal in `0..2^63`), is
//! [`Error::MalformedRecord`](coord_backend::Error::MalformedRecord), and
//! a txn touching it writes nothing.
//!
//! The client cannot tell "not sent" from "sent, reply lost" on a connection
//! that broke under it: with RESP2 (the default) a drop nobody has noticed
//! yet makes the next txn [`Error::Indeterminate`](coord_backend::Error::Indeterminate)
//! although it never left; the adapters resolve that by re-reading. With
//! `?protocol=resp3` the connection reports its own drop and the next call
//! reconnects before sending.
//!
//! ```no_run
//! use coord_backend::{Assert, Backend, Mutation, StoreUrl};
//! use coord_redis::RedisBackend;
//!
//! # async fn demo() -> coord_backend::Result<()> {
//! let url = StoreUrl::parse("redis://127.0.0.1:6379?namespace=billing")?;
//! let store = RedisBackend::connect(&url).await?;
//! let out = store
//!     .txn(&[Assert::missing("job/1")], &[Mutation::put("job/1", b"pending".to_vec())])
//!     .await?;
//! assert!(out.applied);
//! # Ok(())
//! # }
//! ```

mod backend;
mod changes;
mod options;
mod scripts;
pub mod server;

pub use backend::RedisBackend;
pub use options::RedisOptions;
