//! Every suite of this crate on the in-process memory store (one process:
//! every client of a namespace shares its state), one `#[tokio::test]` per
//! case, the way a store crate runs them (`all_suites_tests!`). The other
//! test binaries prove that each suite goes red on broken doubles.

mod common;

use common::memory;

coord_conformance::all_suites_tests!(memory());

/// The memory store reports the version of every put (the check stores
/// that do so run from their own tests).
#[tokio::test]
async fn every_put_reports_its_version() {
    let namespace = coord_conformance::unique_namespace("every_put");
    let backend = memory()(namespace).await.expect("memory store");
    if let Err(failure) = coord_conformance::backend::every_put_reports_its_version(backend).await {
        panic!("{}", failure.message);
    }
}
