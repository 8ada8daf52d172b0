//! Two judgments about a Redis server that everything in coord talking to
//! Redis must make the same way: this store, and the native `RedisLock` of
//! `coord-locks-native`, which keeps its own keys on its own connection.
//!
//! - [`ran_nothing`]: after which errors a command certainly did not run.
//!   A write that failed otherwise may have been applied, so its caller
//!   must answer `Indeterminate`, never `Unavailable` (which promises that
//!   nothing was written).
//! - [`check_eviction`]: whether a server's `maxmemory-policy` keeps every
//!   key. A server that evicts may drop a record together with its version
//!   counter or a fence counter, and a counter that restarts hands a version
//!   or a fence out twice (docs/shapes.md, Redis).
//!
//! - [`connect_error`]: which error a failed connection is.
//! - [`is_read_only`]: a write that reached a replica (a demoted primary).
//!
//! Each is judged from the reply alone; none sends anything itself.
//!
//! Two pieces of URL handling are shared the same way: [`SentinelTarget`]
//! (a `redis+sentinel://` URL: which server is the primary now) and
//! [`ReplicaAck`] (`?replicas=N&replica_timeout_ms=T`: `WAIT` after each
//! applied write).

use std::time::Duration;

use coord_backend::{Error, Result, StoreUrl};
use redis::sentinel::{Sentinel, SentinelNodeConnectionInfo};
use redis::{ErrorKind, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind, Value};

/// Whether `error` proves that the command it answers did not run: the
/// connection was never made, or the server answered with an error. (Every
/// coord script checks everything before its first write, and Redis refuses
/// a script at its first write under OOM, so an error reply means nothing
/// was applied.) Any other failure after sending may have run it.
pub fn ran_nothing(error: &RedisError) -> bool {
    error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::Server(_)
                | ErrorKind::Extension
                | ErrorKind::AuthenticationFailed
                | ErrorKind::InvalidClientConfig
                | ErrorKind::Client
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::RESP3NotSupported
        )
}

/// The error of a failed connection (or client set-up) for `endpoint`:
/// [`Error::Config`] when the URL or the client's settings are wrong, which
/// no retry mends; [`Error::Unavailable`] otherwise (nothing was sent).
pub fn connect_error(endpoint: &str, error: RedisError) -> Error {
    if error.kind() == ErrorKind::InvalidClientConfig {
        return Error::Config(format!("redis URL {endpoint}: {error}"));
    }
    Error::unavailable(format!("cannot connect to {endpoint}"), error)
}

/// `CONFIG GET maxmemory-policy`, whose reply [`check_eviction`] judges.
pub fn eviction_policy_cmd() -> redis::Cmd {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    cmd
}

/// Who asks [`check_eviction`], for its messages.
#[derive(Clone, Copy, Debug)]
pub struct EvictionCheck<'a> {
    /// Who needs `noeviction` (`"coord"`, `"RedisLock"`).
    pub client: &'a str,
    /// What an eviction would drop, and what that breaks.
    pub at_risk: &'a str,
    /// The option that accepts an evicting server anyway.
    pub override_option: &'a str,
}

/// Judge `reply`, the answer of `node` to [`eviction_policy_cmd`]:
/// `noeviction` passes; another policy is `Config` (the server may drop
/// what `check.at_risk` names); a server that does not let us read its
/// configuration (`CONFIG` renamed or denied by an ACL), or an answer
/// without the policy, passes with a warning; an I/O failure is
/// `Unavailable`.
pub fn check_eviction(
    node: &str,
    reply: RedisResult<Value>,
    check: EvictionCheck<'_>,
) -> Result<()> {
    let EvictionCheck {
        client,
        at_risk,
        override_option,
    } = check;
    let value = match reply {
        Ok(value) => value,
        Err(error) if matches!(error.kind(), ErrorKind::Server(_) | ErrorKind::Extension) => {
            tracing::warn!(
                node,
                %error,
                "cannot read maxmemory-policy; {client} needs noeviction ({at_risk})"
            );
            return Ok(());
        }
        Err(error) => {
            return Err(Error::unavailable(
                format!("cannot read maxmemory-policy of {node}"),
                error,
            ))
        }
    };
    let policy = match value {
        Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
        Value::Map(mut pairs) if pairs.len() == 1 => pairs.pop().map(|(_, v)| v),
        _ => None,
    }
    .and_then(|v| redis::from_redis_value::<String>(v).ok());
    match policy.as_deref() {
        Some("noeviction") => Ok(()),
        Some(policy) => Err(Error::Config(format!(
            "{node} runs with maxmemory-policy {policy}: Redis may evict keys under memory \
             pressure ({at_risk}). Set maxmemory-policy noeviction, or {override_option}"
        ))),
        None => {
            tracing::warn!(
                node,
                "maxmemory-policy not reported; {client} needs noeviction"
            );
            Ok(())
        }
    }
}

