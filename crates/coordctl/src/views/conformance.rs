//! `coordctl conformance --json`: every case's suite, name, time and
//! failure, with the totals.

use serde::Serialize;

/// One conformance case.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CaseView {
    pub(crate) suite: &'static str,
    pub(crate) name: &'static str,
    pub(crate) ms: u64,
    pub(crate) passed: bool,
    /// Why it failed.
    pub(crate) failure: Option<String>,
}

/// `coordctl conformance --json`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ConformanceView {
    /// The store URL without namespace, credentials hidden.
    pub(crate) store: String,
    pub(crate) cases: Vec<CaseView>,
    pub(crate) passed: usize,
    pub(crate) failed: usize,
}

/// The conformance reports as a view.
pub(crate) fn conformance(
    store: String,
    reports: &[coord_conformance::CaseReport],
) -> ConformanceView {
    let cases: Vec<CaseView> = reports
        .iter()
        .map(|r| CaseView {
            suite: r.suite,
            name: r.name,
            ms: u64::try_from(r.elapsed.as_millis()).unwrap_or(u64::MAX),
            passed: r.result.is_ok(),
            failure: r.result.as_ref().err().map(|f| f.to_string()),
        })
        .collect();
    let failed = cases.iter().filter(|c| !c.passed).count();
    ConformanceView {
        store,
        passed: cases.len() - failed,
        failed,
        cases,
    }
}
