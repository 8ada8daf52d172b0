//! What the recipe suites (read-write lock, semaphore, election, board) run
//! against: a factory of clients of the recipe under test (each call a
//! separate client, as another process would hold) and the `ManualClock`
//! they judge expiry with, so expiry checks never sleep.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use coord_backend::{Backend, ManualClock};

use crate::{unique_namespace, BackendFactory, BoxFuture, Failure};

/// Makes a new client of the recipe under test (`T`, failing with `E`).
pub type ClientFactory<T, E> = Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<T>, E>> + Send + Sync>;

/// Build a [`ClientFactory`] from an async closure.
pub fn client_factory<T, E, F, Fut>(make: F) -> ClientFactory<T, E>
where
    T: ?Sized,
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<T>, E>> + Send + 'static,
{
    Arc::new(move || Box::pin(make()))
}

/// What a recipe check runs against.
pub struct ClientEnv<T: ?Sized, E> {
    /// Makes clients of the recipe under test.
    pub make: ClientFactory<T, E>,
    /// The clock every client judges expiry with; checks move it.
    pub clock: Arc<ManualClock>,
}

impl<T: ?Sized, E> Clone for ClientEnv<T, E> {
    fn clone(&self) -> Self {
        ClientEnv {
            make: self.make.clone(),
            clock: self.clock.clone(),
        }
    }
}

impl<T: ?Sized, E> fmt::Debug for ClientEnv<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientEnv")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl<T: ?Sized + 'static, E: From<coord_backend::Error> + fmt::Display + 'static> ClientEnv<T, E> {
    /// An environment for any implementation.
    pub fn new(make: ClientFactory<T, E>, clock: Arc<ManualClock>) -> Self {
        ClientEnv { make, clock }
    }

    /// Clients made by `build` over backends from `factory` (one fresh
    /// namespace named after `label`), all judging expiry with one shared
    /// `ManualClock`.
    pub fn over_backends(
        factory: BackendFactory,
        label: &str,
        build: impl Fn(Arc<dyn Backend>, Arc<ManualClock>) -> Arc<T> + Send + Sync + 'static,
    ) -> Self {
        let clock = Arc::new(ManualClock::at_millis(1_700_000_000_000));
        let namespace = unique_namespace(label);
        let shared = clock.clone();
        let build = Arc::new(build);
        let make = client_factory(move || {
            let (factory, namespace) = (factory.clone(), namespace.clone());
            let (clock, build) = (shared.clone(), build.clone());
            async move { Ok(build(factory(namespace).await?, clock)) }
        });
        ClientEnv::new(make, clock)
    }

    /// A new client, or a failure saying it could not be made.
    pub(crate) async fn client(&self) -> Result<Arc<T>, Failure> {
        (self.make)()
            .await
            .ctx("making a client of the recipe under test")
    }
}

/// Turn any displayable error into a [`Failure`] that says what was being done.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, Failure>;
}

impl<T, E: fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, Failure> {
        self.map_err(|e| Failure::new(format!("{what}: {e}")))
    }
}
