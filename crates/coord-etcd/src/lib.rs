//! coord store on etcd v3: every primitive is ONE etcd request.
//!
//! # Shape
//!
//! | primitive | etcd request |
//! | --- | --- |
//! | `snapshot(keys)` | one read-only `Txn` of `Range` gets: all keys at one revision |
//! | `txn(asserts, mutations)` | one `Txn`: `If(compares) Then(puts) Else(gets of the asserted keys)` |
//! | `keys(prefix)` | `Range` over the literal byte range of the prefix (paged, every page at the first page's revision) |
//! | `reclaim` | check the storage-format announcements; in a namespace from before floor mode: create the floor marker once, then ranges to find tombstones written before it, and `Txn`s deleting them under `mod_revision` compares |
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
//! # Versions: real deletes from the start, or tombstones until the first reclaim
//!
//! coord's version of a key (+1 per write, never reused, also after a delete
//! and re-create) comes from etcd's own per-key metadata, in one of two
//! modes per namespace. A **new namespace starts in floor mode** (below):
//! before its first txn a backend that has not seen the marker reads it and
//! at most one key of the namespace, and with neither creates the marker,
//! "clean", in one txn under "marker absent and the namespace's whole range
//! empty" compares (`reclaim.rs`, `start_namespace`; off with
//! [`EtcdOptions::new_namespaces_in_floor_mode`]). Namespaces written before
//! (no marker, some keys) keep tombstone mode until their first reclaim.
//!
//! - **tombstones** (a namespace from before floor mode no reclaim has run on): coord's version is
//!   **etcd's per-key `version`**, and a coord delete writes a tombstone
//!   value instead of deleting the etcd key. etcd's version counts every put
//!   since the key's creation, tombstone writes included, so it is exactly
//!   coord's counter. (A real etcd delete would reset etcd's version and
//!   let a re-create reuse version 1: ABA.)
//! - **floor** (a new namespace, or after an older namespace's first
//!   [`Backend::reclaim`]): a marker key (`coord-meta/<namespace>/floor`,
//!   outside every namespace's range) exists, created at etcd revision `F`,
//!   and from then on a coord
//!   delete is a **real etcd delete**. A key created at revision `c >= F` has
//!   coord version `c + v - 1` at etcd version `v`: +1 per write, and a
//!   re-created key starts at its new create revision, which is above every
//!   revision (so every version) the key had. Keys created before `F` keep
//!   etcd's version; their tombstones are what reclaims delete (each under a
//!   compare that it did not change since it was read), then the marker
//!   says "clean" and a reclaim costs one read. Nothing is left behind by a
//!   delete, so storage and listings follow the live keys.
//!
//! The marker decides how versions read, so until a backend has seen it, a
//! snapshot also reads it (same request) and a txn also asserts its
//! absence: a txn decided without it cannot commit after it appeared, and
//! its `Else` answer shows the marker, so it is decided again under it.
//! Once seen, it is cached for good (it is never deleted).
//!
//! How asserts become compares (at most three per key):
//!
//! - `key @ v` (v > 0): `version == v'` where `v'` is etcd's version for
//!   coord version `v` in the lifetime this backend last saw the key in,
//!   with `create_revision == c` naming that lifetime; or, for a lifetime
//!   from before the marker (or none seen), `version == v AND
//!   create_revision < F`. Without the marker the version alone: a reclaim
//!   creates the marker before it deletes anything, so while the txn's
//!   marker compare holds no key has had a second lifetime. Plus `value !=
//!   tombstone` where a tombstone is possible (lifetimes from before the
//!   marker) and this backend has not seen that very write hold a live
//!   value.
//! - `key missing`: the key is either absent from etcd (`version == 0`) or a
//!   tombstone at some etcd version `t` (`version == t AND value == tombstone`).
//!   etcd compares cannot say "or", so the store guesses from what it last
//!   saw of that key (snapshots, rejected txns and its own writes feed a
//!   small per-backend cache of hints). A wrong guess is rejected by etcd,
//!   and the `Else` gets tell the real state: when every assert actually
//!   held, the txn is re-sent with the exact compares (bounded; a concurrent
//!   delete or reclaim can move things again).
//!   Common paths (assert a live version; create a never-written key;
//!   re-create a key this process saw deleted) cost ONE round trip; creating
//!   a key over a tombstone this process has never read costs two.
//!
//! Trade-offs of this layout, written down:
//!
//! - one request per primitive and no second key family to keep in sync;
//! - in a namespace from before floor mode, until its first reclaim,
//!   tombstones stay (one small key per deleted coord key), and
//!   `keys(prefix)` reads them: it must read values to drop tombstones (etcd
//!   ranges cannot filter on values), in pages bounded by the value limit.
//!   Run `coordctl gc` (or [`Backend::reclaim`]) once and both are gone for
//!   good; a new namespace never has them;
//! - in floor mode a key's first version is its create revision, not 1;
//! - never delete coord's keys by hand (`etcdctl del`) in a namespace
//!   without the marker: that resets etcd's per-key version and breaks
//!   "never reused"; never delete the marker.
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
//! to three compares and a txn one more (the marker), so a call names at
//! most 42 keys, and a txn writing 42 values of the largest size with the
//! longest keys must fit 1.5 MiB: values are limited to **29 KiB** (instead
//! of coord's usual 512 KiB). Raise the
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

