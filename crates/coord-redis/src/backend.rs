use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{
    validate_keys, validate_namespace, validate_prefix, validate_txn, Assert, Backend, Entry,
    Error, Limits, Mutation, Result, StoreUrl, TxnOutcome, Version,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, RedisError, Script, ScriptInvocation, Value};

use crate::{scripts, RedisOptions};

static SNAPSHOT: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::SNAPSHOT));
static TXN: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::TXN));
static KEYS: LazyLock<Script> = LazyLock::new(|| Script::new(scripts::KEYS));

/// Both connection kinds are cheap handles on one shared connection (cloned per call).
#[derive(Clone)]
enum Conn {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> redis::RedisResult<Value> {
        match self {
            Conn::Standalone(c) => invocation.invoke_async(&mut c.clone()).await,
            Conn::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
        }
    }
}

/// A coord store on Redis (standalone or Redis Cluster). See the crate docs
/// for the shape, the atomicity boundary and the error mapping.
///
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct RedisBackend {
    namespace: String,
    /// `coord:{NS}:k:`; a record key is this followed by the key's bytes.
    record_prefix: Vec<u8>,
    /// `coord:{NS}:idx`
    index_key: Vec<u8>,
    conn: Conn,
    /// The URL without its password, for `Debug`.
    endpoint: String,
    options: RedisOptions,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .field("namespace", &self.namespace)
            .field(
                "mode",
                &match self.conn {
                    Conn::Standalone(_) => "standalone",
                    Conn::Cluster(_) => "cluster",
                },
            )
            .finish()
    }
}

/// What a failed call had done when it failed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// A snapshot or keys call: nothing is written, so every failure is "unavailable".
    Read,
    /// A txn: a failure after sending may have committed.
    Txn,
}

