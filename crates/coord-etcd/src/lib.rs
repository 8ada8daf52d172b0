//! coord store on etcd v3: every primitive is ONE etcd request.
//!
//! # Shape
//!
//! | primitive | etcd request |
//! | --- | --- |
//! | `snapshot(keys)` | one read-only `Txn` of `Range` gets: all keys at one revision |
//! | `txn(asserts, mutations)` | one `Txn`: `If(compares) Then(puts) Else(gets of the asserted keys)` |
//! | `keys(prefix)` | `Range` over the literal byte range of the prefix (paged, every page at the first page's revision) |
//!
//! # Atomicity boundary
//!
//! One etcd `Txn` is applied atomically and **linearizably** through raft: a
//! committed txn is on a quorum's disk (fsync'd WAL) before the answer, and
//! survives the loss of a minority of members. Reads are linearizable too
//! (etcd's ReadIndex), so a snapshot never shows a state older than a txn
//! that already answered. The price is latency: every write waits for a
//! quorum fsync, so etcd is slower per op than Redis (no fsync by default)
//! and usually than a local PostgreSQL; it is the store to pick for
//! correctness under partitions, not for throughput.
//!
//! # Versions: tombstones, never etcd deletes
//!
//! coord's version of a key (+1 per write, never reused, also after a delete
//! and re-create) is **etcd's own per-key `version`**. That only holds
//! because this store never deletes an etcd key: a coord delete writes a
//! tombstone value (see the layout below). etcd's per-key version counts
//! every put since the key's creation, tombstone writes included, so it is
//! exactly coord's counter; a tombstoned key reads as version 0 (missing).
//! (A real etcd delete would reset etcd's version to 0 and let a re-create
//! reuse version 1: ABA.)
//!
//! How asserts become compares:
//!
//! - `key @ v` (v > 0): `version == v AND value != tombstone` (two compares),
//!   or `version == v` alone when this backend has seen etcd version `v` of
//!   that key hold a live value (read it, or wrote it): etcd never deletes a
//!   coord key, so (key, etcd version) names one write forever, and that
//!   write was live;
//! - `key missing`: the key is either absent from etcd (`version == 0`) or a
//!   tombstone at some etcd version `t` (`version == t AND value == tombstone`).
//!   etcd compares cannot say "or", so the store guesses from what it last
//!   saw of that key (snapshots, rejected txns and its own deletes feed a
//!   small per-backend cache of tombstone versions). A wrong guess is
//!   rejected by etcd, and the `Else` gets tell the real state: when every
//!   assert actually held, the txn is re-sent once with the exact compare
//!   (bounded; a concurrent delete of a deleted key can move `t` again).
//!   Common paths (assert a live version; create a never-written key;
//!   re-create a key this process saw deleted) cost ONE round trip; creating
//!   a key over a tombstone this process has never read costs two.
//!
//! Trade-offs of this layout, written down:
//!
//! - one request per primitive and no second key family to keep in sync;
//! - tombstones stay in etcd forever (one small key per deleted coord key),
//!   like the version counters of every other coord store;
//! - `keys(prefix)` must read values to drop tombstones (etcd ranges cannot
//!   filter on values), so it transfers values too, in pages bounded by the
//!   value limit. A separate "live keys" family would make it keys-only at
//!   the cost of one more write per mutation; listing is the rare path.
//! - never delete coord's keys by hand (`etcdctl del`): that resets etcd's
//!   per-key version and breaks "never reused".
//!
//! # Layout
//!
//! etcd key = `coord/<namespace>/<key>`, where the namespace escapes `%` as
//! `%25` and `/` as `%2F`: it never contains the `/` that ends it, so
//! namespaces `a`, `ab`, `a:b` and `a/b` are disjoint ranges. etcd ranges are
//! byte ranges, so prefixes are literal (`%`, `_`, `*`, `\`, non-ASCII...).
//! etcd value = `v` + the coord value for a live key; exactly `x` for a
//! tombstone; anything else is reported as [`Error::MalformedRecord`].
//!
//! # Limits
//!
//! etcd refuses requests above `--max-request-bytes` (1.5 MiB by default)
//! and lists longer than `--max-txn-ops` (128) in one txn. An assert costs up
//! to two compares, so a call names at most 64 keys, and a txn writing 64
//! values of the largest size with the longest keys must fit 1.5 MiB: values
//! are limited to **18 KiB** (instead of coord's usual 512 KiB). Raise the
//! server's limits and [`EtcdOptions::with_server_limits`] together for
//! larger values; see [`EtcdOptions::limits`].
//!
//! # Errors
//!
//! - cannot connect (refused, connect timeout) → [`Error::Unavailable`];
//! - a txn is [`Error::Unavailable`] (certainly not applied, safe to retry)
//!   only for the refusals etcd makes before proposing it to raft (`too many
//!   requests`, `no leader` from the interceptor, ...: the list and the
//!   reasons are in `errors.rs`); any other failure after sending
//!   (connection reset, HTTP/2 error, local timeout, `etcdserver: request
//!   timed out`, `leader changed`, `request canceled`, `database space
//!   exceeded`, `corrupt cluster`, an unknown message) →
//!   [`Error::Indeterminate`], never `applied = false`: the txn may have
//!   applied or may still apply later. Reads failing → [`Error::Unavailable`];
//! - credentials refused → [`Error::Config`]; a request etcd refuses as too
//!   large → [`Error::InvalidInput`].
//!
//! # URL
//!
//! `etcd://[user:password@]host[:port][,host[:port]...][?namespace=NS&...]`;
//! the port defaults to 2379; several hosts are balanced by the client.
//! Query parameters: `namespace`, `user`, `password` (instead of the
//! authority; percent-encoded), `tls=true` (or scheme `etcds://`), `ca=PATH`,
//! `cert=PATH`, `key=PATH` (mutual TLS), `domain=NAME`, `connect_timeout_ms`,
//! `request_timeout_ms`, `max_request_bytes`. TLS needs the crate feature
//! `tls` (rustls + ring, off by default to keep the build small).
//!
//! ```no_run
//! use coord_backend::{Assert, Backend, Mutation, StoreUrl};
//! use coord_etcd::EtcdBackend;
//!
//! # async fn demo() -> coord_backend::Result<()> {
//! let url = StoreUrl::parse("etcd://127.0.0.1:2379?namespace=billing")?;
//! let store = EtcdBackend::connect(&url).await?;
//! let out = store
//!     .txn(&[Assert::missing("job/1")], &[Mutation::put("job/1", b"pending".to_vec())])
//!     .await?;
//! assert!(out.applied || !out.current.is_empty());
//! # Ok(())
//! # }
//! ```

