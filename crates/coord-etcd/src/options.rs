//! `etcd://` URLs and [`EtcdOptions`].

use std::fmt;
use std::time::Duration;

use coord_backend::{Error, Limits, Result, StoreUrl};

/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const ETCD_DEFAULT_MAX_REQUEST_BYTES: usize = 1_572_864;

/// etcd's default `--max-txn-ops` (operations per list of one txn).
pub const ETCD_DEFAULT_MAX_TXN_OPS: usize = 128;

/// The port used when an endpoint names none.
pub const DEFAULT_PORT: u16 = 2379;

/// Longest namespace prefix an etcd key can carry: `coord/` + 128 namespace
/// bytes, each escaped to at most 3 bytes, + `/`.
const MAX_PREFIX_BYTES: usize = 6 + 3 * 128 + 1;

/// Bytes kept free in every request for the txn message framing and etcd's
/// raft request header.
const REQUEST_SLACK_BYTES: usize = 4096;

/// Per-field protobuf framing of one compare or request op (tags, lengths,
/// enum targets), rounded up.
const OP_FRAMING_BYTES: usize = 24;

/// A user name and password for etcd's authentication. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The etcd user.
    pub user: String,
    /// Its password.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

/// TLS settings (needs the crate feature `tls`; without it, asking for TLS is
/// a [`Error::Config`]). Without a CA, the server certificate is checked
/// against the operating system's trust store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdTls {
    /// PEM file of the CA that signed the server certificates (`?ca=PATH`).
    pub ca_file: Option<String>,
    /// PEM client certificate for mutual TLS (`?cert=PATH`, with `key`).
    pub cert_file: Option<String>,
    /// PEM private key of the client certificate (`?key=PATH`).
    pub key_file: Option<String>,
    /// The name to check the server certificate against, when it differs
    /// from the endpoint's host (`?domain=NAME`).
    pub domain: Option<String>,
}

impl EtcdTls {
    /// Present this client certificate and key (PEM files): mutual TLS.
    pub fn with_client_identity(mut self, cert: impl Into<String>, key: impl Into<String>) -> Self {
        self.cert_file = Some(cert.into());
        self.key_file = Some(key.into());
        self
    }
}

coord_backend::setters! {
    EtcdTls {
        /// Check server certificates against the CA in this PEM file.
        with_ca_file(path: impl Into<String>) => ca_file = Some(path.into());
        /// Check the server certificate against `domain` instead of the endpoint's host.
        with_domain(domain: impl Into<String>) => domain = Some(domain.into());
    }
}

/// How [`crate::EtcdBackend`] talks to etcd.
///
/// ```
/// use coord_etcd::EtcdOptions;
/// use std::time::Duration;
///
/// let options = EtcdOptions::default().with_request_timeout(Duration::from_secs(2));
/// assert_eq!(options.request_timeout, Duration::from_secs(2));
/// // A txn within `limits()` never exceeds etcd's default request size.
/// assert!(options.limits().max_value_bytes * options.limits().max_keys_per_call < 1_572_864);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EtcdOptions {
    /// Longest wait for a TCP (and TLS) connection to one endpoint. Default 2 s.
    pub connect_timeout: Duration,
    /// Longest wait for one request's answer. A txn that runs out of time
    /// after it was sent is [`Error::Indeterminate`]. Default 5 s.
    pub request_timeout: Duration,
    /// HTTP/2 keep-alive `(interval, timeout)`, to notice a silently dead
    /// connection before a request does. Default: off.
    pub keep_alive: Option<(Duration, Duration)>,
    /// The server's `--max-request-bytes` (default 1.5 MiB): [`EtcdOptions::limits`]
    /// derives the value-size limit from it. Raise both together.
    pub max_request_bytes: usize,
    /// The server's `--max-txn-ops` (default 128): one assert costs up to
    /// three compares and a txn one more (the floor marker), so at most a
    /// third of it can be asserted keys.
    pub max_txn_ops: usize,
    /// User and password (etcd authentication), or `None`.
    pub credentials: Option<Credentials>,
    /// TLS, or `None` for plain HTTP/2.
    pub tls: Option<EtcdTls>,
    /// Whether a namespace nobody has written yet starts in floor mode
    /// (the mode its first reclaim would switch it to: a delete is a real
    /// etcd delete, so storage and listings follow the live keys without
    /// any `gc`). Default `true`. With `false` this client leaves new
    /// namespaces in tombstone mode (versions count from 1 and every write
    /// moves them by exactly 1, deletes included, until the first reclaim),
    /// e.g. while coord-etcd clients older than the floor marker still write
    /// the namespace (docs/operations.md, "Bounded storage"). Existing
    /// namespaces keep their mode either way.
    pub new_namespaces_in_floor_mode: bool,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            keep_alive: None,
            max_request_bytes: ETCD_DEFAULT_MAX_REQUEST_BYTES,
            max_txn_ops: ETCD_DEFAULT_MAX_TXN_OPS,
            credentials: None,
            tls: None,
            new_namespaces_in_floor_mode: true,
        }
    }
}

