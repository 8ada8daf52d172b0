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
pub mod golden;
pub mod lock;
pub mod outbox;
pub mod queue;
pub mod reclaim;
pub mod retention;
pub mod rwlock;
pub mod scheduler;
pub mod semaphore;
pub mod sideeffect;
pub mod simulation;
pub mod support;

pub(crate) use harness::joined;
pub use harness::{
    factory, run_case, run_cases, server_env, unique_namespace, BackendFactory, BoxFuture, Case,
    CaseReport, CheckResult, Failure,
};

#[doc(hidden)]
pub mod __private {
    pub use tokio;
}

/// Every suite of this crate for one store: a module per suite (`backend`,
/// `lock`, `board`, `queue`, `outbox`, `sideeffect`, `scheduler`, `rwlock`, `election`, `fair_lock`,
/// `semaphore`, `fault_model`, `changes`, `reclaim`, `retention`), each case one `#[tokio::test]`.
///
/// The factory expression is evaluated inside those modules, which import
/// everything of the calling module (`use super::*`), so it may call the
/// caller's private functions. It may be a [`BackendFactory`] or an
/// `Option<BackendFactory>` (`None` = store not configured, cases return early).
#[macro_export]
macro_rules! all_suites_tests {
    ($factory:expr) => {
        $crate::__every_suite!([$crate::__suite_modules] ($factory;));
    };
}

/// Every suite that runs over a backend factory, in suite order, as
/// `MODULE: TEST_MODULE, TESTS_MACRO;`, handed to a callback:
/// `__every_suite!([CALLBACK] (ARGS))` is `CALLBACK!(ARGS suite; suite; ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __every_suite {
    ([$($cb:tt)*] ($($args:tt)*)) => {
        $($cb)* ! { $($args)*
            backend: backend_suite, backend_tests;
            lock: lock_suite, lock_tests;
            board: board_suite, board_tests;
            queue: queue_suite, queue_tests;
            outbox: outbox_suite, outbox_tests;
            sideeffect: sideeffect_suite, sideeffect_tests;
            scheduler: scheduler_suite, scheduler_tests;
            rwlock: rwlock_suite, rwlock_tests;
            election: election_suite, election_tests;
            fair_lock: fair_lock_suite, fair_lock_tests;
            semaphore: semaphore_suite, semaphore_tests;
            fault_model: fault_model_suite, fault_model_tests;
            changes: changes_suite, changes_tests;
            reclaim: reclaim_suite, reclaim_tests;
            retention: retention_suite, retention_tests;
        }
    };
}

/// `mod TEST_MODULE { use super::*; TESTS_MACRO!(FACTORY); }` for each
/// suite (see [`all_suites_tests!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_modules {
    ($factory:expr; $($suite:ident: $module:ident, $tests:ident;)*) => {
        $(
            mod $module {
                #[allow(unused_imports)]
                use super::*;
                $crate::$tests!($factory);
            }
        )*
    };
}

/// The cases of each suite, one after another (see [`all_cases`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __cases_of {
    ($($suite:ident: $module:ident, $tests:ident;)*) => {
        [$($crate::$suite::cases()),*].concat()
    };
}

/// Every case of every suite that runs over a backend factory, in suite order.
pub fn all_cases() -> Vec<Case> {
    crate::__every_suite!([crate::__cases_of]())
}

