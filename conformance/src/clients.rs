//! What the recipe suites (read-write lock, semaphore, election, board) run
//! against: a factory of clients of the recipe under test (each call a
//! separate client, as another process would hold) and the `ManualClock`
//! they judge expiry with, so expiry checks never sleep.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use coord_adapters::board::{Board, BoardAdapter, BoardError, BoardOptions};
use coord_adapters::election::{
    Election, ElectionError, ElectionOptions, GenericElection, Leadership,
};
use coord_adapters::lock::{GenericSemaphore, LockError, LockHandle, Semaphore, SemaphoreOptions};
use coord_adapters::rwlock::{GenericRwLock, RwHandle, RwLock, RwLockOptions};
use coord_backend::{Backend, ManualClock};

use crate::{unique_namespace, BackendFactory, BoxFuture, CheckResult, Failure};

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

/// `generic(factory, label)` of each recipe environment whose adapter is
/// built as `Adapter::with_options(backend, Options::default().with_clock(clock))`.
macro_rules! generic_envs {
    ($($client:ident, $error:ident: $adapter:ident($options:ident);)*) => {
        $(impl ClientEnv<dyn $client, $error> {
            #[doc = concat!("[`", stringify!($adapter), "`]s over backends from `factory` (one fresh namespace named")]
            /// after `label`), all judging expiry with one shared `ManualClock`.
            pub fn generic(factory: BackendFactory, label: &str) -> Self {
                Self::over_backends(factory, label, |backend, clock| {
                    let options = $options::default().with_clock(clock);
                    Arc::new($adapter::with_options(backend, options)) as Arc<dyn $client>
                })
            }
        })*
    };
}

generic_envs! {
    Board, BoardError: BoardAdapter(BoardOptions);
    Election, ElectionError: GenericElection(ElectionOptions);
    RwLock, LockError: GenericRwLock(RwLockOptions);
    Semaphore, LockError: GenericSemaphore(SemaphoreOptions);
}

/// A key (or name) no other check uses: `label` and a random suffix.
pub(crate) fn key(label: &str) -> String {
    format!("{label}-{:016x}", rand::random::<u64>())
}

/// A grant of a recipe under test (a lock handle, which is also a
/// semaphore's permit; a read-write handle; a leadership), as the checks name it in their failures.
pub(crate) trait Grant {
    /// What a refusal is called where this grant was due.
    const REFUSED: &'static str;
    /// This grant, where a refusal was due.
    fn unexpected(&self) -> String;
}

macro_rules! grants {
    ($($grant:ty: $refused:literal, |$h:ident| $unexpected:expr;)*) => {
        $(impl Grant for $grant {
            const REFUSED: &'static str = $refused;
            fn unexpected(&self) -> String {
                let $h = self;
                $unexpected
            }
        })*
    };
}

grants! {
    LockHandle: "refused, expected a grant", |h| format!("granted (fence {}), expected a refusal", h.fence());
    RwHandle: "refused, expected a grant", |h| format!("granted ({:?} fence {}), expected a refusal", h.mode(), h.fence());
    Leadership: "refused, expected to lead", |l| format!("leads (term {}), expected a refusal", l.term());
}

/// `Some(grant)`, or a failure saying what came instead.
pub(crate) fn granted<G: Grant, E: fmt::Display>(
    answer: Result<Option<G>, E>,
    what: &str,
) -> Result<G, Failure> {
    match answer {
        Ok(Some(grant)) => Ok(grant),
        Ok(None) => Err(Failure::new(format!("{what}: {}", G::REFUSED))),
        Err(e) => Err(Failure::new(format!("{what}: {e}"))),
    }
}

/// `None` (refused), or a failure saying what came instead.
pub(crate) fn refused<G: Grant, E: fmt::Display>(
    answer: Result<Option<G>, E>,
    what: &str,
) -> CheckResult {
    match answer {
        Ok(None) => Ok(()),
        Ok(Some(grant)) => Err(Failure::new(format!("{what}: {}", grant.unexpected()))),
        Err(e) => Err(Failure::new(format!("{what}: {e}"))),
    }
}

/// An error of a recipe that can say "the caller no longer holds it".
pub(crate) trait LostError: fmt::Debug {
    /// The holder lost what it held.
    fn is_lost(&self) -> bool;
}

impl LostError for LockError {
    fn is_lost(&self) -> bool {
        LockError::is_lost(self)
    }
}

impl LostError for ElectionError {
    fn is_lost(&self) -> bool {
        ElectionError::is_lost(self)
    }
}

/// `Err(Lost)`, or a failure saying what came instead.
pub(crate) fn lost<E: LostError>(answer: Result<(), E>, what: &str) -> CheckResult {
    match answer {
        Err(e) if e.is_lost() => Ok(()),
        other => Err(Failure::new(format!(
            "{what}: expected Lost, got {other:?}"
        ))),
    }
}