impl RedisBackend {
    /// Connect with [`RedisOptions::default`]. Schemes: `redis`, `rediss`,
    /// `redis+cluster`, `rediss+cluster` (see the crate docs).
    ///
    /// Fails with [`Error::Config`] for a URL the client cannot use and with
    /// [`Error::Unavailable`] when the server (or no seed node) answers.
    pub async fn connect(url: &StoreUrl) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &StoreUrl, options: RedisOptions) -> Result<Self> {
        let namespace = url.namespace().to_owned();
        // StoreUrl already checked it; this store relies on "no braces" for its hash tag.
        validate_namespace(&namespace)?;
        let endpoint = redact(url.without_namespace());
        let (cluster, tls) = match url.scheme() {
            "redis" => (false, false),
            "rediss" => (false, true),
            "redis+cluster" => (true, false),
            "rediss+cluster" => (true, true),
            other => {
                return Err(Error::Config(format!(
                    "coord-redis cannot open a {other}:// URL (expected redis, rediss, \
                     redis+cluster or rediss+cluster)"
                )))
            }
        };
        if tls && !cfg!(feature = "tls") {
            return Err(Error::Config(
                "rediss:// needs coord-redis built with its `tls` feature".to_owned(),
            ));
        }
        let conn = if cluster {
            let nodes = cluster_nodes(url, tls)?;
            let client = ClusterClientBuilder::new(nodes)
                // The client's own retries would resend a txn whose connection
                // dropped after sending: a second run would see its own write
                // and answer applied=false. Redirects are followed in `txn`.
                .retries(0)
                .connection_timeout(options.connect_timeout);
            let client = match options.response_timeout {
                Some(timeout) => client.response_timeout(timeout),
                None => client,
            };
            let client = client.build().map_err(|e| config_error(&endpoint, e))?;
            let connection = client
                .get_async_connection()
                .await
                .map_err(|e| connect_error(&endpoint, e))?;
            Conn::Cluster(connection)
        } else {
            let client = redis::Client::open(url.without_namespace())
                .map_err(|e| config_error(&endpoint, e))?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(options.connect_timeout))
                .set_response_timeout(options.response_timeout)
                .set_number_of_retries(options.reconnect_retries)
                .set_min_delay(Duration::from_millis(20))
                .set_max_delay(Duration::from_millis(500));
            let manager = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(|e| connect_error(&endpoint, e))?;
            Conn::Standalone(manager)
        };
        Ok(RedisBackend {
            record_prefix: format!("coord:{{{namespace}}}:k:").into_bytes(),
            index_key: format!("coord:{{{namespace}}}:idx").into_bytes(),
            namespace,
            conn,
            endpoint,
            options,
        })
    }

    fn record_key(&self, key: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.record_prefix.len() + key.len());
        out.extend_from_slice(&self.record_prefix);
        out.extend_from_slice(key.as_bytes());
        out
    }

    /// The coord key of a record key named in a script reply (for error messages).
    fn relative(&self, record_key: &[u8]) -> String {
        let raw = record_key
            .strip_prefix(self.record_prefix.as_slice())
            .unwrap_or(record_key);
        String::from_utf8_lossy(raw).into_owned()
    }

    /// Run a read-only script; reads are repeated on failure (a fresh
    /// connection is made meanwhile), then reported as unavailable.
    async fn read(&self, invocation: &ScriptInvocation<'_>, what: &str) -> Result<Value> {
        let mut attempt = 0;
        loop {
            match self.conn.invoke(invocation).await {
                Ok(value) => return Ok(value),
                Err(error) if attempt < self.options.read_retries && !is_permanent(&error) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt))).await;
                }
                Err(error) => return Err(self.map_error(error, Op::Read, what)),
            }
        }
    }

    fn map_error(&self, error: RedisError, op: Op, what: &str) -> Error {
        let message = format!("{what} on {} (namespace {})", self.endpoint, self.namespace);
        if matches!(error.kind(), ErrorKind::InvalidClientConfig) {
            return Error::Config(format!("{message}: {error}"));
        }
        if op == Op::Read || ran_nothing(&error) {
            Error::unavailable(message, error)
        } else {
            Error::indeterminate(message, error)
        }
    }

    /// Decode a `malformed` reply, or report an unexpected one.
    fn malformed_reply(&self, mut reply: Vec<Value>, fallback_key: &str) -> Error {
        if reply.len() == 3 && tag(&reply[0]) == Some(b"malformed") {
            let reason = text(reply.pop().unwrap_or(Value::Nil));
            let key = match reply.pop() {
                Some(Value::BulkString(k)) => self.relative(&k),
                _ => fallback_key.to_owned(),
            };
            return Error::malformed(key, reason);
        }
        Error::malformed(
            fallback_key,
            format!("unexpected reply from the coord script: {reply:?}"),
        )
    }

    /// Decode `version, value` pairs (after the tag) into entries of `keys`.
    fn entries(&self, pairs: Vec<Value>, keys: &[&str]) -> Result<Vec<Entry>> {
        if pairs.len() != keys.len() * 2 {
            return Err(Error::malformed(
                keys.first().copied().unwrap_or(""),
                format!(
                    "script returned {} fields for {} keys",
                    pairs.len(),
                    keys.len()
                ),
            ));
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut pairs = pairs.into_iter();
        for key in keys {
            let (Some(version), Some(value)) = (pairs.next(), pairs.next()) else {
                unreachable!("length checked above");
            };
            let version = match bytes(version) {
                Some(raw) => std::str::from_utf8(&raw)
                    .ok()
                    .and_then(|s| s.parse::<u64>().ok())
                    .ok_or_else(|| Error::malformed(*key, "version is not a decimal integer"))?,
                None => return Err(Error::malformed(*key, "version missing in script reply")),
            };
            let entry = match (version, value) {
                (0, Value::Nil | Value::Boolean(false)) => Entry::missing(*key),
                (0, _) => return Err(Error::malformed(*key, "value without a version")),
                (version, value) => match bytes(value) {
                    Some(value) => Entry::present(*key, Version(version), value),
                    None => return Err(Error::malformed(*key, "version without a value")),
                },
            };
            out.push(entry);
        }
        Ok(out)
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        self.options.limits
    }

    async fn snapshot(&self, keys: &[String]) -> Result<Vec<Entry>> {
        validate_keys(keys, &self.options.limits)?;
        let distinct = coord_backend::distinct_keys(keys.iter().map(String::as_str));
        if distinct.is_empty() {
            return Ok(Vec::new());
        }
        let mut invocation = SNAPSHOT.prepare_invoke();
        for key in &distinct {
            invocation.key(self.record_key(key));
        }
        let reply = self.read(&invocation, "snapshot").await?;
        let mut reply = array(reply).map_err(|e| self.malformed_reply(e, distinct[0]))?;
        if reply.first().and_then(tag) != Some(b"ok") {
            return Err(self.malformed_reply(reply, distinct[0]));
        }
        reply.remove(0);
        self.entries(reply, &distinct)
    }

    async fn txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        validate_txn(asserts, mutations, &self.options.limits)?;
        if asserts.is_empty() && mutations.is_empty() {
            return Ok(TxnOutcome::applied());
        }
        // KEYS[1] is the index; then one record key per distinct key, asserted keys first.
        let mut position: HashMap<&str, usize> = HashMap::new();
        let mut asserted: Vec<(&str, Version)> = Vec::new();
        let mut invocation = TXN.prepare_invoke();
        invocation.key(self.index_key.as_slice());
        for assert in asserts {
            if !position.contains_key(assert.key.as_str()) {
                position.insert(&assert.key, position.len() + 2);
                asserted.push((&assert.key, assert.version));
                invocation.key(self.record_key(&assert.key));
            }
        }
        for mutation in mutations {
            if !position.contains_key(mutation.key()) {
                position.insert(mutation.key(), position.len() + 2);
                invocation.key(self.record_key(mutation.key()));
            }
        }
        invocation.arg(self.record_prefix.len());
        invocation.arg(asserted.len());
        for (_, version) in &asserted {
            invocation.arg(version.0);
        }
        invocation.arg(mutations.len());
        for mutation in mutations {
            invocation.arg(position[mutation.key()]);
            match mutation {
                Mutation::Put { value, .. } => invocation.arg("p").arg(value.as_slice()),
                Mutation::Delete { .. } => invocation.arg("d").arg(""),
            };
        }
        let first_key = asserts
            .first()
            .map(|a| a.key.as_str())
            .or_else(|| mutations.first().map(Mutation::key))
            .unwrap_or("");

        let mut redirects = 0;
        let reply = loop {
            match self.conn.invoke(&invocation).await {
                Ok(reply) => break reply,
                // MOVED / ASK / TRYAGAIN / CLUSTERDOWN: the script did not run
                // anywhere; the cluster connection refreshes its slot map meanwhile.
                Err(error)
                    if (error.is_cluster_error()
                        || error.kind() == ErrorKind::ClusterConnectionNotFound)
                        && redirects < self.options.redirect_retries =>
                {
                    redirects += 1;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(redirects))).await;
                }
                Err(error) => return Err(self.map_error(error, Op::Txn, "txn")),
            }
        };
        let mut reply = array(reply).map_err(|e| self.malformed_reply(e, first_key))?;
        match reply.first().and_then(tag) {
            Some(b"applied") if reply.len() == 1 => Ok(TxnOutcome::applied()),
            Some(b"rejected") => {
                reply.remove(0);
                let keys: Vec<&str> = asserted.iter().map(|(k, _)| *k).collect();
                Ok(TxnOutcome::rejected(self.entries(reply, &keys)?))
            }
            _ => Err(self.malformed_reply(reply, first_key)),
        }
    }

    async fn keys(&self, prefix: &str) -> Result<Vec<String>> {
        validate_prefix(prefix, &self.options.limits)?;
        let (min, max) = lex_range(prefix.as_bytes());
        let mut invocation = KEYS.prepare_invoke();
        invocation.key(self.index_key.as_slice()).arg(min).arg(max);
        let reply = self.read(&invocation, "keys").await?;
        let index = String::from_utf8_lossy(&self.index_key).into_owned();
        let reply = array(reply).map_err(|e| self.malformed_reply(e, &index))?;
        if reply.first().and_then(tag) != Some(b"ok") {
            return Err(self.malformed_reply(reply, &index));
        }
        reply
            .into_iter()
            .skip(1)
            .map(|member| {
                bytes(member)
                    .and_then(|raw| String::from_utf8(raw).ok())
                    .ok_or_else(|| Error::malformed(&index, "index member is not a UTF-8 string"))
            })
            .collect()
    }
}

