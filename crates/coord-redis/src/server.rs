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
//!
//! Each is judged from the reply alone; none sends anything itself.

use coord_backend::{Error, Result};
use redis::{ErrorKind, RedisError, RedisResult, Value};

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
