//! Waiting for a change, with a fallback poll: the one place adapters turn a
//! store's optional change notifications ([`coord_backend::Changes`]) into
//! sleeps.
//!
//! A wake-up is a hint: whoever wakes re-reads and decides through the CAS
//! engine as always. A store without notifications, a watch that cannot
//! start and a watch that breaks all degrade to plain sleeps until the
//! caller's deadline (the fallback poll), so a lost notification costs
//! latency, never correctness.
//!
//! One watch error is not degraded: [`coord_backend::Error::Unsupported`]
//! says the backend cannot wait at all (a backend bound to a caller's SQL
//! transaction, which holds locks the awaited change would need). Every
//! wait on such a [`Wake`] fails with that error, so a call that would have
//! to wait is refused instead of sleeping out its timeout; a call that
//! succeeds at once never waits and still works.

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
    /// Why this backend cannot wait, when it said so.
    refused: Option<WaitRefused>,
}

/// What a backend said when it refused to wait: kept to answer every wait.
#[derive(Debug)]
struct WaitRefused {
    what: &'static str,
    store: &'static str,
}

impl Wake {
    /// Watch keys under `prefix` when `backend` offers change notifications;
    /// otherwise (or when the watch cannot start) waits are plain sleeps.
    pub async fn watch(backend: &dyn Backend, prefix: &str) -> Wake {
        let mut refused = None;
        let watch = match backend.changes() {
            Some(changes) => match changes.watch(prefix).await {
                Ok(watch) => Some(watch),
                Err(coord_backend::Error::Unsupported { what, store }) => {
                    refused = Some(WaitRefused { what, store });
                    None
                }
                Err(error) => {
                    tracing::debug!(%error, "change watch failed to start: polling instead");
                    None
                }
            },
            None => None,
        };
        Wake { watch, refused }
    }

    /// No watch: every wait sleeps until its deadline.
    pub fn polling() -> Wake {
        Wake {
            watch: None,
            refused: None,
        }
    }

    /// Whether a live watch backs the waits.
    pub fn is_watching(&self) -> bool {
        self.watch.is_some()
    }

    /// Sleep until the watch reports a change (`Ok(true)`) or until
    /// `deadline` (`Ok(false)`), whichever comes first. A watch that breaks
    /// is dropped and this call sleeps out its deadline; later calls are
    /// plain sleeps. A backend that refused to wait (see the module docs):
    /// its [`coord_backend::Error::Unsupported`] at once, no sleep.
    pub async fn until(&mut self, deadline: Instant) -> coord_backend::Result<bool> {
        if let Some(refused) = &self.refused {
            return Err(coord_backend::Error::Unsupported {
                what: refused.what,
                store: refused.store,
            });
        }
        let Some(watch) = self.watch.as_mut() else {
            tokio::time::sleep_until(deadline).await;
            return Ok(false);
        };
        // Biased: a change that arrived by the deadline is reported (and
        // consumed) rather than left for the next wait; and a random pick
        // would make a seeded simulation run differ from its replay.
        tokio::select! {
            biased;
            changed = watch.changed() => match changed {
                Ok(()) => Ok(true),
                Err(error) => {
                    tracing::debug!(%error, "change watch broke: polling instead");
                    self.watch = None;
                    tokio::time::sleep_until(deadline).await;
                    Ok(false)
                }
            },
            () = tokio::time::sleep_until(deadline) => Ok(false),
        }
    }
}

/// What a waiting call keeps waiting through: contention (every txn of an
/// attempt lost its race to other writers) is no failure of the store, so it
/// counts as a refusal; any other error ends the wait.
pub trait WaitError {
    /// Whether the error is contention, not a failure.
    fn is_contention(&self) -> bool;

    /// Whether a txn of the call was sent and its outcome is unknown: a
    /// grant it carried may have landed (or may still land), so a caller
    /// that got this error withdraws the grant it offered.
    fn is_indeterminate(&self) -> bool {
        false
    }
}

/// The store-error conversions of an adapter error with `Invalid(InvalidInput)`
/// and `Store(coord_backend::Error)` variants: `From<coord_backend::Error>`
/// (the store refusing the input itself, e.g. a key over its limit, is
/// `Invalid`; any other error is `Store`) and, with `waits`, [`WaitError`]
/// (a `Store(ConflictRetriesExhausted)` is contention).
macro_rules! store_errors {
    ($error:ident) => {
        impl From<coord_backend::Error> for $error {
            fn from(error: coord_backend::Error) -> Self {
                match error {
                    coord_backend::Error::InvalidInput(invalid) => $error::Invalid(invalid),
                    other => $error::Store(other),
                }
            }
        }
    };
    ($error:ident, waits) => {
        $crate::wake::store_errors!($error);

        impl $crate::wake::WaitError for $error {
            /// Every txn of the attempt lost its race: a waiting call waits on.
            fn is_contention(&self) -> bool {
                matches!(
                    self,
                    $error::Store(coord_backend::Error::ConflictRetriesExhausted { .. })
                )
            }

            /// A txn's answer was lost: `Store(Indeterminate)`.
            fn is_indeterminate(&self) -> bool {
                matches!(self, $error::Store(error) if error.is_indeterminate())
            }
        }
    };
}
pub(crate) use store_errors;

/// As good as never: what [`later`] adds when a length of time does not fit
/// (30 years, as tokio's own "far future").
pub const FOREVER: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `from + by`, or `from` + [`FOREVER`] when `by` is longer: a timeout or
/// TTL of [`Duration::MAX`] ("wait forever", "hold until released") never
/// overflows an instant.
pub fn later(from: Instant, by: Duration) -> Instant {
    from + by.min(FOREVER)
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
            at: later(started, timeout),
        }
    }
}

