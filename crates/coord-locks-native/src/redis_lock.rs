//! [`RedisLock`]: single-node Redlock with fencing tokens.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime};

use coord_adapters::lock::{
    async_trait, observe_release, observe_renew, observe_try_lock, validate_lock_input, Lock,
    LockError, LockHandle, LostReason,
};
use coord_adapters::mint_token;
use coord_backend::{Error, InvalidInput, StoreUrl};
use coord_redis::server::{
    check_eviction, check_primary, connect_error, eviction_policy_cmd, is_read_only, ran_nothing,
    EvictionCheck, ReplicaAck, SentinelTarget,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{ErrorKind, RedisError, RedisResult, Script, Value};

use crate::common::{default_prefix, observed_lock, require_scheme};

/// SET NX PX and, only when it took the key, the fence: one atomic step, so
/// no grant goes without a fence and no fence is spent on a refusal.
/// The fence counter is checked before the `SET`: a script that fails at
/// `INCR` would keep the lock key it already set. A counter `INCR` could not
/// have made (not a string, a sign, leading zeros, letters, `i64::MAX` or
/// more) is reported, never incremented.
/// Reply: the new fence (>= 1), 0 when the key is held, -1 for a damaged
/// fence counter.
const ACQUIRE: &str = r"
local f = redis.pcall('GET', KEYS[2])
if type(f) == 'table' then return -1 end
if f and f ~= '0' then
  if not string.match(f, '^[1-9]%d*$') then return -1 end
  if #f > 19 or (#f == 19 and f >= '9223372036854775807') then return -1 end
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
";

/// The end of [`RENEW`] and [`RELEASE`] once the token did not match: why
/// not (2 taken over: the fence counter, KEYS[2], is past this handle's
/// fence, ARGV[3]; 0 not held; -1 the counter is damaged).
macro_rules! not_held_lua {
    () => {
        r"
local f = redis.pcall('GET', KEYS[2])
if type(f) == 'table' then return -1 end
f = tonumber(f or '0')
if not f then return -1 end
if f > tonumber(ARGV[3]) then
  return 2
end
return 0
"
    };
}

/// Compare the token, then extend. Reply: 1 renewed; 2 someone was granted
/// the key after this handle (taken over); 0 not held (expired or released:
/// Redis cannot tell which once the key is gone); -1 the fence counter is
/// damaged (nothing was written).
const RENEW: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end",
    not_held_lua!()
);

/// Compare the token, then delete. Same replies as [`RENEW`]. The fence
/// counter is never deleted: it must survive the release.
const RELEASE: &str = concat!(
    r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end",
    not_held_lua!()
);

static ACQUIRE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE));
static RENEW_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW));
static RELEASE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE));

/// The longest TTL accepted: Redis refuses expiries it cannot add to its
/// clock, and a lease of centuries is a bug in the caller anyway.
const MAX_TTL: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Options of a [`RedisLock`].
///
/// ```
/// use std::time::Duration;
/// use coord_locks_native::RedisLockOptions;
///
/// let options = RedisLockOptions::default()
///     .with_key_prefix("billing:locks:")
///     .with_response_timeout(Some(Duration::from_secs(2)));
/// assert_eq!(options.key_prefix.as_deref(), Some("billing:locks:"));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisLockOptions {
    /// Prefix of every Redis key this lock writes. `None` (the default):
    /// `<namespace>:lock:`, with the namespace of the URL (`?namespace=`,
    /// default `coord`). Must not contain `{` or `}` (the key's hash tag
    /// follows it).
    pub key_prefix: Option<String>,
    /// How long to wait for a connection (default 5 s).
    pub connect_timeout: Duration,
    /// How long to wait for an answer before the call fails (default 5 s;
    /// `None` = forever, which a lock should not do: a hung call would hold
    /// its caller past the TTL).
    pub response_timeout: Option<Duration>,
    /// Connect to a server whose `maxmemory-policy` is not `noeviction`.
    /// Default `false`: such a server may evict a fence counter under
    /// memory pressure and hand a fence out twice.
    pub allow_eviction: bool,
}