mod config;
mod errors;
mod layout;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, validate_prefix, Assert, Backend, ChangeFeed, ChangeWatch, Changed,
    Changes, Entry, Error, Limits, Mutation, Result, StoreUrl, TxnOutcome, Version,
};
use etcd_client::{
    Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, KvClient, Txn, TxnOp, TxnOpResponse,
    WatchClient, WatchOptions, WatchStream,
};

pub use config::{
    Credentials, EtcdOptions, EtcdTls, DEFAULT_PORT, ETCD_DEFAULT_MAX_REQUEST_BYTES,
    ETCD_DEFAULT_MAX_TXN_OPS,
};
use errors::{classify, timed_out, Call};
use layout::{encode_live, namespace_prefix, Stored, TOMBSTONE};

/// How many txns one `txn` call may send when its guesses about how a
/// "missing" key is represented (absent or tombstone) keep being wrong.
const MAX_REPRESENTATION_ATTEMPTS: usize = 3;

/// Keys whose last seen state is remembered per backend (hints only; cleared when full).
const MAX_TOMBSTONE_HINTS: usize = 16_384;

/// What this backend last saw an etcd key hold, at which etcd version.
///
/// Both are facts that stay true: this store never deletes an etcd key, so
/// etcd's per-key version `n` names one write of the key forever. They may
/// be old (the key moved on since), which costs a rejected compare, never a
/// wrong decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hint {
    /// A tombstone written at this etcd version.
    Tombstone(i64),
    /// A live value written at this etcd version.
    Live(i64),
}

