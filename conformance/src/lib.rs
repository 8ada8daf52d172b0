//! Contract suites every coord store (and every adapter) must pass.
//!
//! Each check is a plain `async fn` returning [`CheckResult`]: call it from
//! your own tests against your own backend. Each suite also lists its checks
//! as [`Case`]s (used by `coordctl conformance` to print a table) and has a
//! macro that expands them into one `#[tokio::test]` each:
//!
//! ```ignore
//! // tests/conformance.rs of a store crate (needs tokio with "macros" and "rt-multi-thread")
//! coord_conformance::backend_tests!(coord_conformance::factory(|namespace| async move {
//!     let store = my_store::connect(&namespace).await?;
//!     Ok(std::sync::Arc::new(store) as std::sync::Arc<dyn coord_backend::Backend>)
//! }));
//! ```
//!
//! To run everything on one store, use [`all_suites_tests!`].
//!
//! Every case creates its backends through the factory with a namespace of
//! its own (random per run, see [`unique_namespace`]), so cases run in
//! parallel on one server without seeing each other's keys.
//!
//! A check that cannot fail is a defect: this crate's own tests run each suite
//! against deliberately broken stores and adapters and assert that it fails.

mod harness;

pub mod backend;
pub mod board;
pub mod changes;
pub mod clients;
pub mod election;
pub mod fair_lock;
pub mod fault;
pub mod fault_model;
pub mod faults;
pub mod lock;
pub mod reclaim;
pub mod retention;
pub mod rwlock;
pub mod scheduler;
pub mod semaphore;
pub mod sideeffect;
pub mod simulation;

pub use harness::{
    factory, run_case, run_cases, server_env, unique_namespace, BackendFactory, BoxFuture, Case,
    CaseReport, CheckResult, Failure,
};

#[doc(hidden)]
pub mod __private {
    pub use tokio;
}

/// Every suite of this crate for one store: a module per suite (`backend`,
/// `lock`, `board`, `sideeffect`, `scheduler`, `rwlock`, `election`, `fair_lock`,
/// `semaphore`, `fault_model`, `changes`, `reclaim`, `retention`), each case one `#[tokio::test]`.
///
/// The factory expression is evaluated inside those modules, which import
/// everything of the calling module (`use super::*`), so it may call the
/// caller's private functions. It may be a [`BackendFactory`] or an
/// `Option<BackendFactory>` (`None` = store not configured, cases return early).
#[macro_export]
macro_rules! all_suites_tests {
    ($factory:expr) => {
        mod backend_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::backend_tests!($factory);
        }
        mod lock_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::lock_tests!($factory);
        }
        mod board_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::board_tests!($factory);
        }
        mod sideeffect_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::sideeffect_tests!($factory);
        }
        mod scheduler_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::scheduler_tests!($factory);
        }
        mod rwlock_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::rwlock_tests!($factory);
        }
        mod election_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::election_tests!($factory);
        }
        mod fair_lock_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::fair_lock_tests!($factory);
        }
        mod semaphore_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::semaphore_tests!($factory);
        }
        mod fault_model_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::fault_model_tests!($factory);
        }
        mod changes_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::changes_tests!($factory);
        }
        mod reclaim_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::reclaim_tests!($factory);
        }
        mod retention_suite {
            #[allow(unused_imports)]
            use super::*;
            $crate::retention_tests!($factory);
        }
    };
}

/// Every case of every suite that runs over a backend factory, in suite order.
pub fn all_cases() -> Vec<Case> {
    let mut cases = backend::cases();
    cases.extend(lock::cases());
    cases.extend(board::cases());
    cases.extend(sideeffect::cases());
    cases.extend(scheduler::cases());
    cases.extend(rwlock::cases());
    cases.extend(election::cases());
    cases.extend(fair_lock::cases());
    cases.extend(semaphore::cases());
    cases.extend(fault_model::cases());
    cases.extend(changes::cases());
    cases.extend(reclaim::cases());
    cases.extend(retention::cases());
    cases
}

/// Expand a suite's one list of cases. Each suite writes its list once, in
/// a hidden exported macro that hands it to this one with a mode:
///
/// - `cases "suite"`: the suite's `Vec<Case>`;
/// - `tests CASES_FN, FACTORY; "suite"`: one `#[tokio::test]` per case;
/// - `names [CALLBACK] (ARGS)`: `CALLBACK!(ARGS; name, name, ...)`, for
///   runners of another shape (native locks, side-effect rules).
///
/// The list is `"suite", |factory, check, name| TEMPLATE; case, case => |factory| OVERRIDE, ...`:
/// each case runs `TEMPLATE` with `check` bound to the function of its name
/// and `name` to its name, unless it gives its own `=> |factory| ...`.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite {
    (cases $suite:literal, |$f:ident, $check:ident, $n:ident| $tmpl:expr;
        $($name:ident $(=> |$g:ident| $run:expr)?),* $(,)?) => {
        vec![$($crate::__case!($suite, |$f, $check, $n| $tmpl; $name $(=> |$g| $run)?)),*]
    };
    (tests $cases:path, $factory:expr; $suite:literal, |$f:ident, $check:ident, $n:ident| $tmpl:expr;
        $($name:ident $(=> |$g:ident| $run:expr)?),* $(,)?) => {
        $crate::__cases_as_tests! { $cases, $factory; $($name),* }
    };
    (names [$($cb:tt)*] ($($args:tt)*) $suite:literal, |$f:ident, $check:ident, $n:ident| $tmpl:expr;
        $($name:ident $(=> |$g:ident| $run:expr)?),* $(,)?) => {
        $($cb)* ! { $($args)* $($name),* }
    };
}

/// One [`Case`] of a [`__suite!`] list.
#[doc(hidden)]
#[macro_export]
macro_rules! __case {
    ($suite:literal, |$f:ident, $check:ident, $n:ident| $tmpl:expr; $name:ident) => {
        $crate::Case {
            suite: $suite,
            name: stringify!($name),
            run: |$f: $crate::BackendFactory| -> $crate::BoxFuture<'static, $crate::CheckResult> {
                let $check = $name;
                let $n: &'static str = stringify!($name);
                let _ = $n;
                ::std::boxed::Box::pin($tmpl)
            },
        }
    };
    ($suite:literal, |$f:ident, $check:ident, $n:ident| $tmpl:expr; $name:ident => |$g:ident| $run:expr) => {
        $crate::Case {
            suite: $suite,
            name: stringify!($name),
            run: |$g: $crate::BackendFactory| -> $crate::BoxFuture<'static, $crate::CheckResult> {
                ::std::boxed::Box::pin($run)
            },
        }
    };
}

/// Expand a list of case names of one suite into `#[tokio::test]`s.
#[doc(hidden)]
#[macro_export]
macro_rules! __cases_as_tests {
    ($cases:path, $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                // `None` = the store is not configured here (already reported as SKIPPED).
                let factory: ::std::option::Option<$crate::BackendFactory> = ($factory).into();
                let ::std::option::Option::Some(factory) = factory else { return };
                $crate::run_case(&$cases(), stringify!($name), factory).await;
            }
        )*
    };
}
