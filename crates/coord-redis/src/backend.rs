use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{
    validate_namespace, validate_prefix, Assert, Backend, ChangeWatch, Changes, Entry, Error,
    Limits, Mutation, ReclaimOptions, Reclaimed, Result, StoreUrl, TxnOutcome, Version,
};
use redis::aio::ConnectionLike;
use redis::aio::MultiplexedConnection;
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    AsyncConnectionConfig, ErrorKind, PushInfo, PushKind, RedisError, RedisResult, Script,
    ServerErrorKind, ToRedisArgs, Value,
};

use crate::changes::{Source, Subscriber};
use crate::server::{
    check_eviction, check_primary, connect_error, eviction_policy_cmd, is_read_only, ran_nothing,
    EvictionCheck, ReplicaAck, SentinelTarget,
};
use crate::{scripts, RedisOptions};

mod reclaim;

/// A script with its source: `EVALSHA` normally, `EVAL` to a node named by
/// a redirect (which may not have cached it yet).
struct Lua {
    script: Script,
    source: &'static str,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            script: Script::new(source),
            source,
        }
    }
}

static SNAPSHOT: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::SNAPSHOT));
static TXN: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::TXN));
static TXN_PUT_LIVE: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::TXN_PUT_LIVE));
static KEYS: LazyLock<Lua> = LazyLock::new(|| Lua::new(scripts::KEYS));

