use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use coord_backend::Backend;

/// A boxed, sendable future (what [`Case`] runners and factories return).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// How a suite makes backends: given a namespace, a fresh handle on the store
/// under test. Called several times per case (also with the same namespace,
/// when a case needs two clients of one store).
pub type BackendFactory = Arc<
    dyn Fn(String) -> BoxFuture<'static, coord_backend::Result<Arc<dyn Backend>>> + Send + Sync,
>;

/// Build a [`BackendFactory`] from an async closure.
pub fn factory<F, Fut>(make: F) -> BackendFactory
where
    F: Fn(String) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = coord_backend::Result<Arc<dyn Backend>>> + Send + 'static,
{
    Arc::new(move |namespace| Box::pin(make(namespace)))
}

/// Why a check failed: a contract violation or a store error, with context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// What went wrong.
    pub message: String,
}

impl Failure {
    /// A contract violation.
    pub fn new(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

impl From<coord_backend::Error> for Failure {
    fn from(error: coord_backend::Error) -> Self {
        // Store errors are failures of the check, never "losers" of a race.
        Failure::new(format!("store error: {error}"))
    }
}

/// What a check returns: `Ok(())` when the contract held.
pub type CheckResult = Result<(), Failure>;

/// Fail the check with a formatted message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::Failure::new(format!($($fmt)+)));
        }
    };
}

/// One named check of a suite, runnable against any factory.
#[derive(Clone)]
pub struct Case {
    /// The suite it belongs to (`backend`, `lock`, `board`, `sideeffect`, `scheduler`).
    pub suite: &'static str,
    /// The check's name (also its test name).
    pub name: &'static str,
    /// Run the check.
    pub run: fn(BackendFactory) -> BoxFuture<'static, CheckResult>,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Case({}::{})", self.suite, self.name)
    }
}

/// The result of one case, for tables.
#[derive(Debug, Clone)]
pub struct CaseReport {
    /// The suite.
    pub suite: &'static str,
    /// The case.
    pub name: &'static str,
    /// The outcome.
    pub result: CheckResult,
    /// How long it took.
    pub elapsed: std::time::Duration,
}

/// Await a racing task: its panic fails the check, naming `who`.
pub(crate) async fn joined<T>(
    task: tokio::task::JoinHandle<T>,
    who: impl fmt::Display,
) -> Result<T, Failure> {
    task.await
        .map_err(|e| Failure::new(format!("{who} panicked: {e}")))
}

/// A namespace no other run has used: `t<random>-<label>` (labels are cut to fit).
pub fn unique_namespace(label: &str) -> String {
    let label: String = label
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(40)
        .collect();
    format!("t{:016x}-{label}", rand::random::<u64>())
}

/// Run the case called `name` from `cases`, panicking with its failure (for `#[test]`s).
pub async fn run_case(cases: &[Case], name: &str, factory: BackendFactory) {
    let case = cases
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case named {name}"));
    if let Err(failure) = (case.run)(factory).await {
        panic!("{}::{} failed: {failure}", case.suite, case.name);
    }
}

/// Run every case one after another, calling `progress` after each.
pub async fn run_cases(
    cases: &[Case],
    factory: BackendFactory,
    mut progress: impl FnMut(&CaseReport),
) -> Vec<CaseReport> {
    let mut reports = Vec::new();
    for case in cases {
        let started = std::time::Instant::now();
        let result = (case.run)(factory.clone()).await;
        let report = CaseReport {
            suite: case.suite,
            name: case.name,
            result,
            elapsed: started.elapsed(),
        };
        progress(&report);
        reports.push(report);
    }
    reports
}

/// The value of a test-server variable such as `COORD_TEST_REDIS_URL`.
///
/// When it is unset this prints a loud `SKIPPED` line and returns `None`,
/// unless `COORD_REQUIRE_SERVERS=1` (set by CI), where a missing server is a
/// failure and this panics.
pub fn server_env(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ => {
            if std::env::var("COORD_REQUIRE_SERVERS").as_deref() == Ok("1") {
                panic!("{var} is unset but COORD_REQUIRE_SERVERS=1: a skipped store is a failure");
            }
            eprintln!("SKIPPED: {var} is unset; the tests of this store did not run");
            None
        }
    }
}

/// What a suite's checks run against, built for one case from the
/// factory of the store under test (the default template of
/// [`__define_suite!`](crate::__define_suite)): the factory itself, or a
/// recipe environment over it in a namespace named after the case.
pub(crate) trait SuiteEnv {
    /// The environment of the case called `name`.
    fn for_case(factory: BackendFactory, name: &'static str) -> Self;
}

impl SuiteEnv for BackendFactory {
    fn for_case(factory: BackendFactory, _name: &'static str) -> Self {
        factory
    }
}

/// The recipe environments, each built by its `generic(factory, label)`.
macro_rules! generic_envs {
    ($($env:ty),* $(,)?) => {
        $(impl SuiteEnv for $env {
            fn for_case(factory: BackendFactory, name: &'static str) -> Self {
                <$env>::generic(factory, name)
            }
        })*
    };
}

generic_envs!(
    crate::lock::LockEnv,
    crate::board::BoardEnv,
    crate::rwlock::RwEnv,
    crate::election::ElectionEnv,
    crate::fair_lock::FairEnv,
    crate::semaphore::SemEnv,
);