/// Whether `error` is a `-READONLY` reply: the command reached a replica
/// (on a Sentinel topology, a primary demoted by a failover) and ran
/// nothing. The caller must find the primary again before writing.
pub fn is_read_only(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}

/// A `redis+sentinel://[user:password@]host:port,host:port/MASTER[?params]`
/// URL: the Sentinels to ask, the name of the master they monitor, and how
/// to connect to it. [`SentinelTarget::primary`] asks them which server is
/// the primary now (and checks with `ROLE` that it says so itself).
///
/// - The user and password, and the parameters `protocol` (`resp2`,
///   `resp3`) and `db`, are those of the data nodes (the primary);
///   the Sentinels are asked without authentication.
/// - `replicas` and `replica_timeout_ms` are [`ReplicaAck`]'s; any other
///   parameter is refused ([`Error::Config`]), as is a URL without
///   Sentinels or without a master name.
pub struct SentinelTarget {
    sentinel: tokio::sync::Mutex<Sentinel>,
    master: String,
    node: SentinelNodeConnectionInfo,
    /// `Sentinels h:p,h:p (master NAME)`, for messages: no password.
    tried: String,
    timeout: Duration,
    resp3: bool,
}

impl std::fmt::Debug for SentinelTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.tried)
    }
}

impl SentinelTarget {
    /// Read `url` (scheme `redis+sentinel`). `timeout` bounds one whole
    /// discovery (every Sentinel asked, the named master's `ROLE` read).
    pub fn parse(url: &StoreUrl, timeout: Duration) -> Result<SentinelTarget> {
        let shown = coord_backend::redact::url(url.without_namespace());
        if url.scheme() != "redis+sentinel" {
            return Err(Error::Config(format!(
                "{shown}: not a redis+sentinel:// URL"
            )));
        }
        let (rest_url, _) = ReplicaAck::take(url.without_namespace())?;
        let body = url.body();
        let (userinfo, rest) = match body.rsplit_once('@') {
            Some((userinfo, rest)) => (Some(userinfo), rest),
            None => (None, body),
        };
        let Some((hosts, master)) = rest.split_once('/') else {
            return Err(Error::Config(format!(
                "{shown} names no master (expected redis+sentinel://host:port,host:port/MASTER_NAME)"
            )));
        };
        let master = master.trim_end_matches('/');
        if master.is_empty() || master.contains('/') {
            return Err(Error::Config(format!(
                "{shown} names no master (expected redis+sentinel://host:port,host:port/MASTER_NAME)"
            )));
        }
        let sentinels: Vec<&str> = hosts
            .split(',')
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .collect();
        if sentinels.is_empty() {
            return Err(Error::Config(format!(
                "{shown} names no Sentinel (expected redis+sentinel://host:port,host:port/MASTER_NAME)"
            )));
        }
        let mut node_query = Vec::new();
        let mut resp3 = false;
        let mut db = None;
        for pair in rest_url
            .split_once('?')
            .map(|(_, q)| q)
            .unwrap_or("")
            .split('&')
        {
            if pair.is_empty() {
                continue;
            }
            match pair.split_once('=').unwrap_or((pair, "")) {
                ("protocol", value) => {
                    resp3 = match value {
                        "resp3" | "3" => true,
                        "resp2" | "2" => false,
                        other => {
                            return Err(Error::Config(format!(
                                "{shown}: protocol={other} (expected resp2 or resp3)"
                            )))
                        }
                    };
                    node_query.push(pair);
                }
                ("db", value) => {
                    db = Some(value.parse::<i64>().map_err(|_| {
                        Error::Config(format!("{shown}: db={value} is not a number"))
                    })?);
                }
                (name, _) => {
                    return Err(Error::Config(format!(
                        "{shown}: unknown parameter {name:?} (a redis+sentinel URL takes \
                         namespace, protocol, db, replicas and replica_timeout_ms)"
                    )))
                }
            }
        }
        // The data nodes' settings, read the way the client reads a plain URL
        // (percent-decoded user and password).
        let node_url = format!(
            "redis://{}127.0.0.1:6379/{}{}{}",
            userinfo.map(|u| format!("{u}@")).unwrap_or_default(),
            db.unwrap_or(0),
            if node_query.is_empty() { "" } else { "?" },
            node_query.join("&")
        );
        let settings = node_url
            .as_str()
            .into_connection_info()
            .map_err(|e| Error::Config(format!("{shown}: {e}")))?
            .redis_settings()
            .clone();
        let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(settings);
        let sentinel_urls: Vec<String> = sentinels.iter().map(|h| format!("redis://{h}")).collect();
        let sentinel =
            Sentinel::build(sentinel_urls).map_err(|e| Error::Config(format!("{shown}: {e}")))?;
        Ok(SentinelTarget {
            sentinel: tokio::sync::Mutex::new(sentinel),
            master: master.to_owned(),
            node,
            tried: format!("Sentinels {} (master {master})", sentinels.join(",")),
            timeout,
            resp3,
        })
    }