/// `ZRANGEBYLEX` bounds of every member starting with `prefix`: `[prefix` up to
/// `(prefix 0xFF`. Keys are UTF-8, which never contains 0xFF, so nothing that
/// starts with `prefix` reaches the upper bound and nothing else fits below it.
fn lex_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (b"-".to_vec(), b"+".to_vec());
    }
    let mut min = Vec::with_capacity(prefix.len() + 1);
    min.push(b'[');
    min.extend_from_slice(prefix);
    let mut max = Vec::with_capacity(prefix.len() + 2);
    max.push(b'(');
    max.extend_from_slice(prefix);
    max.push(0xFF);
    (min, max)
}

/// Errors after which the command certainly did not run: the connection
/// was never made, or the server answered with an error. (The scripts check
/// everything before their first write, and Redis refuses a script at its
/// first write under OOM, so an error reply means nothing was applied.)
fn ran_nothing(error: &RedisError) -> bool {
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

/// Errors that repeating the same call cannot fix.
fn is_permanent(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed
    )
}

fn config_error(endpoint: &str, error: RedisError) -> Error {
    Error::Config(format!("redis URL {endpoint}: {error}"))
}

fn connect_error(endpoint: &str, error: RedisError) -> Error {
    if error.kind() == ErrorKind::InvalidClientConfig {
        return config_error(endpoint, error);
    }
    Error::unavailable(format!("cannot connect to {endpoint}"), error)
}

