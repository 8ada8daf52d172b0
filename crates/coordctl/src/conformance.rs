//! `coordctl conformance --store URL`: every contract suite against any store.

use std::process::ExitCode;

use clap::Args;
use coord_backend::{Error, StoreUrl};
use coord_conformance::{factory, run_cases, Case};

/// Arguments of `coordctl conformance`.
#[derive(Args)]
pub(crate) struct ConformanceArgs {
    /// Store URL, e.g. sqlite://c.db, redis://127.0.0.1:6379, postgres://…, etcd://127.0.0.1:2379
    /// (`--store`, like every other command; `--backend` is the older name, still accepted).
    #[arg(long = "store", alias = "backend", env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Only the suites named (comma separated: backend, lock, board, sideeffect, scheduler,
    /// rwlock, election, fair_lock, semaphore, fault_model, changes); default: all.
    #[arg(long, value_delimiter = ',')]
    suite: Vec<String>,
    /// Print one JSON document instead of the table (schema: docs/console.md).
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: ConformanceArgs) -> Result<ExitCode, Error> {
    let url = StoreUrl::parse(&args.store)?;
    // Fail fast with the store's own error when it cannot be reached at all.
    // Some clients connect lazily (etcd): one read proves the store answers.
    coord::connect(url.without_namespace())
        .await?
        .snapshot(&["coordctl/probe".to_owned()])
        .await?;
    crate::warn_about_deployment(&args.store).await;
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
    if !args.json {
        println!(
            "coordctl conformance: {} cases against {}",
            cases.len(),
            url.without_namespace()
        );
    }
    let bar = crate::progress::bar(cases.len() as u64, "running");
    let reports = run_cases(&cases, make, |report| {
        bar.set_message(format!("{}::{}", report.suite, report.name));
        bar.inc(1);
    })
    .await;
    bar.finish_and_clear();

    let view = crate::views::conformance(
        coord_backend::redact::url(url.without_namespace()),
        &reports,
    );
    let code = if view.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if args.json {
        crate::views::print_json(&view)?;
        return Ok(code);
    }
    println!("{:<12} {:<48} {:>8}  result", "suite", "case", "ms");
    for c in &view.cases {
        let verdict = match &c.failure {
            None => "pass".to_owned(),
            Some(failure) => format!("FAIL: {failure}"),
        };
        println!("{:<12} {:<48} {:>8}  {verdict}", c.suite, c.name, c.ms);
    }
    println!("{} passed, {} failed", view.passed, view.failed);
    Ok(code)
}
