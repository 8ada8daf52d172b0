//! Waiting for a change, with a fallback poll: the one place adapters turn a
//! store's optional change notifications ([`coord_backend::Changes`]) into
//! sleeps.
//!
//! A wake-up is a hint: whoever wakes re-reads and decides through the CAS
//! engine as always. A store without notifications, a watch that cannot
//! start and a watch that breaks all degrade to plain sleeps until the
//! caller's deadline (the fallback poll), so a lost notification costs
//! latency, never correctness.

use std::future::Future;
use std::time::Duration;

use coord_backend::{Backend, ChangeWatch};
use tokio::time::Instant;

/// A watch on one prefix, or nothing (then every wait is a plain sleep).
///
/// Watch first, read second, wait third: a change committed after
/// [`Wake::watch`] returned ends the next [`Wake::until`] early.
#[derive(Debug, Default)]
pub struct Wake {
    watch: Option<Box<dyn ChangeWatch>>,
}

impl Wake {
    /// Watch keys under `prefix` when `backend` offers change notifications;
    /// otherwise (or when the watch cannot start) waits are plain sleeps.
    pub async fn watch(backend: &dyn Backend, prefix: &str) -> Wake {
        let watch = match backend.changes() {
            Some(changes) => match changes.watch(prefix).await {
                Ok(watch) => Some(watch),
                Err(error) => {
                    tracing::debug!(%error, "change watch failed to start: polling instead");
                    None
                }
            },
            None => None,
        };
        Wake { watch }
    }

    /// No watch: every wait sleeps until its deadline.
    pub fn polling() -> Wake {
        Wake { watch: None }
    }

    /// Whether a live watch backs the waits.
    pub fn is_watching(&self) -> bool {
        self.watch.is_some()
    }

    /// Sleep until the watch reports a change (`true`) or until `deadline`
    /// (`false`), whichever comes first. A watch that breaks is dropped and
    /// this call sleeps out its deadline; later calls are plain sleeps.
    pub async fn until(&mut self, deadline: Instant) -> bool {
        let Some(watch) = self.watch.as_mut() else {
            tokio::time::sleep_until(deadline).await;
            return false;
        };
        tokio::select! {
            changed = watch.changed() => match changed {
                Ok(()) => true,
                Err(error) => {
                    tracing::debug!(%error, "change watch broke: polling instead");
                    self.watch = None;
                    tokio::time::sleep_until(deadline).await;
                    false
                }
            },
            () = tokio::time::sleep_until(deadline) => false,
        }
    }
}

/// When a waiting call started and when it gives up.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// When the call started (real, monotonic time).
    pub started: Instant,
    /// When it gives up.
    pub at: Instant,
}

impl Deadline {
    /// A wait of `timeout` starting now.
    pub fn after(timeout: Duration) -> Deadline {
        let started = Instant::now();
        Deadline {
            started,
            at: started + timeout,
        }
    }
}

impl Wake {
    /// The waiting loop of every recipe: `attempt` until it answers
    /// `Some`, sleeping after the n-th refusal until a change under this
    /// watch or `pause(n)`, whichever comes first. The last attempt happens
    /// at the deadline, not a pause after it; then `timed_out(waited)`. An
    /// error of `attempt` ends the wait at once (it is not contention).
    pub async fn retry<T, E, Fut>(
        &mut self,
        deadline: Deadline,
        pause: impl Fn(u32) -> Duration,
        mut attempt: impl FnMut() -> Fut,
        timed_out: impl FnOnce(Duration) -> E,
    ) -> Result<T, E>
    where
        Fut: Future<Output = Result<Option<T>, E>>,
    {
        let mut refusals = 0u32;
        loop {
            if let Some(answer) = attempt().await? {
                return Ok(answer);
            }
            let now = Instant::now();
            if now >= deadline.at {
                return Err(timed_out(now - deadline.started));
            }
            refusals += 1;
            self.until((now + pause(refusals)).min(deadline.at)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn without_a_watch_it_sleeps_to_the_deadline() {
        let mut wake = Wake::polling();
        assert!(!wake.is_watching());
        let deadline = Instant::now() + Duration::from_millis(20);
        assert!(!wake.until(deadline).await);
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test]
    async fn retry_tries_until_an_answer_or_the_deadline() {
        let mut wake = Wake::polling();
        let mut tries = 0;
        let answer: Result<u32, String> = wake
            .retry(
                Deadline::after(Duration::from_secs(5)),
                |_| Duration::from_millis(1),
                || {
                    tries += 1;
                    let now = tries;
                    async move { Ok((now == 3).then_some(now)) }
                },
                |_| "timed out".to_owned(),
            )
            .await;
        assert_eq!(answer, Ok(3));

        let deadline = Deadline::after(Duration::from_millis(30));
        let never: Result<u32, Duration> = wake
            .retry(
                deadline,
                |_| Duration::from_millis(5),
                || async { Ok(None) },
                |waited| waited,
            )
            .await;
        assert!(never.unwrap_err() >= Duration::from_millis(30));
    }
}