/// A coord store on etcd v3 (see the crate docs for the shape, the version
/// mapping and the atomicity boundary).
///
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct EtcdBackend {
    kv: KvClient,
    /// Change notifications: one etcd watch on the namespace, shared.
    watch: WatchClient,
    /// The feed of that watch while it runs (per namespace, shared by clones).
    feed: Arc<tokio::sync::Mutex<Option<ChangeFeed>>>,
    namespace: String,
    prefix: Arc<[u8]>,
    endpoints: Arc<[String]>,
    options: EtcdOptions,
    limits: Limits,
    /// etcd key → what it was last seen holding (see [`Hint`]).
    tombstones: Arc<Mutex<HashMap<Vec<u8>, Hint>>>,
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.endpoints)
            .field("namespace", &self.namespace)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connect with default [`EtcdOptions`] to the store an `etcd://` or
    /// `etcds://` URL names (see the crate docs for the URL format).
    ///
    /// Without credentials this does not contact etcd yet: an unreachable
    /// server shows up as [`Error::Unavailable`] on the first call.
    pub async fn connect(url: &StoreUrl) -> Result<Self> {
        Self::connect_with(url, EtcdOptions::default()).await
    }

    /// Connect with `options`; what the URL sets (credentials, TLS,
    /// timeouts) overrides them.
    pub async fn connect_with(url: &StoreUrl, options: EtcdOptions) -> Result<Self> {
        let target = config::parse_url(url, options)?;
        Self::connect_endpoints(&target.endpoints, &target.namespace, target.options).await
    }

    /// Connect to explicit endpoints (`http://host:port`, `https://host:port`,
    /// or `host:port`) in `namespace`.
    pub async fn connect_endpoints(
        endpoints: &[String],
        namespace: &str,
        options: EtcdOptions,
    ) -> Result<Self> {
        validate_namespace(namespace)?;
        if endpoints.is_empty() {
            return Err(Error::Config("no etcd endpoint given".to_owned()));
        }
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout);
        if let Some((interval, timeout)) = options.keep_alive {
            connect = connect.with_keep_alive(interval, timeout);
        }
        if let Some(credentials) = &options.credentials {
            connect = connect
                .with_user(credentials.user.clone(), credentials.password.clone())
                .with_auto_token_refresh(true);
        }
        let endpoints: Vec<String> = match &options.tls {
            Some(tls) => {
                connect = tls_options(connect, tls)?;
                endpoints
                    .iter()
                    .map(|e| match e.strip_prefix("http://") {
                        Some(rest) => format!("https://{rest}"),
                        None if e.contains("://") => e.clone(),
                        None => format!("https://{e}"),
                    })
                    .collect()
            }
            None => endpoints.to_vec(),
        };
        // With credentials, connecting authenticates (one request).
        let client = run(
            "connect",
            Call::Connect,
            options.connect_timeout + options.request_timeout,
            etcd_client::Client::connect(&endpoints, Some(connect)),
        )
        .await?;
        // Responses can be as large as the largest request etcd accepts
        // (a snapshot of max keys with max values), plus framing.
        let decode_limit = (2 * options.max_request_bytes + (1 << 20)).max(4 << 20);
        let kv = client.kv_client().max_decoding_message_size(decode_limit);
        Ok(EtcdBackend {
            kv,
            watch: client.watch_client(),
            feed: Arc::default(),
            namespace: namespace.to_owned(),
            prefix: namespace_prefix(namespace).into(),
            endpoints: endpoints.into(),
            limits: options.limits(),
            options,
            tombstones: Arc::default(),
        })
    }

    /// The same connection in another namespace.
    pub fn with_namespace(&self, namespace: &str) -> Result<Self> {
        validate_namespace(namespace)?;
        Ok(EtcdBackend {
            namespace: namespace.to_owned(),
            prefix: namespace_prefix(namespace).into(),
            tombstones: Arc::default(),
            feed: Arc::default(),
            ..self.clone()
        })
    }

    /// The etcd key prefix of this backend's namespace (`coord/<escaped namespace>/`),
    /// for inspection with `etcdctl get --prefix`.
    pub fn etcd_prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// The options in effect.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    fn etcd_key(&self, key: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + key.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(key.as_bytes());
        out
    }

    fn hints(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Hint>> {
        self.tombstones.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remember what a read showed about `etcd_key`.
    fn learn(&self, etcd_key: &[u8], stored: &Stored) {
        self.remember(
            etcd_key,
            match stored {
                Stored::Tombstone(t) => Some(Hint::Tombstone(*t)),
                Stored::Live(version, _) => Some(Hint::Live(*version)),
                Stored::Absent => None,
            },
        );
    }

    /// Set (or with `None` forget) the hint of `etcd_key`.
    fn remember(&self, etcd_key: &[u8], hint: Option<Hint>) {
        let mut hints = self.hints();
        match hint {
            Some(hint) => {
                if hints.len() >= MAX_TOMBSTONE_HINTS && !hints.contains_key(etcd_key) {
                    hints.clear();
                }
                hints.insert(etcd_key.to_vec(), hint);
            }
            None => {
                hints.remove(etcd_key);
            }
        }
    }

    async fn call<T, F>(&self, what: &str, call: Call, fut: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        run(what, call, self.options.request_timeout, fut).await
    }

    /// Decode the single-key range answer `response` for `key`.
    fn decode_get(&self, key: &str, etcd_key: &[u8], response: TxnOpResponse) -> Result<Stored> {
        let TxnOpResponse::Get(mut get) = response else {
            return Err(Error::malformed(key, "etcd answered a get with another op"));
        };
        let stored = match get.take_kvs().pop() {
            None => Stored::Absent,
            Some(kv) => {
                let version = kv.version();
                let (_, value) = kv.into_key_value();
                Stored::decode(key, version, value)?
            }
        };
        self.learn(etcd_key, &stored);
        Ok(stored)
    }
}

async fn run<T, F>(what: &str, call: Call, limit: std::time::Duration, fut: F) -> Result<T>
where
    F: Future<Output = std::result::Result<T, etcd_client::Error>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(error)) => Err(classify(error, what, call)),
        Err(_) => Err(timed_out(what, call, limit)),
    }
}

