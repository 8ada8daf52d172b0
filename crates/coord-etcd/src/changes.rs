//! Change notifications on etcd: one Watch stream per namespace, fanned
//! out in-process by key prefix (see the [`Changes`] impl below).

use std::sync::Arc;

use async_trait::async_trait;
use coord_backend::{validate_prefix, ChangeFeed, ChangeWatch, Changed, Changes, Error, Result};
use etcd_client::{WatchOptions, WatchStream};

use crate::errors::Call;
use crate::{run, EtcdBackend};

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
///
/// A delete of a key that is not there is an event only until the
/// namespace's first reclaim (it writes a tombstone); from then on it is a
/// real etcd delete of nothing, which etcd does not report. The `changes`
/// suite asks nothing of such deletes, and no adapter relies on them.
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