impl Default for RedisLockOptions {
    fn default() -> Self {
        RedisLockOptions {
            key_prefix: None,
            connect_timeout: Duration::from_secs(5),
            response_timeout: Some(Duration::from_secs(5)),
            allow_eviction: false,
        }
    }
}

coord_backend::setters! {
    RedisLockOptions {
        /// Use `prefix` for every Redis key instead of `<namespace>:lock:`.
        with_key_prefix(prefix: impl Into<String>) => key_prefix = Some(prefix.into());
        /// Wait at most `timeout` for a connection.
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// Wait at most `timeout` for each answer (`None` = forever).
        with_response_timeout(timeout: Option<Duration>) => response_timeout = timeout;
        /// Set [`RedisLockOptions::allow_eviction`].
        with_allow_eviction(allow: bool) => allow_eviction = allow;
    }
}

/// Single-node Redlock with fencing tokens, judged by the Redis server's clock.
///
/// Key layout, for a lock key `K` and prefix `P` (default `<namespace>:lock:`):
///
/// - `P{K}`: the lock, a string holding the holder's random token, with a
///   `PX` expiry (absent when free);
/// - `P{K}:fence`: the fence counter, `INCR`ed by every grant, never
///   deleted and never given an expiry, so fences survive releases and
///   expiries (one small key per lock key ever taken stays in Redis).
///
/// Both keys start with `P{K}`, so they share one hash tag (one slot).
///
/// | call | what runs | round trips |
/// | --- | --- | --- |
/// | [`try_lock`](Lock::try_lock) | one script: `SET P{K} token NX PX ttl`, then `INCR P{K}:fence` if it was set | 1 (`EVALSHA`) |
/// | [`renew`](Lock::renew) | one script: `GET` = token → `PEXPIRE` | 1 |
/// | [`release`](Lock::release) | one script: `GET` = token → `DEL` | 1 |
///
/// (Plus one `SCRIPT LOAD` per script the first time a server sees it.)
///
/// # Boundary
///
/// - **One primary** (`redis://`, or `rediss://` when the `redis` crate is
///   built with TLS, or `redis+sentinel://h:p,h:p/MASTER`: the primary the
///   Sentinels name, `ROLE` checked, asked again after a connection failure
///   or a `READONLY` reply, which is `Unavailable`: nothing ran): this is the
///   single-node variant of Redlock; majority Redlock over N independent
///   servers is out of scope.
/// - **`?replicas=N&replica_timeout_ms=T`** (default off): `WAIT N T`
///   pipelined behind every grant, renewal and release (one round trip).
///   Fewer than N replicas: `Indeterminate` (a grant is then undone like
///   any indeterminate grant; a renewal or release stays applied). Not
///   consensus: see [`ReplicaAck`].
/// - **Expiry is judged by the server** (`PX`): the client's clock does not
///   decide anything. The handle's [`expires_at`](LockHandle::expires_at) is
///   read on the client *before* the request is sent, so it never lies later
///   than the server's expiry, but a paused process can still act after its
///   lease ran out: pass [`LockHandle::fence`] downstream.
/// - **Replication is asynchronous**: when a primary fails over before a
///   grant (or a fence `INCR`) reached the replica, the new primary grants
///   the key again, possibly with a fence already handed out. Redis without
///   persistence forgets every lock and fence on restart. See `docs/locks.md`.
/// - **`maxmemory-policy noeviction`**: an evicted fence counter would
///   start again at 1. [`RedisLock::connect`] refuses another policy unless
///   [`RedisLockOptions::allow_eviction`] is set.
/// - A damaged fence counter (not a decimal below `2^63 - 1`, which `INCR`
///   could not have made) is `MalformedRecord`, and the acquire writes nothing.
/// - An acquire whose answer is lost (connection dropped after sending) is
///   undone with a compare-token `DEL` (best effort) and reported as an
///   error: the caller never holds a lock it was not told about (if the
///   undo cannot reach the server either, the orphan lease expires after its TTL).
///
/// ```no_run
/// use std::time::Duration;
/// use coord_adapters::lock::Lock;
/// use coord_locks_native::RedisLock;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let url = coord_backend::StoreUrl::parse("redis://127.0.0.1:6379?namespace=billing")?;
/// let lock = RedisLock::connect(&url).await?;
/// if let Some(handle) = lock.try_lock("invoices", Duration::from_secs(30)).await? {
///     // ... work, passing handle.fence() to every protected write ...
///     lock.release(handle).await?;
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisLock {
    conn: Target,
    prefix: String,
    /// The URL without its password, for messages.
    endpoint: String,
    /// `?replicas=N&replica_timeout_ms=T`: `WAIT` behind every write.
    ack: Option<ReplicaAck>,
}

