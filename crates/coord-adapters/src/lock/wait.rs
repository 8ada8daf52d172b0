//! Waiting for a lock: watch, try, then sleep until a change or an
//! exponential backoff with jitter (the fallback poll), until a timeout.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::wake::{Deadline, Wake};

use super::{validate_lock_input, Lock, LockError, LockHandle};

/// How [`LockExt::lock_with`] waits.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct WaitOptions {
    /// Give up with [`LockError::Timeout`] after this long (real time).
    pub timeout: Duration,
    /// Pause after the first refusal; doubles after each further one.
    pub base_backoff: Duration,
    /// Longest pause between attempts.
    pub max_backoff: Duration,
}

impl WaitOptions {
    /// The deadline of a wait that starts now.
    pub(crate) fn deadline_from(&self, started: Instant) -> Instant {
        crate::wake::later(started, self.timeout)
    }

    /// Wait up to `timeout` with the default backoff (10 ms doubling up to 500 ms).
    pub fn with_timeout(timeout: Duration) -> Self {
        WaitOptions {
            timeout,
            base_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(500),
        }
    }

    /// Another backoff: first pause `base`, doubling up to `max`.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.base_backoff = base;
        self.max_backoff = max.max(base);
        self
    }

    /// The pause after `refusals` refusals: "equal jitter" (half fixed, half
    /// random) so waiters spread out but never spin.
    pub(crate) fn pause(&self, refusals: u32) -> Duration {
        let cap = self
            .base_backoff
            .saturating_mul(1u32 << refusals.saturating_sub(1).min(20))
            .min(self.max_backoff);
        cap / 2 + (cap / 2).mul_f64(crate::jitter::unit())
    }
}

/// What Redisson / etcd / Curator users expect on top of [`Lock`]; usable with any lock.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::lock::{GenericLock, Lock, LockError, LockExt};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let lock: Arc<dyn Lock> = Arc::new(GenericLock::new(Arc::new(SingleProcessMemoryBackend::new("demo")?)));
/// let ttl = Duration::from_secs(30);
/// let held = lock.lock("nightly", ttl, Duration::from_secs(1)).await?;
/// // Someone holds it, and keeps it: the waiting call gives up after its timeout.
/// let waited = lock.lock("nightly", ttl, Duration::from_millis(50)).await;
/// assert!(matches!(waited, Err(LockError::Timeout { .. })));
/// lock.release(held).await?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[async_trait]
pub trait LockExt: Lock {
    /// Wait until `key` is free and take it for `ttl`, retrying with
    /// exponential backoff and jitter; give up with [`LockError::Timeout`]
    /// after `timeout`. Contention (an attempt whose every txn lost its
    /// race) is waited through like a refusal; any other store error ends
    /// the wait at once (the caller should see it).
    async fn lock(
        &self,
        key: &str,
        ttl: Duration,
        timeout: Duration,
    ) -> Result<LockHandle, LockError> {
        self.lock_with(key, ttl, &WaitOptions::with_timeout(timeout))
            .await
    }

    /// [`LockExt::lock`] with explicit [`WaitOptions`] (calls [`Lock::wait_lock`]).
    async fn lock_with(
        &self,
        key: &str,
        ttl: Duration,
        wait: &WaitOptions,
    ) -> Result<LockHandle, LockError> {
        self.wait_lock(key, ttl, wait).await
    }
}

/// The default [`Lock::wait_lock`] (for wrappers that forward the other
/// methods and want the default waiting): watch first, then try, then sleep until
/// a change under the watch or the backoff pause, whichever comes first.
pub async fn retry_until_free<L: Lock + ?Sized>(
    lock: &L,
    key: &str,
    ttl: Duration,
    wait: &WaitOptions,
) -> Result<LockHandle, LockError> {
    validate_lock_input(key, ttl)?;
    wait_for(key, wait, lock.watch_key(key), || lock.try_lock(key, ttl)).await
}

/// Wait as `wait` says for `attempt` on `key` to answer `Some`: the
/// deadline counts from now, `watch` is set before the first attempt (a
/// release after it wakes the waiter), then [`Wake::retry`] with `wait`'s
/// backoff, until [`LockError::Timeout`].
pub(crate) async fn wait_for<T, Fut>(
    key: &str,
    wait: &WaitOptions,
    watch: impl Future<Output = Wake>,
    attempt: impl FnMut() -> Fut,
) -> Result<T, LockError>
where
    Fut: Future<Output = Result<Option<T>, LockError>>,
{
    let deadline = Deadline::after(wait.timeout);
    // Subscribe before the first read: a release after it wakes us.
    let mut wake = watch.await;
    wake.retry(
        deadline,
        |refusals| wait.pause(refusals),
        attempt,
        |waited| LockError::Timeout {
            key: key.to_owned(),
            waited,
        },
    )
    .await
}

impl<L: Lock + ?Sized> LockExt for L {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_stays_within_its_cap() {
        let wait = WaitOptions::with_timeout(Duration::from_secs(1))
            .with_backoff(Duration::from_millis(8), Duration::from_millis(100));
        for refusals in 1..40 {
            let pause = wait.pause(refusals);
            let cap =
                Duration::from_millis(8 << (refusals - 1).min(20)).min(Duration::from_millis(100));
            assert!(
                pause >= cap / 2 && pause <= cap,
                "{refusals}: {pause:?} vs cap {cap:?}"
            );
        }
    }
}
