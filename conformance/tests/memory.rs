//! Every suite of this crate on the in-process memory store (one process:
//! every client of a namespace shares its state), one `#[tokio::test]` per
//! case, the way a store crate runs them (`all_suites_tests!`). The other
//! test binaries prove that each suite goes red on broken doubles.

mod common;

use common::memory;

coord_conformance::all_suites_tests!(memory());