/// Where the lock's scripts go.
#[derive(Clone)]
enum Target {
    /// One server (its connection manager reconnects by itself).
    Fixed(ConnectionManager),
    /// The primary the Sentinels name, asked again after a connection
    /// failure or a `READONLY` answer.
    Sentinel(Arc<Followed>),
}

struct Followed {
    sentinels: SentinelTarget,
    config: ConnectionManagerConfig,
    current: tokio::sync::Mutex<Option<ConnectionManager>>,
}

impl Followed {
    /// The connection to the primary, made (after asking the Sentinels and
    /// checking `ROLE`) when there is none. Its errors sent nothing.
    async fn connection(&self) -> RedisResult<ConnectionManager> {
        let mut current = self.current.lock().await;
        if let Some(conn) = current.as_ref() {
            return Ok(conn.clone());
        }
        let client = self.sentinels.primary().await?;
        let mut conn = ConnectionManager::new_with_config(client, self.config.clone()).await?;
        check_primary(&mut conn).await?;
        *current = Some(conn.clone());
        Ok(conn)
    }

    /// After `error`: forget a connection that broke or reached a replica,
    /// so that the next call asks the Sentinels again.
    async fn note(&self, error: &RedisError) {
        if is_read_only(error) || error.is_unrecoverable_error() || error.is_io_error() {
            *self.current.lock().await = None;
        }
    }
}

impl Target {
    /// Run `script` (plus `WAIT` behind it, in the same pipeline, when `ack`
    /// is given; `SCRIPT LOAD` first when the server does not know it).
    /// `Err(NotSent)` when no connection could be made.
    async fn invoke(
        &self,
        script: &Script,
        keys: [String; 2],
        args: &[Vec<u8>],
        ack: Option<ReplicaAck>,
    ) -> Result<(Value, Option<RedisResult<Value>>), Sent> {
        let mut conn = match self {
            Target::Fixed(conn) => conn.clone(),
            Target::Sentinel(followed) => followed.connection().await.map_err(Sent::No)?,
        };
        let mut result = send(&mut conn, script, &keys, args, ack).await;
        if let Err(e) = &result {
            if e.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript) {
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(script_source(script));
                result = match load.query_async::<String>(&mut conn).await {
                    Ok(_) => send(&mut conn, script, &keys, args, ack).await,
                    Err(e) => Err(e),
                };
            }
        }
        if let (Err(e), Target::Sentinel(followed)) = (&result, self) {
            followed.note(e).await;
        }
        result.map_err(Sent::Yes)
    }
}

/// How far a failed [`Target::invoke`] got.
enum Sent {
    /// No connection: nothing was sent.
    No(RedisError),
    /// Sent (or maybe sent).
    Yes(RedisError),
}

/// The source of one of this module's scripts (for `SCRIPT LOAD`).
fn script_source(script: &Script) -> &'static str {
    let hash = script.get_hash();
    [ACQUIRE, RENEW, RELEASE]
        .into_iter()
        .find(|source| Script::new(source).get_hash() == hash)
        .expect("one of this module's scripts")
}