impl EtcdOptions {
    /// With etcd authentication.
    pub fn with_credentials(
        mut self,
        user: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.credentials = Some(Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// With the server's request limits (`--max-request-bytes`, `--max-txn-ops`).
    pub fn with_server_limits(mut self, max_request_bytes: usize, max_txn_ops: usize) -> Self {
        self.max_request_bytes = max_request_bytes;
        self.max_txn_ops = max_txn_ops;
        self
    }

    /// What a store with these options accepts: keys per call such that a
    /// txn's compares (up to three per asserted key, plus the floor
    /// marker's) fit `max_txn_ops`, and a value size such that a txn writing
    /// `max_keys_per_call` values of the largest size, with the longest
    /// keys, still fits `max_request_bytes`.
    ///
    /// With etcd's defaults: 42 keys per call, 29 KiB values (1 KiB keys).
    pub fn limits(&self) -> Limits {
        let base = Limits::DEFAULT;
        let keys = (self.max_txn_ops.saturating_sub(1) / 3).clamp(1, base.max_keys_per_call);
        let max_etcd_key = MAX_PREFIX_BYTES + base.max_key_bytes;
        // Worst case per key: three compares (version, lifetime, tombstone),
        // one put (key + tag + value), one Else get (key).
        let per_key_overhead = 5 * (max_etcd_key + OP_FRAMING_BYTES) + 1;
        let budget = self.max_request_bytes.saturating_sub(REQUEST_SLACK_BYTES) / keys;
        let value = budget.saturating_sub(per_key_overhead) / 1024 * 1024;
        let mut limits = base.with_max_value_bytes(value.min(base.max_value_bytes));
        limits.max_keys_per_call = keys;
        limits
    }
}

coord_backend::setters! {
    EtcdOptions {
        /// With another connect timeout.
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;
        /// With another request timeout.
        with_request_timeout(timeout: Duration) => request_timeout = timeout;
        /// With TLS.
        with_tls(tls: EtcdTls) => tls = Some(tls);
        /// Whether new namespaces start in floor mode (see
        /// [`new_namespaces_in_floor_mode`](Self::new_namespaces_in_floor_mode)).
        with_new_namespaces_in_floor_mode(floor: bool) => new_namespaces_in_floor_mode = floor;
    }
}

/// Where to connect, parsed from a URL.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) endpoints: Vec<String>,
    pub(crate) namespace: String,
    pub(crate) options: EtcdOptions,
}

fn percent_decode(raw: &str, what: &str) -> Result<String> {
    url::form_urlencoded::parse(format!("x={}", raw.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, v)| v.into_owned())
        .ok_or_else(|| Error::Config(format!("could not decode the {what} in an etcd URL")))
}

fn parse_millis(name: &str, value: &str) -> Result<Duration> {
    value
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            Error::Config(format!(
                "etcd URL: {name}={value:?} is not a number of milliseconds"
            ))
        })
}