mod changes;
mod errors;
mod formats;
mod layout;
mod options;
mod reclaim;
mod txn;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, Assert, Backend, ChangeFeed, Changes, Entry, Error, Limits, Mutation,
    ReclaimOptions, Reclaimed, Result, StoreUrl, TxnOutcome,
};
use etcd_client::{
    ConnectOptions, GetOptions, KeyValue, KvClient, Txn, TxnOp, TxnOpResponse, WatchClient,
};

use errors::{classify, timed_out, Call};
use layout::{marker_key, namespace_prefix, Mode, Stored, TOMBSTONE};
pub use options::{
    Credentials, EtcdOptions, EtcdTls, DEFAULT_PORT, ETCD_DEFAULT_MAX_REQUEST_BYTES,
    ETCD_DEFAULT_MAX_TXN_OPS,
};

/// Keys whose last seen state is remembered per backend (hints only; cleared when full).
const MAX_TOMBSTONE_HINTS: usize = 16_384;

/// What this backend last saw an etcd key hold.
///
/// A hint may be old (the key moved on, or was deleted and created again
/// since), which costs a rejected compare, never a wrong decision: every
/// compare a hint shapes names the lifetime (create revision) or the exact
/// tombstone it expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    /// A tombstone written at this etcd version.
    Tombstone(i64),
    /// A live value written at etcd version `version` of the lifetime
    /// created at `create` (unknown for a lifetime that went on from a
    /// tombstone: one from before the floor marker).
    Live { version: i64, create: Option<i64> },
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
    /// The namespace's floor marker (see [`layout::marker_key`]).
    marker: Vec<u8>,
    /// The marker as last read, once it exists (it is never deleted, and
    /// only ever goes from dirty to clean): `None` = not seen yet.
    mode: Arc<Mutex<Option<Mode>>>,
    /// Whether this backend looked for a namespace without any key yet, to
    /// start it in floor mode (`reclaim.rs`, `start_namespace`).
    probed: Arc<AtomicBool>,
    /// This client's announcements of its storage format (`formats.rs`).
    announcer: Arc<coord_backend::reclaim::Announcer>,
    /// See [`layout::clients_prefix`].
    clients: Vec<u8>,
    /// See [`layout::required_key`].
    required: Vec<u8>,
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
        let target = options::parse_url(url, options)?;
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
        // No channel-wide request timeout: every call already runs under
        // `request_timeout` (see `run`), and a second timer per request cost
        // about 1.5 % of an uncontended lock cycle (docs/shapes.md, etcd, Timeouts).
        let mut connect = ConnectOptions::new().with_connect_timeout(options.connect_timeout);
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
            marker: marker_key(namespace),
            mode: Arc::default(),
            probed: Arc::default(),
            announcer: Arc::new(coord_backend::reclaim::Announcer::new(
                coord_backend::reclaim::STORAGE_FORMAT,
            )),
            clients: layout::clients_prefix(namespace),
            required: layout::required_key(namespace),
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
            marker: marker_key(namespace),
            mode: Arc::default(),
            probed: Arc::default(),
            announcer: Arc::new(coord_backend::reclaim::Announcer::new(
                coord_backend::reclaim::STORAGE_FORMAT,
            )),
            clients: layout::clients_prefix(namespace),
            required: layout::required_key(namespace),
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
                Stored::Live {
                    version, create, ..
                } => Some(Hint::Live {
                    version: *version,
                    create: Some(*create),
                }),
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

    /// The namespace's mode, when the marker is known to exist (from then
    /// on it cannot change but from dirty to clean).
    pub(crate) fn known_mode(&self) -> Option<Mode> {
        *self.mode.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record a marker read (a mode without marker is never cached: one
    /// may be created at any time).
    pub(crate) fn learn_mode(&self, mode: Mode) {
        if let Mode::Floor { floor, clean } = mode {
            let mut known = self.mode.lock().unwrap_or_else(|e| e.into_inner());
            let was_clean = matches!(*known, Some(Mode::Floor { clean: true, .. }));
            *known = Some(Mode::Floor {
                floor,
                clean: clean || was_clean,
            });
        }
    }

    /// Decode the get of the marker: `None` when it does not exist.
    pub(crate) fn decode_marker(&self, response: TxnOpResponse) -> Result<Option<Mode>> {
        let TxnOpResponse::Get(mut get) = response else {
            return Err(Error::malformed(
                "<floor marker>",
                "etcd answered a get with another op",
            ));
        };
        let Some(kv) = get.take_kvs().pop() else {
            return Ok(None);
        };
        let mode = Mode::from_marker(Some((kv.create_revision(), kv.value())));
        self.learn_mode(mode);
        Ok(Some(mode))
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
                let (version, create) = (kv.version(), kv.create_revision());
                let (_, value) = kv.into_key_value();
                Stored::decode(key, version, create, value)?
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
        // A read-only txn: every get at the same revision, one round trip;
        // and the marker until it is known to exist (it decides how
        // versions read).
        let known = self.known_mode();
        let mut gets: Vec<TxnOp> = etcd_keys
            .iter()
            .map(|k| TxnOp::get(k.clone(), None))
            .collect();
        if known.is_none() {
            gets.push(TxnOp::get(self.marker.clone(), None));
        }
        let expected = gets.len();
        let mut kv = self.kv.clone();
        let response = self
            .call("snapshot", Call::Read, kv.txn(Txn::new().and_then(gets)))
            .await?;
        let mut responses = response.op_responses();
        if responses.len() != expected {
            return Err(Error::Unavailable {
                message: format!(
                    "etcd snapshot: {} answers for {expected} gets",
                    responses.len(),
                ),
                source: None,
            });
        }
        let mode = match known {
            Some(mode) => mode,
            None => {
                let marker = responses.pop().expect("counted above");
                self.decode_marker(marker)?.unwrap_or(Mode::Tombstones)
            }
        };
        keys.iter()
            .zip(&etcd_keys)
            .zip(responses)
            .map(|((key, etcd_key), response)| {
                Ok(self
                    .decode_get(key, etcd_key, response)?
                    .into_entry(key, mode))
            })
            .collect()
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        self.txn_impl(asserts, mutations).await
    }

    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.reclaim_impl(options).await
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.list_keys(prefix, None).await
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.list_keys(prefix, Some(limit)).await
    }
}

