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
//! Every case creates its backends through the factory with a namespace of
//! its own (random per run, see [`unique_namespace`]), so cases run in
//! parallel on one server without seeing each other's keys.
//!
//! A check that cannot fail is a defect: this crate's own tests run each suite
//! against deliberately broken stores and adapters and assert that it fails.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod harness;

pub mod backend;
pub mod board;
pub mod fault;
pub mod lock;
pub mod scheduler;
pub mod sideeffect;

pub use harness::{
    factory, run_case, run_cases, server_env, unique_namespace, BackendFactory, BoxFuture, Case,
    CaseReport, CheckResult, Failure,
};

#[doc(hidden)]
pub mod __private {
    pub use tokio;
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