    /// `Sentinels h:p,h:p (master NAME)`.
    pub fn describe(&self) -> &str {
        &self.tried
    }

    /// Whether the data nodes speak RESP3 (`?protocol=resp3`).
    pub fn resp3(&self) -> bool {
        self.resp3
    }

    /// A client for the server the Sentinels name as the primary now, after
    /// it answered `ROLE` as a master. Every Sentinel is asked in turn; a
    /// Sentinel that does not know the name, or whose master is down or not
    /// a master, is passed over. The error (kind
    /// [`ErrorKind::MasterNameNotFoundBySentinel`] when no Sentinel named a
    /// usable master, an I/O kind when none answered) names the Sentinels and
    /// the master, never a password. Nothing was sent to a data node.
    pub async fn primary(&self) -> RedisResult<redis::Client> {
        let mut sentinel = self.sentinel.lock().await;
        let found = tokio::time::timeout(
            self.timeout,
            sentinel.async_master_for(&self.master, Some(&self.node)),
        )
        .await;
        let error = match found {
            Ok(Ok(client)) => return Ok(client),
            Ok(Err(error)) => error,
            Err(_) => {
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("{}: no answer within {:?}", self.tried, self.timeout),
                )))
            }
        };
        let kind = if error.kind() == ErrorKind::MasterNameNotFoundBySentinel {
            "no Sentinel named a reachable master"
        } else {
            "no Sentinel answered"
        };
        Err(RedisError::from((
            ErrorKind::MasterNameNotFoundBySentinel,
            "primary not found",
            format!("{}: {kind} ({error})", self.tried),
        )))
    }
}

/// `ROLE` on a freshly made connection: it must be a master. A replica
/// (the Sentinels' view was stale) is refused with a `READONLY`-kind error,
/// so that the caller asks the Sentinels again.
pub async fn check_primary(conn: &mut impl redis::aio::ConnectionLike) -> RedisResult<()> {
    let role: redis::Role = redis::cmd("ROLE").query_async(conn).await?;
    match role {
        redis::Role::Primary { .. } => Ok(()),
        _ => Err(RedisError::from((
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "not a primary",
            "the server the Sentinels named answers ROLE as a replica".to_owned(),
        ))),
    }
}