#[cfg(feature = "tls")]
fn tls_options(connect: ConnectOptions, tls: &EtcdTls) -> Result<ConnectOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |path: &str, what: &str| {
        std::fs::read(path)
            .map_err(|e| Error::Config(format!("etcd TLS: cannot read {what} {path:?}: {e}")))
    };
    let mut config = TlsOptions::new();
    config = match &tls.ca_file {
        Some(path) => config.ca_certificate(Certificate::from_pem(read(path, "CA file")?)),
        None => config.with_native_roots(),
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), Some(key)) => {
            config = config.identity(Identity::from_pem(
                read(cert, "client certificate")?,
                read(key, "client key")?,
            ));
        }
        (None, None) => {}
        _ => {
            return Err(Error::Config(
                "etcd TLS: a client certificate needs both cert and key".to_owned(),
            ))
        }
    }
    if let Some(domain) = &tls.domain {
        config = config.domain_name(domain.clone());
    }
    Ok(connect.with_tls(config))
}

#[cfg(not(feature = "tls"))]
fn tls_options(_connect: ConnectOptions, _tls: &EtcdTls) -> Result<ConnectOptions> {
    Err(Error::Config(
        "etcd TLS (etcds:// or ?tls=true) needs coord-etcd's `tls` feature".to_owned(),
    ))
}

/// One asserted key of a txn, as it is being compared.
struct Asserted<'a> {
    key: &'a str,
    etcd_key: Vec<u8>,
    version: Version,
    /// For a "missing" assert: the etcd version of the tombstone it is
    /// compared as (0 = compare as absent).
    missing_as: i64,
    /// For an assert of a live version: this backend saw that etcd version
    /// of the key hold a live value, so `version == v` alone proves it.
    seen_live: bool,
}

