//! Change notifications: an optional store capability that lets a waiter
//! sleep until something it cares about may have changed, instead of
//! polling on a timer.
//!
//! # Contract
//!
//! - A notification is a **wake-up, never a fact**. It says "something under
//!   this prefix may have changed": the waiter re-reads (snapshot) and decides
//!   through an asserted txn as always. Spurious wake-ups are allowed.
//! - **Subscribe, then read.** A change committed after [`Changes::watch`]
//!   returned is reported by that watch (unless the store loses it: see
//!   below), so a waiter that watches first, reads second and then waits
//!   cannot sleep through the change that frees it.
//! - **A lost notification costs latency, never correctness.** Pub/sub
//!   channels drop messages on reconnects, a server may restart, a watch may
//!   break: waiters always bound their sleep by a fallback poll interval.
//!   [`ChangeWatch::changed`] returning an error means the watch is broken
//!   for good: poll from then on, or watch again.
//! - A store without the capability answers `None` from
//!   [`crate::Backend::changes`]; callers poll.
//!
//! Which stores offer it, and how, is in docs/shapes.md.

use std::fmt::Debug;

use async_trait::async_trait;

use crate::Result;

/// Watch for changes under key prefixes of one backend's namespace.
#[async_trait]
pub trait Changes: Send + Sync + Debug {
    /// Start watching every key that starts with `prefix` (relative to the
    /// namespace, literal like [`crate::Backend::keys`]' prefix; `""` is the
    /// whole namespace). Every change committed after this returns is
    /// reported through the watch, at least once, unless the store loses it
    /// (see the module docs).
    async fn watch(&self, prefix: &str) -> Result<Box<dyn ChangeWatch>>;
}

/// One live watch; dropping it ends the subscription.
#[async_trait]
pub trait ChangeWatch: Send + Debug {
    /// Wait until something under the watched prefix may have changed since
    /// the watch began or since the previous call returned. Several changes
    /// may be folded into one wake-up; a wake-up may be spurious. An error
    /// means the watch broke: the caller polls (or watches again).
    async fn changed(&mut self) -> Result<()>;
}

/// What one notification says may have changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Changed {
    /// These keys (relative to the namespace) were written.
    Keys(std::sync::Arc<[String]>),
    /// Anything may have changed: the notification carried no key list, or
    /// notifications may have been lost (a reconnect, an overflow).
    Anything,
}

impl Changed {
    /// Decode a notification payload listing keys separated by `separator`
    /// (which no key may contain); an empty payload says [`Changed::Anything`].
    pub fn from_payload(payload: &str, separator: char) -> Changed {
        if payload.is_empty() {
            return Changed::Anything;
        }
        Changed::Keys(payload.split(separator).map(str::to_owned).collect())
    }

    /// Whether a watch on `prefix` must wake for this notification.
    pub fn concerns(&self, prefix: &str) -> bool {
        match self {
            Changed::Keys(keys) => keys.iter().any(|k| k.starts_with(prefix)),
            Changed::Anything => true,
        }
    }
}

/// An in-process fan-out of notifications to [`ChangeWatch`]es filtered by
/// prefix: what a store's one listener (a pub/sub subscriber, a `LISTEN`
/// connection, a commit path in memory) publishes into and its watches read.
///
/// A watch that falls more than a few hundred notifications behind skips
/// them and wakes once (they fold into one wake-up, as the contract allows).
/// When every clone of the feed is dropped, its watches' next
/// [`ChangeWatch::changed`] fails (the watch broke: callers poll).
#[derive(Clone, Debug)]
pub struct ChangeFeed {
    sender: tokio::sync::broadcast::Sender<Changed>,
}

impl Default for ChangeFeed {
    fn default() -> Self {
        ChangeFeed::new()
    }
}

impl ChangeFeed {
    /// How many notifications a slow watch may lag before they fold into one wake-up.
    const CAPACITY: usize = 256;

    /// A feed nobody watches yet.
    pub fn new() -> ChangeFeed {
        ChangeFeed {
            sender: tokio::sync::broadcast::Sender::new(Self::CAPACITY),
        }
    }

    /// Tell every watch of this feed (those whose prefix it concerns wake).
    pub fn publish(&self, changed: Changed) {
        // No watch at all is not an error: there is nobody to wake.
        let _ = self.sender.send(changed);
    }

    /// A watch of keys under `prefix`: reports what is published after this returns.
    pub fn watch(&self, prefix: &str) -> Box<dyn ChangeWatch> {
        Box::new(FeedWatch {
            prefix: prefix.to_owned(),
            receiver: self.sender.subscribe(),
        })
    }

    /// How many watches of this feed are alive.
    pub fn watchers(&self) -> usize {
        self.sender.receiver_count()
    }

    /// Whether `other` is a clone of this feed.
    pub fn same(&self, other: &ChangeFeed) -> bool {
        self.sender.same_channel(&other.sender)
    }
}

/// A watch on a [`ChangeFeed`].
struct FeedWatch {
    prefix: String,
    receiver: tokio::sync::broadcast::Receiver<Changed>,
}

impl Debug for FeedWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedWatch")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl ChangeWatch for FeedWatch {
    async fn changed(&mut self) -> Result<()> {
        use tokio::sync::broadcast::error::RecvError;
        loop {
            match self.receiver.recv().await {
                Ok(changed) if changed.concerns(&self.prefix) => return Ok(()),
                Ok(_) => {}
                // Skipped notifications may have concerned this prefix.
                Err(RecvError::Lagged(_)) => return Ok(()),
                Err(RecvError::Closed) => {
                    return Err(crate::Error::Unavailable {
                        message: "the store's change notifications ended".to_owned(),
                        source: None,
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_feed_wakes_watches_of_matching_prefixes() {
        let feed = ChangeFeed::new();
        let mut a = feed.watch("a/");
        let mut all = feed.watch("");
        assert_eq!(feed.watchers(), 2);
        feed.publish(Changed::from_payload("b/1\na/x", '\n'));
        a.changed().await.unwrap();
        all.changed().await.unwrap();
        feed.publish(Changed::from_payload("b/2", '\n'));
        feed.publish(Changed::from_payload("", '\n'));
        // `b/2` does not concern `a/`; the empty payload (anything) does.
        a.changed().await.unwrap();
        drop(all);
        assert_eq!(feed.watchers(), 1);
        drop(feed);
        assert!(a.changed().await.is_err());
    }
}