/// `?replicas=N&replica_timeout_ms=T`: after each applied write, `WAIT N T`
/// on the same connection, pipelined behind the write (no extra round trip;
/// the reply comes once N replicas acknowledged, or after T ms).
///
/// What it promises: a write reported as done was, at that moment, held by
/// the primary and at least N replicas. What it does not: `WAIT` is not
/// consensus. A failover may still promote a replica that did not get the
/// write (Sentinel prefers the most up-to-date one, but nothing forces it),
/// and a write that fell short of N is **not rolled back**: it stays on the
/// primary, readable, and the caller is told
/// [`Error::Indeterminate`] (it may be
/// lost by a failover, or may survive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaAck {
    /// How many replicas must acknowledge (`replicas=N`, at least 1).
    pub replicas: u32,
    /// How long `WAIT` waits for them (`replica_timeout_ms`, default 1000, at least 1).
    pub timeout_ms: u64,
}

impl ReplicaAck {
    /// Default `replica_timeout_ms`.
    pub const DEFAULT_TIMEOUT_MS: u64 = 1000;

    /// Take `replicas` and `replica_timeout_ms` out of `url` (a URL without
    /// its namespace): the URL without them, and what they ask (`None`
    /// without `replicas`, or with `replicas=0`). A value that is not a
    /// number, `replica_timeout_ms=0` (`WAIT` would block forever) or a
    /// timeout without `replicas` is [`Error::Config`].
    pub fn take(url: &str) -> Result<(String, Option<ReplicaAck>)> {
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), None));
        };
        let shown = || coord_backend::redact::url(url);
        let mut kept = Vec::new();
        let mut replicas = None;
        let mut timeout = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("replicas", v)) => {
                    replicas = Some(v.parse::<u32>().map_err(|_| {
                        Error::Config(format!("{}: replicas={v} is not a count", shown()))
                    })?);
                }
                Some(("replica_timeout_ms", v)) => {
                    timeout = Some(v.parse::<u64>().ok().filter(|t| *t > 0).ok_or_else(|| {
                        Error::Config(format!(
                            "{}: replica_timeout_ms={v} is not a number of milliseconds above 0",
                            shown()
                        ))
                    })?);
                }
                _ => kept.push(pair),
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        let ack = match (replicas, timeout) {
            (None, Some(_)) => {
                return Err(Error::Config(format!(
                    "{}: replica_timeout_ms without replicas",
                    shown()
                )))
            }
            (None | Some(0), _) => None,
            (Some(replicas), timeout) => Some(ReplicaAck {
                replicas,
                timeout_ms: timeout.unwrap_or(Self::DEFAULT_TIMEOUT_MS),
            }),
        };
        Ok((rest, ack))
    }

    /// `WAIT N T`.
    pub fn command(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(self.timeout_ms);
        cmd
    }

    /// Judge the reply of [`ReplicaAck::command`] sent behind a rejected
    /// write (and a barrier write, so that it covers everything the write's
    /// asserts were checked against): `None` when at least N replicas
    /// acknowledged, otherwise why the entries the rejection returns are not
    /// confirmed ([`coord_backend::TxnOutcome::unconfirmed`]). The write
    /// did not apply, and never will; but the state that rejected it may be
    /// a write no replica holds yet, possibly the caller's own earlier write
    /// whose answer was lost, so "my first attempt applied" cannot be
    /// concluded from it.
    pub fn judge_rejection(&self, reply: RedisResult<Value>, what: &str) -> Option<String> {
        let acked = match reply {
            Ok(Value::Int(n)) if n >= i64::from(self.replicas) => return None,
            other => Self::acked_count(other),
        };
        Some(format!(
            "{what}: rejected, but the state it was checked against was acknowledged by \
             {acked} of the {} replicas asked for within {} ms (replicas=N); a failover may \
             lose that state",
            self.replicas, self.timeout_ms
        ))
    }

    /// How many replicas a `WAIT` reply counted, for a message.
    fn acked_count(reply: RedisResult<Value>) -> String {
        match reply {
            Ok(Value::Int(n)) => format!("{n}"),
            Ok(other) => format!("an unexpected WAIT reply ({other:?})"),
            Err(error) => format!("no WAIT reply ({error})"),
        }
    }

    /// Judge the reply of [`ReplicaAck::command`] to an applied write:
    /// `Ok` when at least N replicas acknowledged, otherwise the
    /// [`Error::Indeterminate`] the caller must get (the write stays applied
    /// on the primary, but a failover may lose it). `what` names the write.
    pub fn judge(&self, reply: RedisResult<Value>, what: &str) -> Result<()> {
        let acked = match reply {
            Ok(Value::Int(n)) if n >= i64::from(self.replicas) => return Ok(()),
            other => Self::acked_count(other),
        };
        Err(Error::indeterminate(
            format!(
                "{what}: applied on the primary, but {acked} of the {} replicas asked for \
                 acknowledged it within {} ms (replicas=N); it is not rolled back, and a \
                 failover may lose it",
                self.replicas, self.timeout_ms
            ),
            std::io::Error::new(std::io::ErrorKind::TimedOut, "replication not acknowledged"),
        ))
    }
}