impl Asserted<'_> {
    fn compares(&self, out: &mut Vec<Compare>) {
        if self.version.is_missing() {
            out.push(Compare::version(
                self.etcd_key.clone(),
                CompareOp::Equal,
                self.missing_as,
            ));
            if self.missing_as > 0 {
                out.push(Compare::value(
                    self.etcd_key.clone(),
                    CompareOp::Equal,
                    TOMBSTONE,
                ));
            }
        } else {
            out.push(Compare::version(
                self.etcd_key.clone(),
                CompareOp::Equal,
                self.version.0 as i64,
            ));
            if !self.seen_live {
                out.push(Compare::value(
                    self.etcd_key.clone(),
                    CompareOp::NotEqual,
                    TOMBSTONE,
                ));
            }
        }
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn limits(&self) -> Limits {
        self.limits
    }

    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, keys: &[&str]) -> Result<Vec<Entry>> {
        let etcd_keys: Vec<Vec<u8>> = keys.iter().map(|k| self.etcd_key(k)).collect();
        // A read-only txn: every get at the same revision, one round trip.
        let gets: Vec<TxnOp> = etcd_keys
            .iter()
            .map(|k| TxnOp::get(k.clone(), None))
            .collect();
        let mut kv = self.kv.clone();
        let response = self
            .call("snapshot", Call::Read, kv.txn(Txn::new().and_then(gets)))
            .await?;
        let responses = response.op_responses();
        if responses.len() != keys.len() {
            return Err(Error::Unavailable {
                message: format!(
                    "etcd snapshot: {} answers for {} gets",
                    responses.len(),
                    keys.len()
                ),
                source: None,
            });
        }
        keys.iter()
            .zip(&etcd_keys)
            .zip(responses)
            .map(|((key, etcd_key), response)| {
                Ok(self.decode_get(key, etcd_key, response)?.into_entry(key))
            })
            .collect()
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        let mut seen = HashSet::new();
        let mut asserted: Vec<Asserted<'_>> = {
            let hints = self.hints();
            asserts
                .iter()
                .filter(|a| seen.insert(a.key.as_str()))
                .map(|a| {
                    let etcd_key = self.etcd_key(&a.key);
                    let hint = hints.get(&etcd_key).copied();
                    let missing_as = match hint {
                        Some(Hint::Tombstone(t)) if a.version.is_missing() => t,
                        _ => 0,
                    };
                    let seen_live = !a.version.is_missing()
                        && i64::try_from(a.version.0).is_ok_and(|v| hint == Some(Hint::Live(v)));
                    Asserted {
                        key: &a.key,
                        etcd_key,
                        version: a.version,
                        missing_as,
                        seen_live,
                    }
                })
                .collect()
        };
        let writes: Vec<(Vec<u8>, Vec<u8>)> = mutations
            .iter()
            .map(|m| match m {
                Mutation::Put { key, value } => (self.etcd_key(key), encode_live(value)),
                Mutation::Delete { key } => (self.etcd_key(key), TOMBSTONE.to_vec()),
            })
            .collect();

        let mut current = Vec::new();
        for _attempt in 0..MAX_REPRESENTATION_ATTEMPTS {
            let mut compares = Vec::with_capacity(asserted.len() * 2);
            for a in &asserted {
                a.compares(&mut compares);
            }
            let puts: Vec<TxnOp> = writes
                .iter()
                .map(|(k, v)| TxnOp::put(k.clone(), v.clone(), None))
                .collect();
            let gets: Vec<TxnOp> = asserted
                .iter()
                .map(|a| TxnOp::get(a.etcd_key.clone(), None))
                .collect();
            let request = Txn::new().when(compares).and_then(puts).or_else(gets);
            let mut kv = self.kv.clone();
            let response = self.call("txn", Call::Write, kv.txn(request)).await?;

            if response.succeeded() {
                self.after_commit(&asserted, mutations);
                return Ok(TxnOutcome::applied());
            }

            let responses = response.op_responses();
            if responses.len() != asserted.len() {
                // The txn was rejected (nothing written), but its answer is unusable.
                return Err(Error::Unavailable {
                    message: format!(
                        "etcd txn: {} Else answers for {} asserted keys",
                        responses.len(),
                        asserted.len()
                    ),
                    source: None,
                });
            }
            let mut all_hold = true;
            let mut stored_now = Vec::with_capacity(asserted.len());
            for (a, response) in asserted.iter().zip(responses) {
                let stored = self.decode_get(a.key, &a.etcd_key, response)?;
                all_hold &= stored.coord_version() == a.version;
                stored_now.push(stored);
            }
            current = asserted
                .iter()
                .zip(stored_now.iter().cloned())
                .map(|(a, s)| s.into_entry(a.key))
                .collect();
            if !all_hold {
                return Ok(TxnOutcome::rejected(current));
            }
            // Every assert held as coord sees it: only a "missing" key was
            // compared in the wrong representation. Compare it as it is now.
            for (a, stored) in asserted.iter_mut().zip(&stored_now) {
                if a.version.is_missing() {
                    a.missing_as = match stored {
                        Stored::Tombstone(t) => *t,
                        _ => 0,
                    };
                }
            }
        }
        // Tombstones kept moving under us (concurrent deletes of deleted
        // keys): report a rejection; the caller's CAS loop decides again.
        Ok(TxnOutcome::rejected(current))
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let start = self.etcd_key(prefix);
        let end = prefix_range_end(&start);
        // Values come along (to drop tombstones): keep each page's answer
        // well below the decoding limit.
        let page = (2 << 20) / (self.limits.max_value_bytes + 2048).max(1);
        let page = page.clamp(16, 1000) as i64;
        let mut out = Vec::new();
        let mut from = start.clone();
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut kv = self.kv.clone();
            let mut response = self
                .call("keys", Call::Read, kv.get(from.clone(), Some(options)))
                .await?;
            if revision == 0 {
                revision = response.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = response.more();
            let kvs: Vec<KeyValue> = response.take_kvs();
            let last = kvs.last().map(|kv| kv.key().to_vec());
            for kv in kvs {
                let version = kv.version();
                let (etcd_key, value) = kv.into_key_value();
                let key = self.decode_key(&etcd_key)?;
                if value.as_slice() == TOMBSTONE {
                    // Also a hint for a later "create if missing".
                    self.learn(&etcd_key, &Stored::Tombstone(version));
                    continue;
                }
                out.push(key);
            }
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    from = last;
                }
                _ => break,
            }
        }
        Ok(out)
    }
}