/// The seed nodes of a `redis[s]+cluster://[user:pass@]h:p,h:p[?query]` URL,
/// each as a `redis[s]://[user:pass@]h:p[?query]` URL.
fn cluster_nodes(url: &StoreUrl, tls: bool) -> Result<Vec<String>> {
    let scheme = if tls { "rediss" } else { "redis" };
    let query = url
        .without_namespace()
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    let body = url.body().trim_end_matches('/');
    let (userinfo, hosts) = match body.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), body),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|host| format!("{scheme}://{userinfo}{host}{query}"))
        .collect();
    if nodes.is_empty() {
        return Err(Error::Config(format!(
            "cluster URL {} names no node (expected redis+cluster://host:port,host:port)",
            redact(url.without_namespace())
        )));
    }
    Ok(nodes)
}

/// The URL with its password replaced by `***`.
fn redact(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return raw.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = userinfo.split_once(':').map(|(u, _)| u).unwrap_or(userinfo);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{hosts}{tail}")
        }
        None => raw.to_owned(),
    }
}

fn array(value: Value) -> std::result::Result<Vec<Value>, Vec<Value>> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(vec![other]),
    }
}

fn bytes(value: Value) -> Option<Vec<u8>> {
    match value {
        Value::BulkString(raw) => Some(raw),
        Value::SimpleString(s) => Some(s.into_bytes()),
        Value::Int(i) => Some(i.to_string().into_bytes()),
        _ => None,
    }
}

fn tag(value: &Value) -> Option<&[u8]> {
    match value {
        Value::BulkString(raw) => Some(raw),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(value: Value) -> String {
    bytes(value)
        .map(|raw| String::from_utf8_lossy(&raw).into_owned())
        .unwrap_or_else(|| "no reason given".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lex_range_is_literal() {
        assert_eq!(lex_range(b""), (b"-".to_vec(), b"+".to_vec()));
        assert_eq!(
            lex_range(b"a*["),
            (b"[a*[".to_vec(), vec![b'(', b'a', b'*', b'[', 0xFF])
        );
    }

    #[test]
    fn cluster_urls() {
        let url = StoreUrl::parse("redis+cluster://u:p@127.0.0.1:7001,127.0.0.1:7002?namespace=x")
            .unwrap();
        assert_eq!(
            cluster_nodes(&url, false).unwrap(),
            vec!["redis://u:p@127.0.0.1:7001", "redis://u:p@127.0.0.1:7002"]
        );
        let url = StoreUrl::parse("rediss+cluster://h:1?protocol=resp3").unwrap();
        assert_eq!(
            cluster_nodes(&url, true).unwrap(),
            vec!["rediss://h:1?protocol=resp3"]
        );
        assert!(cluster_nodes(&StoreUrl::parse("redis+cluster://").unwrap(), false).is_err());
    }

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact("redis://user:secret@h:1/0?x=1"),
            "redis://user:***@h:1/0?x=1"
        );
        assert_eq!(redact("redis://h:1"), "redis://h:1");
        assert_eq!(redact("redis://:secret@h:1"), "redis://:***@h:1");
    }
}
