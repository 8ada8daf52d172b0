//! Native locks behind coord's [`Lock`](coord_adapters::lock::Lock) trait:
//! Redis and PostgreSQL's own locking, each with fencing tokens.
//!
//! | type | feature | acquire | renew | release | expiry judged by |
//! | --- | --- | --- | --- | --- | --- |
//! | [`RedisLock`] | `redis` | one script: `SET key token NX PX ttl`, then `INCR` of the key's fence counter | Lua compare-token-and-`PEXPIRE` | Lua compare-token-and-`DEL` | the Redis server (`PX`) |
//! | [`PgAdvisoryLock`] | `postgres` | one statement on an idle session (a new connection when none is idle): `pg_try_advisory_lock(hashtext(name))` and, only when granted, the fence upsert | `SELECT 1` on the lock's connection | `pg_advisory_unlock`; the session goes back to the idle pool | nobody: no TTL, held until released or the session ends |
//!
//! Both pass the same lock suite as coord's generic lock
//! (`coord_conformance::native_lock_tests!`), so code written against
//! `Arc<dyn Lock>` does not change when the backend does; the waiting
//! [`LockExt::lock`](coord_adapters::lock::LockExt::lock) and the renewing
//! [`LockGuard`](coord_adapters::lock::LockGuard) work on top of either.
//!
//! # Contract and boundary
//!
//! - `try_lock` → `Ok(Some(handle))` granted, `Ok(None)` held by someone
//!   else, `Err` the store is broken or the input is bad.
//! - A stale handle (released, expired, taken over, or from another client)
//!   can neither renew nor release: it gets `LockError::Lost` and nothing changes.
//! - Fences are per key, strictly increasing, allocated in the same atomic
//!   step as the grant and never reset by a release. They are kept in the
//!   store (a Redis counter key, a PostgreSQL table row): a store that loses
//!   them (Redis without persistence restarting, a failover that loses the
//!   last writes, someone deleting the row) can hand out a fence again.
//! - Neither lock is stronger than its store. Redis replicates
//!   asynchronously: after a failover two holders can exist at once. A
//!   PostgreSQL advisory lock lives exactly as long as the session that took
//!   it, and has no TTL: a paused holder keeps it.
//!
//! The guide `docs/locks.md` (its examples compiled as doc tests) compares these
//! with the generic lock on every store, and says what each guarantees under
//! pauses, crashes, partitions and failovers.

#[cfg(any(feature = "redis", feature = "postgres"))]
mod common;
#[cfg(feature = "postgres")]
mod pg_lock;
#[cfg(feature = "redis")]
mod redis_lock;

#[cfg(feature = "postgres")]
pub use crate::pg_lock::{PgAdvisoryLock, PgAdvisoryOptions};
#[cfg(feature = "redis")]
pub use crate::redis_lock::{RedisLock, RedisLockOptions};

/// The examples of docs/locks.md, compiled as doc tests (in the workspace
/// only: the guide is not part of the published package).
#[doc = include_str!("../../../docs/locks.md")]
#[cfg(doctest)]
pub struct LocksGuideDoctests;