impl Wake {
    /// The waiting loop of every recipe: `attempt` until it answers
    /// `Some`, sleeping after the n-th refusal until a change under this
    /// watch or `pause(n)`, whichever comes first. The last attempt happens
    /// at the deadline, not a pause after it; then `timed_out(waited)`.
    /// Contention ([`WaitError::is_contention`]) is a refusal; any other
    /// error of `attempt` ends the wait at once, as does a backend that
    /// refuses to wait (its error, after the first refusal).
    pub async fn retry<T, E, Fut>(
        &mut self,
        deadline: Deadline,
        pause: impl Fn(u32) -> Duration,
        mut attempt: impl FnMut() -> Fut,
        timed_out: impl FnOnce(Duration) -> E,
    ) -> Result<T, E>
    where
        E: WaitError + From<coord_backend::Error>,
        Fut: Future<Output = Result<Option<T>, E>>,
    {
        let mut refusals = 0u32;
        loop {
            match attempt().await {
                Ok(Some(answer)) => return Ok(answer),
                Ok(None) => {}
                Err(error) if error.is_contention() => {}
                Err(error) => return Err(error),
            }
            let now = Instant::now();
            if now >= deadline.at {
                return Err(timed_out(now - deadline.started));
            }
            refusals += 1;
            self.until(later(now, pause(refusals)).min(deadline.at))
                .await?;
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
        assert!(!wake.until(deadline).await.unwrap());
        assert!(Instant::now() >= deadline);
    }

    #[derive(Debug, PartialEq)]
    enum Probe {
        Busy,
        Broken,
        TimedOut(Duration),
        Refused(String),
    }

    impl From<coord_backend::Error> for Probe {
        fn from(error: coord_backend::Error) -> Self {
            Probe::Refused(error.to_string())
        }
    }

    impl WaitError for Probe {
        fn is_contention(&self) -> bool {
            *self == Probe::Busy
        }
    }

    #[tokio::test]
    async fn retry_waits_through_refusals_and_contention_until_an_answer() {
        let mut wake = Wake::polling();
        let mut tries = 0;
        let answer = wake
            .retry(
                Deadline::after(Duration::from_secs(5)),
                |_| Duration::from_millis(1),
                || {
                    tries += 1;
                    let now = tries;
                    async move {
                        match now {
                            1 => Ok(None),
                            2 => Err(Probe::Busy),
                            _ => Ok(Some(now)),
                        }
                    }
                },
                Probe::TimedOut,
            )
            .await;
        assert_eq!(answer, Ok(3));
    }

    #[tokio::test]
    async fn retry_ends_on_a_failure_or_at_the_deadline() {
        let mut wake = Wake::polling();
        let pause = |_| Duration::from_millis(5);
        let soon = Deadline::after(Duration::from_secs(5));
        let broken: Result<u32, Probe> = wake
            .retry(
                soon,
                pause,
                || async { Err(Probe::Broken) },
                Probe::TimedOut,
            )
            .await;
        assert_eq!(broken, Err(Probe::Broken));
        let deadline = Deadline::after(Duration::from_millis(30));
        let never: Result<u32, Probe> = wake
            .retry(deadline, pause, || async { Ok(None) }, Probe::TimedOut)
            .await;
        assert!(
            matches!(never, Err(Probe::TimedOut(waited)) if waited >= Duration::from_millis(30))
        );
    }

    /// A memory store whose change watches refuse: what a backend bound to
    /// a caller's transaction says.
    #[derive(Debug)]
    struct RefusesWaits(coord_memory::SingleProcessMemoryBackend);

    #[async_trait::async_trait]
    impl coord_backend::Changes for RefusesWaits {
        async fn watch(&self, _prefix: &str) -> coord_backend::Result<Box<dyn ChangeWatch>> {
            Err(coord_backend::Error::Unsupported {
                what: "waiting in this test",
                store: "refuses-waits",
            })
        }
    }

    #[async_trait::async_trait]
    impl Backend for RefusesWaits {
        fn namespace(&self) -> &str {
            self.0.namespace()
        }
        fn changes(&self) -> Option<&dyn coord_backend::Changes> {
            Some(self)
        }
        async fn raw_snapshot(
            &self,
            keys: &[&str],
        ) -> coord_backend::Result<Vec<coord_backend::Entry>> {
            self.0.raw_snapshot(keys).await
        }
        async fn raw_txn(
            &self,
            asserts: &[coord_backend::Assert],
            mutations: &[coord_backend::Mutation],
        ) -> coord_backend::Result<coord_backend::TxnOutcome> {
            self.0.raw_txn(asserts, mutations).await
        }
        async fn raw_keys(&self, prefix: &str) -> coord_backend::Result<Vec<String>> {
            self.0.raw_keys(prefix).await
        }
    }

    #[tokio::test]
    async fn a_backend_that_refuses_to_wait_refuses_the_first_wait_only() {
        let store =
            RefusesWaits(coord_memory::SingleProcessMemoryBackend::new("wake-refusal").unwrap());
        let mut wake = Wake::watch(&store, "k").await;
        let long = Deadline::after(Duration::from_secs(60));
        let pause = |_| Duration::from_secs(10);
        // An answer at once: no wait, no refusal.
        let at_once: Result<u32, Probe> = wake
            .retry(long, pause, || async { Ok(Some(7)) }, Probe::TimedOut)
            .await;
        assert_eq!(at_once, Ok(7));
        // A refusal would need a wait: the backend's error, at once.
        let started = Instant::now();
        let waited: Result<u32, Probe> = wake
            .retry(long, pause, || async { Ok(None) }, Probe::TimedOut)
            .await;
        assert!(
            matches!(&waited, Err(Probe::Refused(why)) if why.contains("waiting in this test")),
            "{waited:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(wake.until(long.at).await.is_err());
    }
}