/// One call of one script: its `KEYS` and `ARGV`.
struct Call {
    lua: &'static Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call {
    fn new(lua: &'static LazyLock<Lua>) -> Call {
        Call {
            lua: LazyLock::force(lua),
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    fn key(&mut self, key: impl Into<Vec<u8>>) -> &mut Self {
        self.keys.push(key.into());
        self
    }

    fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    fn command(&self, name: &str, script: &[u8]) -> redis::Cmd {
        // Sized up front: growing the buffer arg by arg cost a lock cycle
        // several reallocations.
        let data: usize = self.keys.iter().chain(&self.args).map(Vec::len).sum();
        let mut cmd = redis::Cmd::with_capacity(
            3 + self.keys.len() + self.args.len(),
            name.len() + script.len() + 20 + data,
        );
        cmd.arg(name)
            .arg(script)
            .arg(self.keys.len())
            .arg(self.keys.as_slice())
            .arg(self.args.as_slice());
        cmd
    }

    fn evalsha(&self) -> redis::Cmd {
        self.command("EVALSHA", self.lua.script.get_hash().as_bytes())
    }

    fn eval(&self) -> redis::Cmd {
        self.command("EVAL", self.lua.source.as_bytes())
    }
}

/// How far a failed call got.
enum Failure {
    /// No connection could be (re)established: nothing was sent.
    NotSent(RedisError),
    /// The call was, or may have been, written to a socket.
    Sent(RedisError),
}

impl Failure {
    fn error(&self) -> &RedisError {
        match self {
            Failure::NotSent(e) | Failure::Sent(e) => e,
        }
    }
}

/// Where a cluster node told us to send a call it did not run: `MOVED`
/// (the slot lives there now) or `ASK` (this one call goes there, preceded
/// by `ASKING`, while the slot migrates).
struct Redirect {
    ask: bool,
    host: String,
    port: u16,
}

impl Redirect {
    fn of(error: &RedisError) -> Option<Redirect> {
        let ask = match error.kind() {
            ErrorKind::Server(ServerErrorKind::Ask) => true,
            ErrorKind::Server(ServerErrorKind::Moved) => false,
            _ => return None,
        };
        let (addr, _slot) = error.redirect_node()?;
        let (host, port) = addr.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        Some(Redirect {
            ask,
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// Both connection kinds are cheap handles on one shared connection (cloned per call).
#[derive(Clone)]
enum Conn {
    Standalone(Arc<Standalone>),
    Cluster(ClusterConnection),
}

/// The reply of a script, and of the `WAIT` sent behind it when asked.
struct Reply {
    value: Value,
    /// `WAIT`'s reply (`None` when no `WAIT` was sent).
    wait: Option<RedisResult<Value>>,
}

/// What goes behind a txn script with `?replicas=N`: a write to the
/// namespace's barrier key, then `WAIT` on the same connection.
///
/// `WAIT` counts the replicas that reached the connection's last propagated
/// write. Since Redis 7.2 a command that writes nothing does not move that
/// mark, so a rejected script (or an applied one that only asserted) would be
/// waited for at a stale offset: its answer could rest on another client's
/// write that no replica holds yet — its own earlier txn, whose answer was
/// lost, among them (the CAS engine then calls a rejected resend whose
/// entries show its puts "applied"). The barrier is propagated after the
/// script, so `WAIT` covers everything the script saw. One key per namespace,
/// overwritten: nothing grows.
#[derive(Clone, Copy)]
struct AckAfter<'a> {
    ack: ReplicaAck,
    barrier: &'a [u8],
}

impl AckAfter<'_> {
    /// Commands pipelined behind the script: `SET barrier 1`, `WAIT N T`.
    const COMMANDS: usize = 2;

    fn add_to(&self, pipe: &mut redis::Pipeline, asking: bool) {
        if asking {
            // ASKING holds for the next command only.
            pipe.cmd("ASKING");
        }
        pipe.cmd("SET").arg(self.barrier).arg("1");
        pipe.add_command(self.ack.command());
    }
}

/// Split the replies of `[script…, SET barrier, WAIT]` (the last replies of
/// a pipeline): the script's reply (an error reply as `Err`) and `WAIT`'s
/// (the barrier's error instead, when the barrier failed: then `WAIT`
/// proves nothing). `asking`: an `ASKING` went in front of the barrier.
fn split_replies(
    mut replies: Vec<Value>,
    ack: Option<AckAfter<'_>>,
    asking: bool,
) -> RedisResult<Reply> {
    let wait = ack.map(|_| {
        let wait = replies.pop().unwrap_or(Value::Nil).extract_error();
        let barrier = replies.pop().unwrap_or(Value::Nil).extract_error();
        if asking {
            replies.pop();
        }
        barrier.and(wait)
    });
    let value = replies.pop().unwrap_or(Value::Nil).extract_error()?;
    Ok(Reply { value, wait })
}

/// `EVALSHA` of `call`, followed by the barrier and `WAIT` in the same
/// pipeline when `ack` is given (one round trip: all are written at once,
/// Redis answers in order).
async fn send_script(
    conn: &mut impl ConnectionLike,
    call: &Call,
    ack: Option<AckAfter<'_>>,
) -> RedisResult<Reply> {
    match ack {
        None => Ok(Reply {
            value: call.evalsha().query_async::<Value>(conn).await?,
            wait: None,
        }),
        Some(after) => {
            let mut pipe = redis::pipe();
            pipe.add_command(call.evalsha());
            after.add_to(&mut pipe, false);
            split_replies(
                conn.req_packed_commands(&pipe, 0, 1 + AckAfter::COMMANDS)
                    .await?,
                Some(after),
                false,
            )
        }
    }
}

/// Run `send`; when the server answers `NOSCRIPT` (it ran nothing), load
/// `lua` through `load_on` (a connection to the same node) and run `send`
/// once more. The outer `Err` is a failed load: nothing was run.
async fn resend_after_loading<C, T, Fut>(
    mut load_on: C,
    lua: &Lua,
    send: impl Fn() -> Fut,
) -> std::result::Result<RedisResult<T>, RedisError>
where
    C: ConnectionLike + Send,
    Fut: std::future::Future<Output = RedisResult<T>>,
{
    match send().await {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            lua.script.load_async(&mut load_on).await?;
            Ok(send().await)
        }
        other => Ok(other),
    }
}

impl Conn {
    /// Send `call` once (plus a `SCRIPT LOAD` when the server answers
    /// `NOSCRIPT`, which ran nothing), to `redirect` when given, followed
    /// by the barrier and `WAIT` on the same connection (the same node)
    /// when `ack` is given.
    async fn run(
        &self,
        call: &Call,
        redirect: Option<Redirect>,
        ack: Option<AckAfter<'_>>,
    ) -> std::result::Result<Reply, Failure> {
        match self {
            Conn::Standalone(standalone) => standalone.run(call, ack).await,
            Conn::Cluster(c) => {
                let mut c = c.clone();
                match redirect {
                    None if ack.is_none() => resend_after_loading(c.clone(), call.lua, || {
                        let mut c = c.clone();
                        async move { call.evalsha().query_async::<Value>(&mut c).await }
                    })
                    .await
                    .map_err(Failure::NotSent)?
                    .map(|value| Reply { value, wait: None }),
                    None => {
                        // WAIT counts the replicas of the node it runs on:
                        // it goes to the master of the script's slot (every
                        // key of a call, the barrier too, shares the
                        // namespace's hash tag), in one pipeline on that
                        // node's connection.
                        let slot_key = call.keys.first().cloned().unwrap_or_default();
                        let node = || {
                            SingleNodeRoutingInfo::SpecificNode(Route::with_key(
                                &slot_key,
                                SlotAddr::Master,
                            ))
                        };
                        let pipe = |call: &Call| {
                            let mut pipe = redis::pipe();
                            pipe.add_command(call.evalsha());
                            ack.expect("checked above").add_to(&mut pipe, false);
                            pipe
                        };
                        resend_after_loading(c.clone(), call.lua, || {
                            let mut c = c.clone();
                            async move {
                                c.route_pipeline(pipe(call), 0, 1 + AckAfter::COMMANDS, node())
                                    .await
                                    .and_then(|replies| split_replies(replies, ack, false))
                            }
                        })
                        .await
                        .map_err(Failure::NotSent)?
                    }
                    Some(to) => {
                        let node = SingleNodeRoutingInfo::ByAddress {
                            host: to.host,
                            port: to.port,
                        };
                        // ASKING applies to the next command of the same
                        // connection: one pipeline keeps the two adjacent.
                        let mut pipe = redis::pipe();
                        if to.ask {
                            pipe.cmd("ASKING");
                        }
                        pipe.add_command(call.eval());
                        if let Some(ack) = ack {
                            ack.add_to(&mut pipe, to.ask);
                        }
                        let count = pipe.len();
                        c.route_pipeline(pipe, 0, count, node)
                            .await
                            .and_then(|replies| split_replies(replies, ack, to.ask))
                    }
                }
                .map_err(Failure::Sent)
            }
        }
    }
}

/// Where a standalone connection goes: one fixed server, or the primary
/// that the Sentinels name (asked again at every reconnection).
#[derive(Clone)]
pub(crate) enum Target {
    Fixed(Box<redis::Client>),
    Sentinel(Arc<SentinelTarget>),
}

impl Target {
    /// The client of the server to connect to now.
    pub(crate) async fn client(&self) -> RedisResult<redis::Client> {
        match self {
            Target::Fixed(client) => Ok((**client).clone()),
            Target::Sentinel(sentinels) => sentinels.primary().await,
        }
    }
}

/// One multiplexed connection to a standalone server, made again on demand
/// once it is known to be broken. A call therefore knows whether it failed
/// while connecting (nothing sent: [`Failure::NotSent`]) or after it was
/// handed to a connection ([`Failure::Sent`]); `redis::aio::ConnectionManager`
/// returns both kinds of failure alike.
struct Standalone {
    target: Target,
    config: AsyncConnectionConfig,
    /// RESP3 connections report their own drop (a push), so the next call
    /// reconnects before sending instead of failing on the dead connection.
    resp3: bool,
    reconnect_retries: usize,
    current: tokio::sync::Mutex<Option<Live>>,
    /// Bumped by every connection made to a primary the Sentinels named:
    /// the change subscriber ends when it moves (see `changes.rs`).
    generation: Arc<AtomicU64>,
}

#[derive(Clone)]
struct Live {
    conn: MultiplexedConnection,
    /// Set once this connection is known to be unusable.
    broken: Arc<AtomicBool>,
}

impl Live {
    /// A connection that failed, or reached a replica (`READONLY`: a
    /// demoted primary), is made again (through the Sentinels) by the next call.
    fn note(&self, error: &RedisError) {
        if error.is_unrecoverable_error() || is_read_only(error) {
            self.broken.store(true, Ordering::Release);
        }
    }
}

impl Standalone {
    /// The current connection, or a new one when there is none or it broke.
    /// Callers queue here while one of them reconnects.
    async fn connection(&self) -> RedisResult<Live> {
        let mut current = self.current.lock().await;
        if let Some(live) = current.as_ref() {
            if !live.broken.load(Ordering::Acquire) {
                return Ok(live.clone());
            }
        }
        *current = None;
        let live = self.connect().await?;
        *current = Some(live.clone());
        Ok(live)
    }

    async fn connect(&self) -> RedisResult<Live> {
        let mut attempt = 0;
        loop {
            let broken = Arc::new(AtomicBool::new(false));
            let mut config = self.config.clone();
            if self.resp3 {
                let flag = broken.clone();
                config = config.set_push_sender(move |info: PushInfo| {
                    if info.kind == PushKind::Disconnection {
                        flag.store(true, Ordering::Release);
                    }
                    Ok::<(), std::convert::Infallible>(())
                });
            }
            let made = match self.target.client().await {
                Ok(client) => {
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                }
                Err(error) => Err(error),
            };
            let made = match (made, &self.target) {
                (Ok(mut conn), Target::Sentinel(_)) => match check_primary(&mut conn).await {
                    Ok(()) => {
                        self.generation.fetch_add(1, Ordering::AcqRel);
                        Ok(conn)
                    }
                    Err(error) => Err(error),
                },
                (made, _) => made,
            };
            match made {
                Ok(conn) => return Ok(Live { conn, broken }),
                Err(error) if attempt < self.reconnect_retries && !is_permanent(&error) => {
                    attempt += 1;
                    let backoff = 20u64 << attempt.min(5);
                    tokio::time::sleep(Duration::from_millis(backoff.min(500))).await;
                }
                Err(error) => return Err(error),
            }
        }
    }

    async fn run(
        &self,
        call: &Call,
        ack: Option<AckAfter<'_>>,
    ) -> std::result::Result<Reply, Failure> {
        let live = self.connection().await.map_err(Failure::NotSent)?;
        let result = resend_after_loading(live.conn.clone(), call.lua, || {
            let mut conn = live.conn.clone();
            async move { send_script(&mut conn, call, ack).await }
        })
        .await
        .map_err(|e| {
            live.note(&e);
            Failure::NotSent(e)
        })?;
        result.map_err(|e| {
            live.note(&e);
            Failure::Sent(e)
        })
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
    /// `coord:{NS}:dead`, the tombstone set.
    dead_key: Vec<u8>,
    /// `coord:{NS}:floor`
    floor_key: Vec<u8>,
    /// `coord:{NS}:clients`, the announcements of storage formats.
    clients_key: Vec<u8>,
    /// This client's announcements (shared by clones).
    announcer: Arc<coord_backend::reclaim::Announcer>,
    conn: Conn,
    /// The URL without its password, for `Debug`.
    endpoint: String,
    options: RedisOptions,
    /// `?replicas=N&replica_timeout_ms=T`: the barrier and `WAIT` behind
    /// every txn (see [`AckAfter`]).
    ack: Option<ReplicaAck>,
    /// `coord:{NS}:ack`, the barrier key written before each `WAIT`.
    barrier_key: Vec<u8>,
    /// Change notifications (shared by clones), see `changes.rs`.
    subscriber: Arc<Subscriber>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("endpoint", &self.endpoint)
            .field("namespace", &self.namespace)
            .field(
                "mode",
                &match &self.conn {
                    Conn::Standalone(s) if matches!(s.target, Target::Sentinel(_)) => "sentinel",
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
    /// `redis+cluster`, `rediss+cluster`, `redis+sentinel` (see the crate docs).
    ///
    /// Fails with [`Error::Config`] for a URL the client cannot use or a
    /// server (any master of a cluster) whose `maxmemory-policy` is not
    /// `noeviction` (see [`RedisOptions::allow_eviction`]), and with
    /// [`Error::Unavailable`] when the server (or no seed node) answers, or
    /// no Sentinel names a reachable primary (the message names the
    /// Sentinels and the master name).
    pub async fn connect(url: &StoreUrl) -> Result<Self> {
        Self::connect_with(url, RedisOptions::default()).await
    }

    /// Connect with explicit options.
    pub async fn connect_with(url: &StoreUrl, options: RedisOptions) -> Result<Self> {
        let namespace = url.namespace().to_owned();
        // StoreUrl already checked it; this store relies on "no braces" for its hash tag.
        validate_namespace(&namespace)?;
        let endpoint = coord_backend::redact::url(url.without_namespace());
        let (cluster, tls) = match url.scheme() {
            "redis" | "redis+sentinel" => (false, false),
            "rediss" => (false, true),
            "redis+cluster" => (true, false),
            "rediss+cluster" => (true, true),
            other => {
                return Err(Error::Config(format!(
                    "coord-redis cannot open a {other}:// URL (expected redis, rediss, \
                     redis+cluster, rediss+cluster or redis+sentinel)"
                )))
            }
        };
        let sentinel = url.scheme() == "redis+sentinel";
        // `replicas` and `replica_timeout_ms` are this crate's, not the client's.
        let (client_url, ack) = ReplicaAck::take(url.without_namespace())?;
        let client_url = StoreUrl::parse(&client_url)?;
        if tls && !cfg!(feature = "tls") {
            return Err(Error::Config(
                "rediss:// needs coord-redis built with its `tls` feature".to_owned(),
            ));
        }
        let (conn, source) = if cluster {
            let nodes = cluster_nodes(&client_url, tls)?;
            let source = Source::Cluster {
                nodes: nodes.clone(),
                connect_timeout: options.connect_timeout,
            };
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
            let mut connection = client
                .get_async_connection()
                .await
                .map_err(|e| connect_error(&endpoint, e))?;
            if !options.allow_eviction {
                // Every master holds some namespaces: each must keep its records.
                let reply = connection
                    .route_command(
                        eviction_policy_cmd(),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None)),
                    )
                    .await;
                match reply {
                    Ok(Value::Map(nodes)) => {
                        for (node, reply) in nodes {
                            let node = text(node);
                            check_eviction(&node, reply.extract_error(), STORE_EVICTION)?;
                        }
                    }
                    other => check_eviction(&endpoint, other, STORE_EVICTION)?,
                }
            }
            (Conn::Cluster(connection), source)
        } else {
            let (target, resp3) = if sentinel {
                // Discovery (every Sentinel, then the master's ROLE) within
                // a few connection timeouts.
                let sentinels = SentinelTarget::parse(url, options.connect_timeout * 3)?;
                let resp3 = sentinels.resp3();
                (Target::Sentinel(Arc::new(sentinels)), resp3)
            } else {
                let client = redis::Client::open(client_url.without_namespace())
                    .map_err(|e| config_error(&endpoint, e))?;
                let resp3 = client
                    .get_connection_info()
                    .redis_settings()
                    .protocol()
                    .supports_resp3();
                (Target::Fixed(Box::new(client)), resp3)
            };
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(options.connect_timeout))
                .set_response_timeout(options.response_timeout);
            let generation = Arc::new(AtomicU64::new(0));
            let source = Source::Standalone {
                target: target.clone(),
                generation: generation.clone(),
            };
            let standalone = Standalone {
                target,
                config,
                resp3,
                reconnect_retries: options.reconnect_retries,
                current: tokio::sync::Mutex::new(None),
                generation,
            };
            let live = standalone
                .connection()
                .await
                .map_err(|e| connect_error(&endpoint, e))?;
            if !options.allow_eviction {
                let reply = eviction_policy_cmd()
                    .query_async(&mut live.conn.clone())
                    .await;
                check_eviction(&endpoint, reply, STORE_EVICTION)?;
            }
            (Conn::Standalone(Arc::new(standalone)), source)
        };
        Ok(RedisBackend {
            subscriber: Arc::new(Subscriber::new(source, &namespace, &endpoint)),
            record_prefix: format!("coord:{{{namespace}}}:k:").into_bytes(),
            index_key: format!("coord:{{{namespace}}}:idx").into_bytes(),
            dead_key: format!("coord:{{{namespace}}}:dead").into_bytes(),
            floor_key: format!("coord:{{{namespace}}}:floor").into_bytes(),
            clients_key: format!("coord:{{{namespace}}}:clients").into_bytes(),
            barrier_key: format!("coord:{{{namespace}}}:ack").into_bytes(),
            announcer: Arc::new(coord_backend::reclaim::Announcer::new(
                coord_backend::reclaim::STORAGE_FORMAT,
            )),
            namespace,
            conn,
            endpoint,
            options,
            ack,
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

    /// Run one script call. Cluster answers that ran nothing are followed:
    /// `ASK`/`MOVED` go to the node they name, `TRYAGAIN`/`CLUSTERDOWN` are
    /// waited out (at most `redirect_retries` times in all). Reads are also
    /// repeated after other failures (a fresh connection is made meanwhile).
    /// A txn is never sent again after a failure that may have run it.
    async fn call(&self, call: &Call, op: Op, what: &str) -> Result<Value> {
        Ok(self.call_acked(call, op, what, None).await?.value)
    }

    /// [`RedisBackend::call`], with `WAIT` behind the script when `ack` is
    /// given. A `READONLY` answer (the connection reached a demoted
    /// primary: nothing ran) makes the connection again, through the
    /// Sentinels, and is sent once more within `redirect_retries`.
    async fn call_acked(
        &self,
        call: &Call,
        op: Op,
        what: &str,
        ack: Option<AckAfter<'_>>,
    ) -> Result<Reply> {
        let mut redirects = 0;
        let mut read_attempts = 0;
        let mut redirect = None;
        loop {
            let failure = match self.conn.run(call, redirect.take(), ack).await {
                Ok(reply) => return Ok(reply),
                Err(failure) => failure,
            };
            let error = failure.error();
            if redirects < self.options.redirect_retries {
                if is_read_only(error) {
                    redirects += 1;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(redirects))).await;
                    continue;
                }
                if let Some(to) = Redirect::of(error) {
                    redirects += 1;
                    redirect = Some(to);
                    continue;
                }
                if error.is_cluster_error() || error.kind() == ErrorKind::ClusterConnectionNotFound
                {
                    // The cluster connection refreshes its slot map meanwhile.
                    redirects += 1;
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(redirects))).await;
                    continue;
                }
            }
            if op == Op::Read && read_attempts < self.options.read_retries && !is_permanent(error) {
                read_attempts += 1;
                tokio::time::sleep(Duration::from_millis(20 * u64::from(read_attempts))).await;
                continue;
            }
            return Err(self.map_error(failure, op, what));
        }
    }

    fn map_error(&self, failure: Failure, op: Op, what: &str) -> Error {
        let message = format!("{what} on {} (namespace {})", self.endpoint, self.namespace);
        let (sent, error) = match failure {
            Failure::NotSent(error) => (false, error),
            Failure::Sent(error) => (true, error),
        };
        if matches!(error.kind(), ErrorKind::InvalidClientConfig) {
            return Error::Config(format!("{message}: {error}"));
        }
        if !sent || op == Op::Read || ran_nothing(&error) {
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

impl RedisBackend {
    /// A txn that asserts one key at a live version and puts a new value
    /// under it (a lock taken, renewed or released; a lease extended): the
    /// `TXN_PUT_LIVE` script, whose replies read like `TXN`'s.
    async fn put_live(&self, assert: &Assert, value: &[u8]) -> Result<TxnOutcome> {
        let mut call = Call::new(&TXN_PUT_LIVE);
        call.key(self.record_key(&assert.key))
            .arg(self.record_prefix.len())
            .arg(assert.version.0)
            .arg(value)
            .arg(self.subscriber.publish_command())
            .arg(self.subscriber.channel());
        let key = assert.key.as_str();
        self.run_txn(&call, &[key], &[key], key).await
    }

    /// Run a txn script and read its reply: `applied` with the versions of
    /// `puts` (the keys put, in mutation order), or `rejected` with the
    /// current entries of `asserted` (the asserted keys, in order). With
    /// `?replicas=N`, unless `WAIT` (sent behind the script and the
    /// barrier) counted N replicas, an applied txn is `Indeterminate` (a
    /// failover may lose it) and a rejection is marked
    /// [`TxnOutcome::unconfirmed`] (it may rest on a write a failover loses,
    /// see [`AckAfter`]).
    async fn run_txn(
        &self,
        call: &Call,
        asserted: &[&str],
        puts: &[&str],
        first_key: &str,
    ) -> Result<TxnOutcome> {
        let after = self.ack.map(|ack| AckAfter {
            ack,
            barrier: &self.barrier_key,
        });
        let Reply { value, wait } = self.call_acked(call, Op::Txn, "txn", after).await?;
        let mut reply = array(value).map_err(|e| self.malformed_reply(e, first_key))?;
        let what = || {
            format!(
                "txn on {} (namespace {}, key {first_key:?})",
                self.endpoint, self.namespace
            )
        };
        match reply.first().and_then(tag) {
            Some(b"applied") => {
                if let (Some(ack), Some(wait)) = (self.ack, wait) {
                    ack.judge(wait, &what())?;
                }
                // A version missing or not reading as one (never sent by
                // these scripts) is left unreported, not an error.
                Ok(TxnOutcome::applied_at(
                    puts.iter()
                        .zip(reply.into_iter().skip(1))
                        .filter_map(|(key, version)| {
                            let version = bytes(version)?;
                            let version = std::str::from_utf8(&version).ok()?.parse().ok()?;
                            Some(((*key).to_owned(), Version(version)))
                        })
                        .collect(),
                ))
            }
            Some(b"rejected") => {
                let doubt = match (self.ack, wait) {
                    (Some(ack), Some(wait)) => ack.judge_rejection(wait, &what()),
                    _ => None,
                };
                reply.remove(0);
                let current = self.entries(reply, asserted)?;
                Ok(match doubt {
                    None => TxnOutcome::rejected(current),
                    Some(why) => TxnOutcome::rejected_unconfirmed(current, why),
                })
            }
            _ => Err(self.malformed_reply(reply, first_key)),
        }
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

    fn changes(&self) -> Option<&dyn Changes> {
        Some(self)
    }

    async fn raw_snapshot(&self, distinct: &[&str]) -> Result<Vec<Entry>> {
        let mut call = Call::new(&SNAPSHOT);
        for key in distinct {
            call.key(self.record_key(key));
        }
        let reply = self.call(&call, Op::Read, "snapshot").await?;
        let mut reply = array(reply).map_err(|e| self.malformed_reply(e, distinct[0]))?;
        if reply.first().and_then(tag) != Some(b"ok") {
            return Err(self.malformed_reply(reply, distinct[0]));
        }
        reply.remove(0);
        self.entries(reply, distinct)
    }

    async fn raw_txn(&self, asserts: &[Assert], mutations: &[Mutation]) -> Result<TxnOutcome> {
        self.announce().await?;
        if let ([assert], [Mutation::Put { key, value }]) = (asserts, mutations) {
            if *key == assert.key && assert.version != Version::MISSING {
                return self.put_live(assert, value).await;
            }
        }
        // KEYS[1] is the index; then one record key per distinct key, asserted keys first.
        let mut position: HashMap<&str, usize> = HashMap::new();
        let mut asserted: Vec<&str> = Vec::new();
        let mut versions: Vec<Version> = Vec::new();
        let mut invocation = Call::new(&TXN);
        invocation.key(self.index_key.as_slice());
        for assert in asserts {
            if !position.contains_key(assert.key.as_str()) {
                position.insert(&assert.key, position.len() + 2);
                asserted.push(&assert.key);
                versions.push(assert.version);
                invocation.key(self.record_key(&assert.key));
            }
        }
        for mutation in mutations {
            if !position.contains_key(mutation.key()) {
                position.insert(mutation.key(), position.len() + 2);
                invocation.key(self.record_key(mutation.key()));
            }
        }
        invocation.key(self.dead_key.as_slice());
        invocation.key(self.floor_key.as_slice());
        invocation.arg(self.record_prefix.len());
        invocation.arg(asserted.len());
        for version in &versions {
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
        invocation
            .arg(self.subscriber.publish_command())
            .arg(self.subscriber.channel());
        let first_key = asserts
            .first()
            .map(|a| a.key.as_str())
            .or_else(|| mutations.first().map(Mutation::key))
            .unwrap_or("");
        let puts: Vec<&str> = mutations
            .iter()
            .filter(|m| matches!(m, Mutation::Put { .. }))
            .map(Mutation::key)
            .collect();
        self.run_txn(&invocation, &asserted, &puts, first_key).await
    }

    async fn reclaim(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.reclaim_pass(options).await
    }

    async fn raw_keys(&self, prefix: &str) -> Result<Vec<String>> {
        self.list_keys(prefix, None).await
    }

    async fn raw_first_keys(&self, prefix: &str, limit: usize) -> Result<Vec<String>> {
        self.list_keys(prefix, Some(limit)).await
    }
}

impl RedisBackend {
    /// The keys under `prefix`, the first `limit` of them (`None`: all).
    async fn list_keys(&self, prefix: &str, limit: Option<usize>) -> Result<Vec<String>> {
        let (min, max) = lex_range(prefix.as_bytes());
        let mut call = Call::new(&KEYS);
        call.key(self.index_key.as_slice()).arg(min).arg(max);
        if let Some(limit) = limit {
            call.arg(limit.to_string());
        }
        let reply = self.call(&call, Op::Read, "keys").await?;
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

/// Pub/sub published by the txn script itself (sharded pub/sub on Cluster),
/// see `changes.rs`: what is published while the subscriber is disconnected
/// is lost, and waiters fall back to polling.
#[async_trait]
impl Changes for RedisBackend {
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        validate_prefix(prefix, &self.options.limits)?;
        self.subscriber.watch(prefix).await
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

/// A record evicted under memory pressure takes its version counter and
/// tombstone with it (docs/shapes.md, Redis).
const STORE_EVICTION: EvictionCheck<'static> = EvictionCheck {
    client: "coord",
    at_risk: "a record evicted takes its version counter, tombstone or fence with it, and \
              a version or fence could be handed out twice",
    override_option: "RedisOptions::allow_eviction when the data can never reach maxmemory",
};

/// Errors that repeating the same call cannot fix.
fn is_permanent(error: &RedisError) -> bool {
    matches!(
        error.kind(),
        ErrorKind::InvalidClientConfig | ErrorKind::AuthenticationFailed
    )
}

/// A client that cannot be built from the URL: the URL is wrong.
fn config_error(endpoint: &str, error: RedisError) -> Error {
    Error::Config(format!("redis URL {endpoint}: {error}"))
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
            coord_backend::redact::url(url.without_namespace())
        )));
    }
    Ok(nodes)
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
}