/// What a fence or a lock can lose on this deployment, as a sentence for
/// an operator, or `None`: the primary `url` names (standalone or through
/// its Sentinels) has replicas, and `url` does not ask writes to wait for
/// them (`replicas=N`), so a failover can lose acknowledged writes and hand
/// a version or a fence out twice (docs/shapes.md, "Redis"). Best effort:
/// Cluster URLs and servers that cannot be asked give `None`.
pub async fn unacknowledged_replicas_advice(url: &StoreUrl) -> Option<String> {
    let (base, ack) = ReplicaAck::take(url.without_namespace()).ok()?;
    if ack.is_some() {
        return None;
    }
    let timeout = Duration::from_secs(3);
    let client = match url.scheme() {
        "redis" | "rediss" => redis::Client::open(base.as_str()).ok()?,
        "redis+sentinel" => SentinelTarget::parse(url, timeout)
            .ok()?
            .primary()
            .await
            .ok()?,
        _ => return None,
    };
    let info: String = tokio::time::timeout(timeout, async {
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("INFO")
            .arg("replication")
            .query_async::<String>(&mut conn)
            .await
    })
    .await
    .ok()?
    .ok()?;
    let replicas: u64 = info
        .lines()
        .find_map(|line| line.trim().strip_prefix("connected_slaves:"))
        .and_then(|n| n.parse().ok())?;
    (replicas > 0).then(|| {
        format!(
            "this Redis primary has {replicas} replica(s) and the URL does not ask writes to wait \
             for them: a failover can lose acknowledged writes and grant a lock or a fence twice; \
             add ?replicas={replicas} (WAIT for every replica after each write; short = \
             Indeterminate; fewer lets the Sentinels promote a replica that lacks the write), or \
             use etcd or PostgreSQL with a synchronous standby for locks that must never \
             double-grant"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHECK: EvictionCheck<'static> = EvictionCheck {
        client: "test",
        at_risk: "a counter restarts",
        override_option: "the override",
    };

    fn pair(policy: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(policy.as_bytes().to_vec()),
        ])
    }

    #[test]
    fn only_noeviction_passes() {
        assert!(check_eviction("n", Ok(pair("noeviction")), CHECK).is_ok());
        let refused = check_eviction("n", Ok(pair("allkeys-lru")), CHECK).unwrap_err();
        assert!(
            matches!(&refused, Error::Config(m) if m.contains("allkeys-lru") && m.contains("the override"))
        );
        // RESP3 answers with a map.
        let map = Value::Map(vec![(
            Value::BulkString(b"maxmemory-policy".to_vec()),
            Value::BulkString(b"volatile-lru".to_vec()),
        )]);
        assert!(check_eviction("n", Ok(map), CHECK).is_err());
    }

    #[test]
    fn a_denied_config_read_passes_and_an_io_failure_is_unavailable() {
        let denied = RedisError::from((ErrorKind::Extension, "NOPERM", "denied".to_owned()));
        assert!(check_eviction("n", Err(denied), CHECK).is_ok());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(matches!(
            check_eviction("n", Err(io), CHECK),
            Err(Error::Unavailable { .. })
        ));
    }

    #[test]
    fn only_refusals_and_error_replies_ran_nothing() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(ran_nothing(&refused));
        let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!ran_nothing(&reset));
    }
}