impl EtcdBackend {
    /// The keys under `prefix`, the first `limit` of them (`None`: all).
    /// Tombstones are keys here: a limited listing reads a page a little
    /// larger than `limit`, and more pages while tombstones fill them.
    async fn list_keys(&self, prefix: &str, limit: Option<usize>) -> Result<Vec<String>> {
        let mut out = Vec::new();
        let page = limit.map(|n| n.saturating_add(16));
        self.scan_pages(prefix, "keys", page, |kv| {
            let version = kv.version();
            let (etcd_key, value) = kv.into_key_value();
            let key = self.decode_key(&etcd_key)?;
            if value.as_slice() == TOMBSTONE {
                // Also a hint for a later "create if missing".
                self.learn(&etcd_key, &Stored::Tombstone(version));
            } else {
                out.push(key);
            }
            Ok(limit.is_none_or(|n| out.len() < n))
        })
        .await?;
        Ok(out)
    }
}

impl EtcdBackend {
    /// Every etcd key of the namespace under `prefix`, with its value, page
    /// by page at the revision of the first page (one consistent listing),
    /// to `visit` until it answers `false`. `Ok(true)`: the scan reached
    /// the end of the range.
    pub(crate) async fn scan(
        &self,
        prefix: &str,
        what: &str,
        visit: impl FnMut(KeyValue) -> Result<bool>,
    ) -> Result<bool> {
        self.scan_pages(prefix, what, None, visit).await
    }

    /// [`Self::scan`], its pages at most `page_at_most` keys long (the
    /// reader of a few keys does not want a thousand).
    async fn scan_pages(
        &self,
        prefix: &str,
        what: &str,
        page_at_most: Option<usize>,
        mut visit: impl FnMut(KeyValue) -> Result<bool>,
    ) -> Result<bool> {
        let start = self.etcd_key(prefix);
        let end = prefix_range_end(&start);
        // Values come along (to tell tombstones): keep each page's answer
        // well below the decoding limit.
        let page = (2 << 20) / (self.limits.max_value_bytes + 2048).max(1);
        let page = page.min(page_at_most.unwrap_or(usize::MAX)).clamp(16, 1000) as i64;
        let mut from = start;
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new().with_range(end.clone()).with_limit(page);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut kv = self.kv.clone();
            let mut response = self
                .call(what, Call::Read, kv.get(from.clone(), Some(options)))
                .await?;
            if revision == 0 {
                revision = response.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = response.more();
            let kvs: Vec<KeyValue> = response.take_kvs();
            let last = kvs.last().map(|kv| kv.key().to_vec());
            for kv in kvs {
                if !visit(kv)? {
                    return Ok(false);
                }
            }
            match last {
                Some(mut last) if more => {
                    last.push(0);
                    from = last;
                }
                _ => return Ok(true),
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
