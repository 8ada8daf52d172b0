//! Change notifications: the txn script publishes the keys it wrote, and one
//! subscriber connection per backend fans them out to its watches.
//!
//! - **Publishing.** The txn script (see `scripts.rs`) ends an applied txn
//!   with `PUBLISH` (standalone) or `SPUBLISH` (Redis Cluster: sharded
//!   pub/sub, Redis ≥ 7) on `coord:{NS}:changes`, whose hash tag puts it on
//!   the namespace's shard. The payload is the written keys separated by NUL
//!   (which no key contains). It runs inside the same script as the write, so
//!   a rejected txn publishes nothing, and a publish that fails is ignored (a
//!   lost wake-up, never a failed txn).
//! - **Subscribing.** The first watch of a backend opens a dedicated
//!   connection (`SUBSCRIBE` on a RESP2/RESP3 pub/sub connection; on Cluster a
//!   RESP3 cluster connection with `SSUBSCRIBE`) and returns once the server
//!   confirmed the subscription; later watches share it. It closes when no
//!   watch is left.
//! - **What can be lost.** Pub/sub is fire-and-forget: messages published
//!   while the subscriber is disconnected are gone. A dropped standalone
//!   subscriber ends its watches (they fail: their waiters poll; the next
//!   watch subscribes again). The cluster connection resubscribes by itself;
//!   a disconnection or resubscription wakes every watch, since something may
//!   have been missed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use coord_backend::{ChangeFeed, ChangeWatch, Changed, Error, Result};
use futures_util::StreamExt;
use redis::cluster::ClusterClientBuilder;
use redis::{ProtocolVersion, PushInfo, PushKind, Value};
use tokio::sync::Mutex;

use crate::backend::Target;

/// How often an idle subscriber checks whether it still has watches.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Where the subscriber connects.
#[derive(Clone)]
pub(crate) enum Source {
    /// One server, or the primary the Sentinels name: `generation` moves
    /// whenever the store's connection was made to a (re)discovered primary.
    Standalone {
        target: Target,
        generation: Arc<AtomicU64>,
    },
    Cluster {
        nodes: Vec<String>,
        connect_timeout: Duration,
    },
}

/// The subscriber of one backend (shared by its clones).
pub(crate) struct Subscriber {
    source: Source,
    /// `coord:{NS}:changes`
    channel: String,
    endpoint: String,
    running: Mutex<Option<ChangeFeed>>,
}

impl Subscriber {
    pub(crate) fn new(source: Source, namespace: &str, endpoint: &str) -> Subscriber {
        Subscriber {
            source,
            channel: channel(namespace),
            endpoint: endpoint.to_owned(),
            running: Mutex::new(None),
        }
    }

    /// `PUBLISH` or `SPUBLISH`: what the txn script sends.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self.source {
            Source::Standalone { .. } => "PUBLISH",
            Source::Cluster { .. } => "SPUBLISH",
        }
    }

    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// A watch on `prefix`; subscribes first when no watch of this backend is live.
    pub(crate) async fn watch(self: &Arc<Self>, prefix: &str) -> Result<Box<dyn ChangeWatch>> {
        let mut running = self.running.lock().await;
        if let Some(feed) = running.as_ref() {
            return Ok(feed.watch(prefix));
        }
        let feed = ChangeFeed::new();
        let watch = feed.watch(prefix);
        let unavailable = |e: redis::RedisError| {
            Error::unavailable(format!("subscribing to changes on {}", self.endpoint), e)
        };
        match &self.source {
            Source::Standalone { target, generation } => {
                // Read before asking where the primary is: a failover found
                // by the store afterwards moves it, and ends this subscriber.
                let subscribed_at = generation.load(Ordering::Acquire);
                let client = target.client().await.map_err(unavailable)?;
                let mut pubsub = client.get_async_pubsub().await.map_err(unavailable)?;
                pubsub.subscribe(&self.channel).await.map_err(unavailable)?;
                let messages = pubsub.into_on_message();
                let feed = feed.clone();
                let this = self.clone();
                let generation = generation.clone();
                let sentinel = matches!(target, Target::Sentinel(_));
                tokio::spawn(async move {
                    let mut messages = messages;
                    loop {
                        if sentinel && generation.load(Ordering::Acquire) != subscribed_at {
                            // The store followed a failover: this connection
                            // may be on the demoted primary. Ending the feed
                            // fails its watches (their waiters poll); the next
                            // watch subscribes on the new primary.
                            tracing::debug!(
                                "redis primary changed: change subscriber ends, watches poll"
                            );
                            break;
                        }
                        tokio::select! {
                            message = messages.next() => match message {
                                Some(message) => feed.publish(Changed::from_payload(
                                    &String::from_utf8_lossy(message.get_payload_bytes()),
                                    '\0',
                                )),
                                None => break,
                            },
                            () = tokio::time::sleep(IDLE_CHECK) => {}
                        }
                        if this.idle(&feed).await {
                            return;
                        }
                    }
                    tracing::debug!(
                        "redis change subscriber disconnected: watches fall back to polling"
                    );
                    this.stop(&feed).await;
                });
            }
            Source::Cluster {
                nodes,
                connect_timeout,
            } => {
                let (sender, mut pushes) = tokio::sync::mpsc::unbounded_channel::<PushInfo>();
                let client = ClusterClientBuilder::new(nodes.clone())
                    .use_protocol(ProtocolVersion::RESP3)
                    .push_sender(sender)
                    .connection_timeout(*connect_timeout)
                    .build()
                    .map_err(unavailable)?;
                let mut connection = client.get_async_connection().await.map_err(unavailable)?;
                connection
                    .ssubscribe(&self.channel)
                    .await
                    .map_err(unavailable)?;
                let feed = feed.clone();
                let this = self.clone();
                tokio::spawn(async move {
                    // Held for as long as the subscription lives.
                    let _connection = connection;
                    loop {
                        tokio::select! {
                            push = pushes.recv() => match push {
                                Some(push) => feed.publish(decode_push(push)),
                                None => break,
                            },
                            () = tokio::time::sleep(IDLE_CHECK) => {}
                        }
                        if this.idle(&feed).await {
                            return;
                        }
                    }
                    this.stop(&feed).await;
                });
            }
        }
        *running = Some(feed);
        Ok(watch)
    }

    /// Whether `feed` has no watch left; if so it is forgotten (watches
    /// subscribe under the same lock, so none can appear meanwhile).
    async fn idle(&self, feed: &ChangeFeed) -> bool {
        if feed.watchers() > 0 {
            return false;
        }
        let mut running = self.running.lock().await;
        if feed.watchers() > 0 {
            return false;
        }
        if running.as_ref().is_some_and(|r| r.same(feed)) {
            *running = None;
        }
        true
    }

    /// Forget `feed`: its subscriber ended (its watches fail once it is dropped).
    async fn stop(&self, feed: &ChangeFeed) {
        let mut running = self.running.lock().await;
        if running.as_ref().is_some_and(|r| r.same(feed)) {
            *running = None;
        }
    }
}

/// The channel of a namespace (hash-tagged like its records).
pub(crate) fn channel(namespace: &str) -> String {
    format!("coord:{{{namespace}}}:changes")
}

/// What a push of the cluster subscriber says.
fn decode_push(push: PushInfo) -> Changed {
    match push.kind {
        PushKind::SMessage => match push.data.get(1) {
            Some(Value::BulkString(payload)) => {
                Changed::from_payload(&String::from_utf8_lossy(payload), '\0')
            }
            _ => Changed::Anything,
        },
        // A (re)subscription or a dropped connection: messages may have been missed.
        _ => Changed::Anything,
    }
}
