use std::time::Duration;

use coord_backend::Limits;

/// How [`RedisBackend`](crate::RedisBackend) connects, waits and retries.
///
/// ```
/// use std::time::Duration;
/// use coord_redis::RedisOptions;
///
/// let options = RedisOptions::default()
///     .with_connect_timeout(Duration::from_secs(1))
///     .with_response_timeout(Some(Duration::from_secs(2)));
/// assert_eq!(options.connect_timeout, Duration::from_secs(1));
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RedisOptions {
    /// Longest wait for one TCP (+TLS, +AUTH) connection attempt. Default 5 s.
    pub connect_timeout: Duration,
    /// Longest wait for a reply. `None` waits forever. Default 10 s. A txn
    /// that times out is [`Error::Indeterminate`](coord_backend::Error::Indeterminate).
    pub response_timeout: Option<Duration>,
    /// Extra connection attempts (with backoff) each time the standalone
    /// connection has to be re-established. Default 2. A call that still
    /// has no connection sent nothing: it is
    /// [`Error::Unavailable`](coord_backend::Error::Unavailable).
    pub reconnect_retries: usize,
    /// Extra attempts of a failed snapshot or keys call (reads, safe to
    /// repeat; a fresh connection is made in between). Default 2.
    pub read_retries: u32,
    /// Extra attempts of a call the cluster answered with `MOVED`, `ASK`
    /// (sent on to the node they name), `TRYAGAIN` or `CLUSTERDOWN` (waited
    /// out): such an answer means the script did not run. Default 3.
    pub redirect_retries: u32,
    /// Key, value and keys-per-call limits. Default [`Limits::DEFAULT`].
    pub limits: Limits,
    /// Connect to a server (every master of a cluster) whose
    /// `maxmemory-policy` is not `noeviction`. Default `false`: such a
    /// server may evict records under memory pressure, and with them
    /// versions, tombstones and fence counters, so an old version can be
    /// handed out again. Set it only when the namespace can never fill memory
    /// (see docs/shapes.md, Redis).
    pub allow_eviction: bool,
}

impl Default for RedisOptions {
    fn default() -> Self {
        RedisOptions {
            connect_timeout: Duration::from_secs(5),
            response_timeout: Some(Duration::from_secs(10)),
            reconnect_retries: 2,
            read_retries: 2,
            redirect_retries: 3,
            limits: Limits::DEFAULT,
            allow_eviction: false,
        }
    }
}

coord_backend::setters! {
    RedisOptions {
        /// Set [`RedisOptions::connect_timeout`].
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// Set [`RedisOptions::response_timeout`].
        with_response_timeout(timeout: Option<Duration>) => response_timeout = timeout;
        /// Set [`RedisOptions::reconnect_retries`].
        with_reconnect_retries(retries: usize) => reconnect_retries = retries;
        /// Set [`RedisOptions::read_retries`].
        with_read_retries(retries: u32) => read_retries = retries;
        /// Set [`RedisOptions::redirect_retries`].
        with_redirect_retries(retries: u32) => redirect_retries = retries;
        /// Set [`RedisOptions::allow_eviction`].
        with_allow_eviction(allow: bool) => allow_eviction = allow;
        /// Set [`RedisOptions::limits`].
        with_limits(limits: Limits) => limits = limits;
    }
}
