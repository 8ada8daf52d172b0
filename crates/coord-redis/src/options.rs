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

impl RedisOptions {
    /// Set [`RedisOptions::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Set [`RedisOptions::response_timeout`].
    pub fn with_response_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Set [`RedisOptions::reconnect_retries`].
    pub fn with_reconnect_retries(mut self, retries: usize) -> Self {
        self.reconnect_retries = retries;
        self
    }

    /// Set [`RedisOptions::read_retries`].
    pub fn with_read_retries(mut self, retries: u32) -> Self {
        self.read_retries = retries;
        self
    }

    /// Set [`RedisOptions::redirect_retries`].
    pub fn with_redirect_retries(mut self, retries: u32) -> Self {
        self.redirect_retries = retries;
        self
    }

    /// Set [`RedisOptions::allow_eviction`].
    pub fn with_allow_eviction(mut self, allow: bool) -> Self {
        self.allow_eviction = allow;
        self
    }

    /// Set [`RedisOptions::limits`].
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
}