/// etcd's Watch API: **one watch per namespace** (a gRPC stream on the
/// client's channel, started by the first [`Changes::watch`] and shared by
/// every later one), fanned out in-process by key prefix. It is confirmed by
/// etcd (`created`) before the first `watch` returns and reports every
/// revision after that one, so nothing committed after a `watch` returned
/// is missed while the stream lives; a later `watch` subscribes to the
/// running stream, which costs no round trip. A broken stream or a watch
/// etcd cancels makes every `changed()` fail (waiters fall back to polling;
/// the next `watch` starts a new stream). The stream ends a second after
/// its last watch is dropped.
#[async_trait]
impl Changes for EtcdBackend {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        validate_prefix(prefix, &self.limits)?;
        let mut running = self.feed.lock().await;
        if let Some(feed) = running.as_ref() {
            return Ok(feed.watch(prefix));
        }
        let mut client = self.watch.clone();
        let options = WatchOptions::new().with_prefix();
        let key = self.etcd_key("");
        let limit = self.options.request_timeout;
        let mut stream = run("watch", Call::Read, limit, client.watch(key, Some(options))).await?;
        loop {
            match run("watch", Call::Read, limit, stream.message()).await? {
                Some(response) if response.canceled() => return Err(watch_ended(&response)),
                Some(response) if response.created() => break,
                Some(_) => {}
                None => return Err(watch_ended_early()),
            }
        }
        let feed = ChangeFeed::new();
        let watch = feed.watch(prefix);
        *running = Some(feed.clone());
        tokio::spawn(fan_out(
            self.feed.clone(),
            feed,
            stream,
            self.prefix.clone(),
        ));
        Ok(watch)
    }
}