/// Parse `etcd://[user:password@]host[:port][,host[:port]...][?query]` (or
/// `etcds://` for TLS) on top of `options`.
pub(crate) fn parse_url(url: &StoreUrl, mut options: EtcdOptions) -> Result<Target> {
    let tls_scheme = match url.scheme() {
        "etcd" => false,
        "etcds" => true,
        other => {
            return Err(Error::Config(format!(
                "not an etcd URL: scheme {other:?} (expected etcd:// or etcds://)"
            )))
        }
    };
    let body = url.body().trim_end_matches('/');
    let hosts = match body.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
            options.credentials = Some(Credentials {
                user: percent_decode(user, "user")?,
                password: percent_decode(password, "password")?,
            });
            hosts
        }
        None => body,
    };
    let mut tls = options.tls.take().or(tls_scheme.then(EtcdTls::default));
    let query = url
        .without_namespace()
        .split_once('?')
        .map(|(_, q)| q)
        .unwrap_or("");
    let mut user = None;
    let mut password = None;
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        let value = value.into_owned();
        match name.as_ref() {
            "user" | "username" => user = Some(value),
            "password" => password = Some(value),
            "tls" => match value.as_str() {
                "true" | "1" => {
                    tls.get_or_insert_with(EtcdTls::default);
                }
                "false" | "0" if !tls_scheme => tls = None,
                _ => {
                    return Err(Error::Config(format!(
                        "etcd URL: tls={value:?} (expected true or false; etcds:// always uses TLS)"
                    )))
                }
            },
            "ca" => tls.get_or_insert_with(EtcdTls::default).ca_file = Some(value),
            "cert" => tls.get_or_insert_with(EtcdTls::default).cert_file = Some(value),
            "key" => tls.get_or_insert_with(EtcdTls::default).key_file = Some(value),
            "domain" => tls.get_or_insert_with(EtcdTls::default).domain = Some(value),
            "connect_timeout_ms" => options.connect_timeout = parse_millis(&name, &value)?,
            "request_timeout_ms" => options.request_timeout = parse_millis(&name, &value)?,
            "max_request_bytes" => {
                options.max_request_bytes = value.parse().map_err(|_| {
                    Error::Config(format!("etcd URL: max_request_bytes={value:?} is not a number"))
                })?
            }
            "new_namespaces" => {
                options.new_namespaces_in_floor_mode = match value.as_str() {
                    "floor" => true,
                    "tombstones" => false,
                    _ => {
                        return Err(Error::Config(format!(
                            "etcd URL: new_namespaces={value:?} (expected floor or tombstones)"
                        )))
                    }
                }
            }
            other => {
                return Err(Error::Config(format!(
                    "etcd URL: unknown parameter {other:?} (known: namespace, user, password, tls, \
                     ca, cert, key, domain, connect_timeout_ms, request_timeout_ms, max_request_bytes, \
                     new_namespaces)"
                )))
            }
        }
    }
    match (user, password) {
        (Some(user), password) => {
            options.credentials = Some(Credentials {
                user,
                password: password.unwrap_or_default(),
            })
        }
        (None, Some(_)) => {
            return Err(Error::Config(
                "etcd URL: password given without a user".to_owned(),
            ))
        }
        (None, None) => {}
    }
    options.tls = tls;
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        // A port is present when the text after the last ']' (IPv6) has a ':'.
        let after_bracket = host.rsplit_once(']').map(|(_, rest)| rest).unwrap_or(host);
        let endpoint = if after_bracket.contains(':') {
            format!("{scheme}://{host}")
        } else {
            format!("{scheme}://{host}:{DEFAULT_PORT}")
        };
        endpoints.push(endpoint);
    }
    if endpoints.is_empty() {
        return Err(Error::Config(format!(
            "etcd URL {:?} names no endpoint (expected etcd://host:port[,host:port])",
            coord_backend::redact::url(url.without_namespace())
        )));
    }
    Ok(Target {
        endpoints,
        namespace: url.namespace().to_owned(),
        options,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<Target> {
        parse_url(&StoreUrl::parse(raw)?, EtcdOptions::default())
    }

    #[test]
    fn endpoints_namespace_and_credentials() {
        let t = parse("etcd://u%40x:p%3Aw@127.0.0.1:2379,h2,[::1]:2380/?namespace=a%2Fb").unwrap();
        assert_eq!(
            t.endpoints,
            [
                "http://127.0.0.1:2379",
                "http://h2:2379",
                "http://[::1]:2380"
            ]
        );
        assert_eq!(t.namespace, "a/b");
        let c = t.options.credentials.unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("u@x", "p:w"));
        assert!(t.options.tls.is_none());
        assert!(!format!("{c:?}").contains("p:w"));
    }

    #[test]
    fn query_parameters() {
        let t = parse("etcd://h:1?user=me&password=pw&tls=true&ca=/ca.pem&request_timeout_ms=250")
            .unwrap();
        assert_eq!(t.endpoints, ["https://h:1"]);
        assert_eq!(t.options.credentials.unwrap().user, "me");
        assert_eq!(t.options.tls.unwrap().ca_file.as_deref(), Some("/ca.pem"));
        assert_eq!(t.options.request_timeout, Duration::from_millis(250));
        assert_eq!(parse("etcds://h").unwrap().endpoints, ["https://h:2379"]);
        assert!(parse("etcd://h?bogus=1").is_err());
        assert!(parse("etcd://").is_err());
        assert!(parse("etcds://h?tls=false").is_err());
        assert!(parse("redis://h").is_err());
        assert!(parse("etcd://h?password=x").is_err());
    }

    #[test]
    fn default_limits_fit_etcd_defaults() {
        let limits = EtcdOptions::default().limits();
        assert_eq!(limits.max_keys_per_call, 42);
        assert_eq!(limits.max_value_bytes, 29 * 1024);
        let worst_key = MAX_PREFIX_BYTES + limits.max_key_bytes;
        let worst_request = limits.max_keys_per_call
            * (5 * (worst_key + OP_FRAMING_BYTES) + 1 + limits.max_value_bytes);
        assert!(worst_request + REQUEST_SLACK_BYTES <= ETCD_DEFAULT_MAX_REQUEST_BYTES);
        let big = EtcdOptions::default()
            .with_server_limits(128 << 20, 1024)
            .limits();
        assert_eq!(big.max_keys_per_call, 128);
        assert_eq!(big.max_value_bytes, 512 * 1024);
    }
}