/// `EVALSHA`, and `WAIT` behind it when `ack` is given: one pipeline, one round trip.
async fn send(
    conn: &mut ConnectionManager,
    script: &Script,
    keys: &[String; 2],
    args: &[Vec<u8>],
    ack: Option<ReplicaAck>,
) -> RedisResult<(Value, Option<RedisResult<Value>>)> {
    let mut eval = redis::cmd("EVALSHA");
    eval.arg(script.get_hash()).arg(2).arg(keys.as_slice());
    for arg in args {
        eval.arg(arg.as_slice());
    }
    let Some(ack) = ack else {
        return Ok((eval.query_async::<Value>(conn).await?, None));
    };
    let mut pipe = redis::pipe();
    pipe.add_command(eval).add_command(ack.command());
    let mut replies = conn.req_packed_commands(&pipe, 0, 2).await?;
    let wait = replies.pop().unwrap_or(Value::Nil).extract_error();
    let value = replies.pop().unwrap_or(Value::Nil).extract_error()?;
    Ok((value, Some(wait)))
}

/// A script's integer reply.
fn integer(value: Value) -> RedisResult<i64> {
    redis::from_redis_value(value).map_err(RedisError::from)
}

impl fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLock")
            .field("endpoint", &self.endpoint)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl RedisLock {
    /// Connect to `url` (`redis://[user:password@]host:port[/db][?namespace=NS]`,
    /// or `redis+sentinel://host:port,host:port/MASTER[?namespace=NS]`: the
    /// primary the Sentinels name, followed across failovers; both take
    /// `replicas=N&replica_timeout_ms=T`, see [`ReplicaAck`])
    /// with [`RedisLockOptions::default`].
    ///
    /// Fails with [`coord_backend::Error::Config`] for a URL it cannot use or a
    /// server whose `maxmemory-policy` is not `noeviction` (read once here;
    /// see [`RedisLockOptions::allow_eviction`]), and
    /// [`coord_backend::Error::Unavailable`] when the server does not answer.
    pub async fn connect(url: &StoreUrl) -> Result<Self, Error> {
        Self::connect_with(url, RedisLockOptions::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &StoreUrl, options: RedisLockOptions) -> Result<Self, Error> {
        require_scheme(
            url,
            &["redis", "rediss", "redis+sentinel"],
            "RedisLock needs a redis://, rediss:// or redis+sentinel:// URL (one primary)",
        )?;
        let endpoint = coord_backend::redact::url(url.without_namespace());
        let (client_url, ack) = ReplicaAck::take(url.without_namespace())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(options.response_timeout)
            .set_number_of_retries(3)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(500));
        let (target, mut conn) = if url.scheme() == "redis+sentinel" {
            let followed = Followed {
                sentinels: SentinelTarget::parse(url, options.connect_timeout * 3)?,
                config,
                current: tokio::sync::Mutex::new(None),
            };
            let conn = followed
                .connection()
                .await
                .map_err(|e| connect_error(&endpoint, e))?;
            (Target::Sentinel(Arc::new(followed)), conn)
        } else {
            let client = redis::Client::open(client_url)
                .map_err(|e| Error::Config(format!("redis URL {endpoint}: {e}")))?;
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(|e| connect_error(&endpoint, e))?;
            (Target::Fixed(conn.clone()), conn)
        };
        if !options.allow_eviction {
            let reply = eviction_policy_cmd().query_async(&mut conn).await;
            check_eviction(&endpoint, reply, LOCK_EVICTION)?;
        }
        let prefix = options
            .key_prefix
            .unwrap_or_else(|| default_prefix(url.namespace()));
        Self::from_target(target, prefix, endpoint, ack)
    }

    /// A lock over an existing connection (shared with other users of it),
    /// writing keys under `prefix`. The server's `maxmemory-policy` is not
    /// checked here: it must be `noeviction` (see [`RedisLock::connect`]).
    pub fn from_connection_manager(
        conn: ConnectionManager,
        prefix: impl Into<String>,
    ) -> Result<Self, Error> {
        Self::from_target(Target::Fixed(conn), prefix.into(), "redis".to_owned(), None)
    }

    fn from_target(
        conn: Target,
        prefix: String,
        endpoint: String,
        ack: Option<ReplicaAck>,
    ) -> Result<Self, Error> {
        if prefix.contains(['{', '}']) {
            return Err(Error::Config(format!(
                "RedisLock key prefix {prefix:?} must not contain '{{' or '}}' \
                 (the lock key's hash tag follows it)"
            )));
        }
        Ok(RedisLock {
            conn,
            prefix,
            endpoint,
            ack,
        })
    }

    /// The Redis key holding the lock `key` (its value is the holder's token).
    pub fn lock_key(&self, key: &str) -> String {
        format!("{}{{{key}}}", self.prefix)
    }

    /// The Redis key holding the fence counter of the lock `key`.
    pub fn fence_key(&self, key: &str) -> String {
        format!("{}{{{key}}}:fence", self.prefix)
    }

    /// Every script writes: a failure after sending may have run it.
    fn store_error(&self, error: Sent, what: &str, key: &str) -> LockError {
        let message = format!("{what} of lock {key:?} on {}", self.endpoint);
        let (sent, error) = match error {
            Sent::No(error) => (false, error),
            Sent::Yes(error) => (true, error),
        };
        let error = if error.kind() == ErrorKind::InvalidClientConfig {
            Error::Config(format!("{message}: {error}"))
        } else if !sent || ran_nothing(&error) {
            Error::unavailable(message, error)
        } else {
            Error::indeterminate(message, error)
        };
        LockError::Store(error)
    }

    /// Run one of the scripts on the lock `key`: its integer reply, and
    /// `WAIT`'s reply when `replicas=N` was asked.
    async fn run(
        &self,
        script: &Script,
        key: &str,
        args: &[Vec<u8>],
        what: &str,
    ) -> Result<(i64, Option<RedisResult<Value>>), LockError> {
        let (value, wait) = self
            .conn
            .invoke(
                script,
                [self.lock_key(key), self.fence_key(key)],
                args,
                self.ack,
            )
            .await
            .map_err(|e| self.store_error(e, what, key))?;
        let reply = integer(value).map_err(|e| {
            LockError::Store(Error::malformed(
                self.lock_key(key),
                format!("{what} script answered {e}"),
            ))
        })?;
        Ok((reply, wait))
    }

    /// With `replicas=N`: an applied write that `WAIT` did not see on N
    /// replicas is `Indeterminate` (it stays applied on the primary).
    fn acknowledged(
        &self,
        wait: Option<RedisResult<Value>>,
        what: &str,
        key: &str,
    ) -> Result<(), LockError> {
        match (self.ack, wait) {
            (Some(ack), Some(wait)) => ack
                .judge(
                    wait,
                    &format!("{what} of lock {key:?} on {}", self.endpoint),
                )
                .map_err(LockError::Store),
            _ => Ok(()),
        }
    }

    /// Run the renew or release script for `handle`.
    async fn compare_and(
        &self,
        script: &Script,
        handle: &LockHandle,
        what: &str,
    ) -> Result<(), LockError> {
        let args = [
            handle.token().as_bytes().to_vec(),
            ttl_millis(handle.ttl())?.to_string().into_bytes(),
            handle.fence().to_string().into_bytes(),
        ];
        let (reply, wait) = self.run(script, handle.key(), &args, what).await?;
        let reason = match reply {
            1 => return self.acknowledged(wait, what, handle.key()),
            2 => LostReason::TakenOver,
            0 => LostReason::NotHeld,
            -1 => {
                return Err(LockError::Store(Error::malformed(
                    self.fence_key(handle.key()),
                    "fence counter is not a decimal integer",
                )))
            }
            other => {
                return Err(LockError::Store(Error::malformed(
                    self.lock_key(handle.key()),
                    format!("unexpected {what} script reply {other}"),
                )))
            }
        };
        Err(LockError::lost(handle.key(), reason))
    }
}

