//! `coordctl conformance --backend URL`: every contract suite against any store.

use std::process::ExitCode;

use clap::Args;
use coord_backend::{Error, StoreUrl};
use coord_conformance::{factory, run_cases, Case};

/// Arguments of `coordctl conformance`.
#[derive(Args)]
pub(crate) struct ConformanceArgs {
    /// Store URL, e.g. sqlite://c.db, redis://127.0.0.1:6379, postgres://…, etcd://127.0.0.1:2379.
    #[arg(long)]
    backend: String,
    /// Only the suites named (comma separated: backend, lock, board, sideeffect, scheduler); default: all.
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
}

pub(crate) async fn run(args: ConformanceArgs) -> Result<ExitCode, Error> {
    let url = StoreUrl::parse(&args.backend)?;
    // Fail fast with the store's own error when it cannot be reached at all.
    // Some clients connect lazily (etcd): one read proves the store answers.
    coord::connect(url.without_namespace())
        .await?
        .snapshot(&["coordctl/probe".to_owned()])
        .await?;
    let cases: Vec<Case> = coord_conformance::all_cases()
        .into_iter()
        .filter(|c| args.suite.is_empty() || args.suite.iter().any(|s| s == c.suite))
        .collect();
    if cases.is_empty() {
        return Err(Error::Config(format!("no suite named {:?}", args.suite)));
    }
    let base = url.clone();
    let make = factory(move |namespace| {
        let url = base.with_namespace(&namespace);
        async move { coord::connect(&url).await }
    });
    println!(
        "coordctl conformance: {} cases against {}",
        cases.len(),
        url.without_namespace()
    );
    let bar = crate::progress::bar(cases.len() as u64, "running");
    let reports = run_cases(&cases, make, |report| {
        bar.set_message(format!("{}::{}", report.suite, report.name));
        bar.inc(1);
    })
    .await;
    bar.finish_and_clear();

    println!("{:<12} {:<48} {:>8}  result", "suite", "case", "ms");
    let mut failed = 0;
    for r in &reports {
        let verdict = match &r.result {
            Ok(()) => "pass".to_owned(),
            Err(failure) => {
                failed += 1;
                format!("FAIL: {failure}")
            }
        };
        println!(
            "{:<12} {:<48} {:>8}  {verdict}",
            r.suite,
            r.name,
            r.elapsed.as_millis()
        );
    }
    println!("{} passed, {failed} failed", reports.len() - failed);
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