/// Publish what the namespace's watch stream reports until it breaks or no
/// watch is left; then forget the feed, so that its watches fail (every
/// clone gone) and the next `watch` starts a new stream.
async fn fan_out(
    running: Arc<tokio::sync::Mutex<Option<ChangeFeed>>>,
    feed: ChangeFeed,
    mut stream: WatchStream,
    prefix: Arc<[u8]>,
) {
    let mut idle = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            message = stream.message() => match message {
                // Canceled by etcd, ended, or broken: the watches fail, waiters poll.
                Ok(Some(response)) if response.canceled() => break,
                Ok(Some(response)) => {
                    let keys: Vec<String> = response
                        .events()
                        .iter()
                        .filter_map(|event| event.kv())
                        .filter_map(|kv| kv.key().strip_prefix(&*prefix))
                        .map(|key| String::from_utf8_lossy(key).into_owned())
                        .collect();
                    if !keys.is_empty() {
                        feed.publish(Changed::Keys(keys.into()));
                    }
                }
                Ok(None) | Err(_) => break,
            },
            _ = idle.tick() => {
                let mut slot = running.lock().await;
                if feed.watchers() == 0 {
                    if slot.as_ref().is_some_and(|f| f.same(&feed)) {
                        *slot = None;
                    }
                    return;
                }
            }
        }
    }
    let mut slot = running.lock().await;
    if slot.as_ref().is_some_and(|f| f.same(&feed)) {
        *slot = None;
    }
}

fn watch_ended(response: &etcd_client::WatchResponse) -> Error {
    Error::Unavailable {
        message: format!("etcd canceled the watch: {}", response.cancel_reason()),
        source: None,
    }
}

fn watch_ended_early() -> Error {
    Error::Unavailable {
        message: "etcd closed the watch stream".to_owned(),
        source: None,
    }
}

impl EtcdBackend {
    /// Update the tombstone hints after a committed txn.
    fn after_commit(&self, asserted: &[Asserted<'_>], mutations: &[Mutation]) {
        let known: HashMap<&str, i64> = asserted
            .iter()
            .map(|a| {
                let etcd_version = if a.version.is_missing() {
                    a.missing_as
                } else {
                    a.version.0 as i64
                };
                (a.key, etcd_version)
            })
            .collect();
        for mutation in mutations {
            let etcd_key = self.etcd_key(mutation.key());
            // Every compare held, so an asserted key was at `before` and this
            // write made it `before + 1`; of an unasserted key we know nothing.
            match (mutation, known.get(mutation.key())) {
                (Mutation::Delete { .. }, Some(before)) => {
                    self.remember(&etcd_key, Some(Hint::Tombstone(before + 1)))
                }
                (Mutation::Put { .. }, Some(before)) => {
                    self.remember(&etcd_key, Some(Hint::Live(before + 1)))
                }
                _ => self.remember(&etcd_key, None),
            }
        }
    }

    fn decode_key(&self, etcd_key: &[u8]) -> Result<String> {
        let relative = etcd_key.strip_prefix(&*self.prefix).ok_or_else(|| {
            Error::malformed(
                String::from_utf8_lossy(etcd_key),
                "etcd returned a key outside the namespace's range",
            )
        })?;
        String::from_utf8(relative.to_vec()).map_err(|_| {
            Error::malformed(
                String::from_utf8_lossy(relative),
                "etcd key is not UTF-8 (not written by coord-etcd)",
            )
        })
    }
}

/// The first key after every key starting with `prefix` (etcd's range end).
fn prefix_range_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only reachable for an all-0xff prefix, which a namespace prefix never is.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_end() {
        assert_eq!(prefix_range_end(b"coord/a/"), b"coord/a0".to_vec());
        assert_eq!(prefix_range_end(b"a\xff"), b"b".to_vec());
    }
}