/// Define one suite from its one list of cases. Each suite writes the list
/// once, in its module:
///
/// ```ignore
/// crate::__define_suite! {$
///     /// (doc of the hidden list macro)
///     __x_suite "x" |factory, check, name| TEMPLATE;  // or, without a template: __x_suite "x";
///     checks(ENV);  // optional
///     /// (doc of `cases()`)
///     cases;
///     /// (doc of the tests macro)
///     x_tests(x);
///     case, case => |factory| OVERRIDE, ...
/// }
/// ```
///
/// and gets, over that one list:
///
/// - `pub fn cases() -> Vec<Case>`: each case runs `TEMPLATE` with `check`
///   bound to the function of its name and `name` to its name, unless it
///   gives its own `=> |factory| ...`; without a template, `check` gets the
///   environment its suite builds for a case (see `SuiteEnv`);
/// - with `checks(ENV);`, `pub fn checks()`: every check as `(name,
///   function)`, runnable against any `ENV` (another implementation),
///   except the cases with their own `=> |factory| ...`;
/// - `x_tests!(FACTORY)` (exported): one `#[tokio::test]` per case;
/// - `__x_suite!` (exported, hidden): the names, for [`__suite!`]'s modes.
///
/// Rust lets other crates name the two exported macros by path, but not this
/// one (they are defined by a macro): here, call `__x_suite!` by its bare
/// name, after the definition, and never `x_tests!`.
///
/// The leading `$` lets it write the metavariables of the macros it defines.
#[doc(hidden)]
#[macro_export]
macro_rules! __define_suite {
    ($d:tt
     $(#[$list_doc:meta])* $list:ident $suite:literal $(|$f:ident, $check:ident, $n:ident| $tmpl:expr)?;
     $(checks($env:ty);)?
     $(#[$cases_doc:meta])* cases;
     $(#[$tests_doc:meta])* $tests:ident($module:ident);
     $($name:ident $(=> |$g:ident| $run:expr)?),* $(,)?) => {
        $(#[$list_doc])*
        #[doc(hidden)]
        #[macro_export]
        macro_rules! $list {
            ($d($d mode:tt)*) => {
                $crate::__suite!{$d($d mode)* $($name),*}
            };
        }

        $(#[$cases_doc])*
        pub fn cases() -> ::std::vec::Vec<$crate::Case> {
            $crate::__suite_cases!([$(|$f, $check, $n| $tmpl)?] $suite; $($name $(=> |$g| $run)?),*)
        }

        // The list again, whole, for `checks()` to keep the plain cases of
        // (a repetition of the names cannot sit inside the optional `checks`).
        #[allow(unused_macros)]
        macro_rules! __checks_over {
            ($d env:ty) => {
                $crate::__plain_checks!($d env; [] $($name $(=> |$g| $run)?),*)
            };
        }

        $(
            #[doc = concat!("Every check as `(name, function)`, runnable against any [`", stringify!($env), "`]")]
            /// (to check another implementation).
            pub fn checks() -> ::std::vec::Vec<(
                &'static str,
                fn($env) -> $crate::BoxFuture<'static, $crate::CheckResult>,
            )> {
                __checks_over!($env)
            }
        )?

        $(#[$tests_doc])*
        #[macro_export]
        macro_rules! $tests {
            ($d factory:expr) => {
                $crate::$list!(tests $crate::$module::cases, $d factory;);
            };
        }
    };
}

/// What [`__define_suite!`]'s list macro hands its names to:
///
/// - `tests CASES_FN, FACTORY; names`: one `#[tokio::test]` per case;
/// - `names [CALLBACK] (ARGS) names`: `CALLBACK!(ARGS names)`, for runners
///   of another shape (native locks, side-effect rules, recipe checks).
#[doc(hidden)]
#[macro_export]
macro_rules! __suite {
    (tests $cases:path, $factory:expr; $($name:ident),* $(,)?) => {
        $crate::__cases_as_tests! { $cases, $factory; $($name),* }
    };
    (names [$($cb:tt)*] ($($args:tt)*) $($name:ident),* $(,)?) => {
        $($cb)* ! { $($args)* $($name),* }
    };
}

/// The `Vec<Case>` of a [`__define_suite!`] list, with its template (the
/// default one when the list gives none).
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_cases {
    ([] $suite:literal; $($cases:tt)*) => {
        $crate::__suite_cases!(
            [|factory, check, name| check($crate::harness::SuiteEnv::for_case(factory, name))]
            $suite; $($cases)*
        )
    };
    ([|$f:ident, $check:ident, $n:ident| $tmpl:expr] $suite:literal;
        $($name:ident $(=> |$g:ident| $run:expr)?),* $(,)?) => {
        vec![$($crate::__case!($suite, |$f, $check, $n| $tmpl; $name $(=> |$g| $run)?)),*]
    };
}

/// [`__named_checks!`] over the cases of a [`__define_suite!`] list that run
/// the suite's environment: a case with its own `=> |factory| ...` runs on a
/// factory instead, so it is left out of `checks()`.
#[doc(hidden)]
#[macro_export]
macro_rules! __plain_checks {
    ($env:ty; [$($kept:ident),*]) => {
        $crate::__named_checks!($env; $($kept),*)
    };
    ($env:ty; [$($kept:ident),*] $name:ident => |$g:ident| $run:expr $(, $($rest:tt)*)?) => {
        $crate::__plain_checks!($env; [$($kept),*] $($($rest)*)?)
    };
    ($env:ty; [$($kept:ident),*] $name:ident $(, $($rest:tt)*)?) => {
        $crate::__plain_checks!($env; [$($kept,)* $name] $($($rest)*)?)
    };
}

/// Each check named, runnable against an environment `ENV`, as
/// `(name, run)` (`__named_checks!(ENV; name, ...)`) or as a struct with
/// fields `name` and `run` (`__named_checks!(ENV => Struct; name, ...)`):
/// a [`__suite!`] `names` callback.
#[doc(hidden)]
#[macro_export]
macro_rules! __named_checks {
    ($env:ty; $($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $crate::__named_checks!(@run $env, $name))),*]
    };
    ($env:ty => $named:ident; $($name:ident),* $(,)?) => {
        vec![$($named { name: stringify!($name), run: $crate::__named_checks!(@run $env, $name) }),*]
    };
    (@run $env:ty, $name:ident) => {
        (|env: $env| -> $crate::BoxFuture<'static, $crate::CheckResult> {
            ::std::boxed::Box::pin($name(env))
        }) as fn($env) -> $crate::BoxFuture<'static, $crate::CheckResult>
    };
}

/// `(name, result)` of each check named, run one after another, each with
/// clones of the same two arguments: `__run_checks!(A, B; name, ...)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __run_checks {
    ($a:expr, $b:expr; $($name:ident),* $(,)?) => {
        vec![$((stringify!($name), $name($a.clone(), $b.clone()).await)),*]
    };
}

/// One [`Case`] of a [`__define_suite!`] list.
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