/// The TTL in whole milliseconds, rounded UP: the server's lease must not be
/// shorter than the one the caller asked for and believes it has.
fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    if ttl > MAX_TTL {
        return Err(LockError::Invalid(InvalidInput::Argument(format!(
            "lock ttl {ttl:?} is longer than the maximum of {MAX_TTL:?}"
        ))));
    }
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    Ok(u64::try_from(ms).expect("bounded by MAX_TTL"))
}

/// The lock operations, on valid input: the [`Lock`] impl below checks it
/// and wraps them in spans and metrics.
impl RedisLock {
    async fn try_lock_inner(
        &self,
        key: &str,
        ttl: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        let ttl_ms = ttl_millis(ttl)?;
        let token = mint_token();
        // Read before sending: the server's lease starts later, so this
        // estimate of the expiry is never later than the real one.
        let expires_at = SystemTime::now() + ttl;
        let sent = tokio::time::Instant::now();
        let args = [token.as_bytes().to_vec(), ttl_ms.to_string().into_bytes()];
        let reply = self.run(&ACQUIRE_SCRIPT, key, &args, "acquire").await;
        let reply = match reply {
            Ok((fence, wait)) if fence > 0 => match self.acknowledged(wait, "acquire", key) {
                Ok(()) => Ok(fence),
                Err(error) => Err(error),
            },
            Ok((reply, _)) => Ok(reply),
            Err(error) => Err(error),
        };
        match reply {
            Ok(0) => Ok(None),
            Ok(fence) if fence > 0 => Ok(Some(
                LockHandle::new(key, token, fence as u64, ttl, expires_at).requested_at(sent),
            )),
            Ok(-1) => Err(LockError::Store(Error::malformed(
                self.fence_key(key),
                "fence counter is not a decimal integer below 2^63 - 1 \
                 (nothing was written)",
            ))),
            Ok(other) => Err(LockError::Store(Error::malformed(
                self.fence_key(key),
                format!("fence counter answered {other}"),
            ))),
            Err(error) => {
                if matches!(error, LockError::Store(Error::Indeterminate { .. })) {
                    // The key may now hold our token although nobody will
                    // use it: give it back rather than block others for a TTL.
                    let orphan = LockHandle::new(key, token, u64::MAX, ttl, expires_at);
                    if let Err(undo) = self.compare_and(&RELEASE_SCRIPT, &orphan, "undo").await {
                        tracing::debug!(%undo, key, "undoing an indeterminate acquire failed");
                    }
                }
                Err(error)
            }
        }
    }

    async fn renew_inner(&self, handle: &LockHandle) -> Result<(), LockError> {
        self.compare_and(&RENEW_SCRIPT, handle, "renew").await
    }

    async fn release_inner(&self, handle: LockHandle) -> Result<(), LockError> {
        self.compare_and(&RELEASE_SCRIPT, &handle, "release").await
    }
}

observed_lock!(RedisLock, "redis");

/// An evicted fence counter restarts at 1 and hands fences out again
/// (docs/locks.md).
const LOCK_EVICTION: EvictionCheck<'static> = EvictionCheck {
    client: "RedisLock",
    at_risk: "an evicted fence counter restarts at 1 and hands fences out again",
    override_option: "RedisLockOptions::allow_eviction",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_rounded_up_to_whole_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_millis(5)).unwrap(), 5);
        assert_eq!(ttl_millis(Duration::from_micros(5_001)).unwrap(), 6);
        assert!(ttl_millis(MAX_TTL + Duration::from_secs(1)).is_err());
    }
}
