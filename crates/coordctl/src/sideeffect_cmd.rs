//! `coordctl inspect` and `coordctl reconcile`: the operator's view of the
//! at-most-once side-effect gate, and the one way to settle an uncertain key.
//!
//! # Contract
//!
//! - `inspect` only reads. It finds keys and resources without being told
//!   them, by listing the adapter's two record prefixes (`se/act/`,
//!   `se/res/`) and asking the adapter for each one's status
//!   ([`SideEffectAdapter::key_status`], [`SideEffectAdapter::resource_status`]):
//!   records are decoded by the adapter only, never here. Each row is its
//!   own consistent read; the table as a whole is not one snapshot (a key
//!   may move between two rows), which is fine for a report and is why
//!   nothing here decides anything. The report is built as a
//!   [`crate::views`] value; `--json` prints that value (one document,
//!   schema in docs/console.md), the tables are rendered from it.
//! - `reconcile` resolves through the adapter's owned path:
//!   `begin_reconcile` (a claim, so two operators cannot race) then
//!   `resolve_uncertain_owned`. The verdict must come from downstream facts
//!   (did the e-mail leave? is the row there?); this command records it.
//!   Exit codes: 0 resolved, 3 the key is not uncertain (nothing changed),
//!   4 another reconciler holds or took the key (nothing changed),
//!   5 invalid input, 1 the store failed (2 is clap's usage error).
//!   [`resolve`] is that path; the web console's reconcile form calls it too.
//! - `reconcile --outbox NAME KEY` records the verdict on an outbox intent
//!   instead (docs/outbox.md), through `Outbox::resolve`, the path of
//!   `coordctl outbox resolve`: exit 0 resolved, 3 no such intent or not
//!   uncertain/dead, 5 an invalid outbox name, 1 the store failed.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use coord_adapters::sideeffect::{
    Action, KeyStatus, Outcome, Resolution, SideEffectAdapter, SideEffectError, SideEffectStore,
};
use coord_backend::Error;

use crate::views::{self, shorten, side_effect_error, InspectView, Stores};

/// Arguments of `coordctl inspect`.
#[derive(Args)]
pub(crate) struct InspectArgs {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// Only these idempotency keys (repeatable); default: every key in the store.
    #[arg(long = "key")]
    keys: Vec<String>,
    /// Also list idle and completed keys, walking every key (default: only
    /// those needing attention, read from the adapter's index of them; keys
    /// granted before that index existed show up only with --all).
    #[arg(long)]
    all: bool,
    /// Print one JSON document instead of the tables (schema: docs/console.md).
    #[arg(long)]
    json: bool,
}

/// Arguments of `coordctl reconcile`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["applied", "not_applied"])))]
pub(crate) struct ReconcileArgs {
    /// The idempotency key to resolve.
    key: String,
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// The action DID take effect downstream: the key becomes completed and replays `--result`.
    #[arg(long)]
    applied: bool,
    /// The action did NOT take effect: the mark is cleared and the key may run again.
    #[arg(long)]
    not_applied: bool,
    /// The result to store with `--applied` (what later runs replay).
    #[arg(long, requires = "applied", default_value = "")]
    result: String,
    /// The evidence behind the verdict: stored with an `--applied` verdict,
    /// echoed here and in the adapter's log for `--not-applied` (required
    /// but with `--outbox`, where it is only echoed).
    #[arg(long, required_unless_present = "outbox")]
    reason: Option<String>,
    /// KEY is an intent of this outbox (`coordctl outbox`), not a
    /// side-effect key: `--applied` closes it for good, `--not-applied` runs
    /// it again (exit 3: not uncertain or dead).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["result", "resource"])]
    outbox: Option<String>,
    /// The action's resource; default: the one of the key's open intent, if any.
    /// Resolutions check no fence, so it only has to be a valid resource name.
    #[arg(long)]
    resource: Option<String>,
    /// How long the reconcile claim holds the key against other reconcilers.
    #[arg(long, default_value_t = 30_000)]
    claim_ttl_ms: u64,
}

/// "in 1.250s" / "expired 3.100s ago" / "-" (UTC ms against `now_ms`).
pub(crate) fn relative(at_ms: Option<u64>, now_ms: u64) -> String {
    match at_ms {
        None => "-".into(),
        Some(at) if at >= now_ms => format!("in {:.3}s", (at - now_ms) as f64 / 1000.0),
        Some(at) => format!("expired {:.3}s ago", (now_ms - at) as f64 / 1000.0),
    }
}

/// `coordctl inspect`: uncertain keys, in-flight intents, resources.
pub(crate) async fn inspect(args: InspectArgs) -> Result<ExitCode, Error> {
    let stores = Stores::new(coord::connect(&args.store).await?)?;
    crate::warn_about_deployment(&args.store).await;
    // Without --key or --all, only the keys needing attention are read, from
    // the index the adapter keeps of them (not every key the store holds).
    let open = if args.keys.is_empty() && !args.all {
        Some(
            stores
                .effects
                .open_keys()
                .await
                .map_err(views::side_effect_error)?,
        )
    } else {
        None
    };
    let named = match &open {
        Some(open) => Some(open.as_slice()),
        None => (!args.keys.is_empty()).then_some(args.keys.as_slice()),
    };
    let keys = views::side_effects(&stores, named, None, args.all).await?;
    let resources = if args.keys.is_empty() {
        views::resources(&stores, None, None).await?
    } else {
        // Only the resources the named keys are in flight on.
        let mut names: Vec<String> = keys.in_flight.iter().map(|k| k.resource.clone()).collect();
        names.sort();
        names.dedup();
        views::resources(&stores, Some(names), None).await?
    };
    let view = InspectView {
        keys,
        resources: resources.rows,
    };
    if args.json {
        views::print_json(&view)?;
    } else {
        print_inspect(&view);
    }
    Ok(ExitCode::SUCCESS)
}

/// The text report of `inspect` (the same view `--json` prints).
fn print_inspect(view: &InspectView) {
    let keys = &view.keys;
    let now = keys.now_ms;
    println!(
        "coordctl inspect: namespace {:?}, {} key(s), {} resource(s)",
        keys.namespace,
        keys.examined,
        view.resources.len()
    );

    println!(
        "\nUNCERTAIN KEYS ({}): check downstream, then `coordctl reconcile KEY --applied|--not-applied`",
        keys.uncertain.len()
    );
    if !keys.uncertain.is_empty() {
        println!("{:<40} reason", "key");
        for k in &keys.uncertain {
            println!("{:<40} {}", k.key, shorten(&k.reason, 100));
        }
    }

    println!(
        "\nIN-FLIGHT INTENTS ({}): an expired one reads as uncertain until reconciled",
        keys.in_flight.len()
    );
    if !keys.in_flight.is_empty() {
        println!(
            "{:<40} {:<32} {:>8} {:<24} {:<22} state",
            "key", "resource", "fence", "resource holder", "lease"
        );
        for k in &keys.in_flight {
            // The resource may since have gone to another key: then the
            // lease column is that key's, not this intent's.
            let holder = k.resource_holder.as_deref().unwrap_or("(released)");
            let state = if k.live {
                "live (in flight)"
            } else {
                "expired (uncertain)"
            };
            println!(
                "{:<40} {:<32} {:>8} {:<24} {:<22} {}",
                k.key,
                k.resource,
                k.fence,
                shorten(holder, 24),
                relative(k.lease_expires_ms, now),
                state
            );
        }
    }

    println!("\nRESOURCES ({})", view.resources.len());
    if !view.resources.is_empty() {
        println!(
            "{:<40} {:>13} {:<32} {:<22} state",
            "resource", "highest fence", "holder", "lease"
        );
        for r in &view.resources {
            println!(
                "{:<40} {:>13} {:<32} {:<22} {}",
                r.resource,
                r.highest_fence,
                r.holder.as_deref().unwrap_or("-"),
                relative(r.lease_expires_ms, now),
                r.state
            );
        }
    }

    println!(
        "\ncompleted keys: {}, idle keys: {}",
        keys.completed, keys.idle
    );
    if let Some(settled) = &keys.settled {
        println!("{:<40} {:<10} result", "key", "state");
        for k in settled {
            println!(
                "{:<40} {:<10} {}",
                k.key,
                k.state,
                k.result.as_deref().unwrap_or("-")
            );
        }
    }
}

fn refuse(code: u8, message: String) -> Result<ExitCode, Error> {
    eprintln!("coordctl reconcile: {message}");
    Ok(ExitCode::from(code))
}

/// An operator's verdict on an uncertain key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The action took effect downstream: the key completes with this result.
    Applied {
        /// What later runs replay.
        result: String,
    },
    /// It did not: the mark is cleared and the key may run again.
    NotApplied,
}

/// What a recorded verdict did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Resolved {
    /// The key is completed; runs replay this result.
    Completed {
        /// The stored result (lossy UTF-8).
        result: String,
    },
    /// The mark is cleared; the key may run again.
    Cleared,
}

/// Why a verdict was not recorded (nothing changed), with the exit code of
/// `coordctl reconcile` and the operator's message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) code: u8,
    pub(crate) message: String,
}

/// Record `verdict` on `key` through the adapter's owned path:
/// `begin_reconcile` (a claim, so two operators cannot race) then
/// `resolve_uncertain_owned`. The one implementation behind
/// `coordctl reconcile` and the web console's reconcile form.
/// `Err`: the store failed.
pub(crate) async fn resolve(
    adapter: &SideEffectAdapter,
    key: &str,
    resource: Option<String>,
    verdict: &Verdict,
    reason: &str,
    claim_ttl: Duration,
) -> Result<Result<Resolved, Refused>, Error> {
    let resource = match resource {
        Some(r) => r,
        None => match adapter.key_status(key).await.map_err(side_effect_error)? {
            KeyStatus::InFlight { resource, .. } => resource,
            // The adapter does not expose an uncertain key's resource, and
            // resolving checks none: any valid name will do.
            _ => "coordctl-reconcile".to_owned(),
        },
    };
    let action = Action::new(key.to_owned(), resource);
    let resolution = match verdict {
        Verdict::Applied { result } => Resolution::applied(result.as_str(), reason.to_owned()),
        Verdict::NotApplied => Resolution::not_applied(reason.to_owned()),
    };
    let claim = match adapter.begin_reconcile(&action, claim_ttl).await {
        Ok(Some(claim)) => claim,
        Ok(None) => {
            return Ok(Err(Refused {
                code: 4,
                message: format!(
                    "key {key:?} is being reconciled by someone else; nothing changed (retry after their claim lapses)"
                ),
            }))
        }
        Err(e) => return not_resolved(adapter, key, e).await,
    };
    match adapter
        .resolve_uncertain_owned(&action, &resolution, &claim.holder)
        .await
    {
        Ok(execution) => Ok(Ok(match execution.outcome {
            Outcome::Replayed => Resolved::Completed {
                result: execution
                    .result
                    .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
                    .unwrap_or_default(),
            },
            _ => Resolved::Cleared,
        })),
        Err(e) => not_resolved(adapter, key, e).await,
    }
}

/// `coordctl reconcile`: claim the key, record the verdict, print the outcome.
pub(crate) async fn reconcile(args: ReconcileArgs) -> Result<ExitCode, Error> {
    let reason = args.reason.clone().unwrap_or_default();
    if let Some(name) = &args.outbox {
        return reconcile_outbox(&args, name, &reason).await;
    }
    if args.claim_ttl_ms == 0 {
        return refuse(5, "--claim-ttl-ms must be at least 1".into());
    }
    let adapter = SideEffectAdapter::new(coord::connect(&args.store).await?);
    let verdict = if args.applied {
        Verdict::Applied {
            result: args.result.clone(),
        }
    } else {
        Verdict::NotApplied
    };
    let outcome = resolve(
        &adapter,
        &args.key,
        args.resource.clone(),
        &verdict,
        &reason,
        Duration::from_millis(args.claim_ttl_ms),
    )
    .await?;
    let word = if args.applied {
        "applied"
    } else {
        "not applied"
    };
    match outcome {
        Ok(Resolved::Completed { result }) => println!(
            "resolved {:?} as {word}: the key is completed; runs replay result {result:?}",
            args.key
        ),
        Ok(Resolved::Cleared) => println!(
            "resolved {:?} as {word}: the mark is cleared; the key may run again",
            args.key
        ),
        Err(refused) => return refuse(refused.code, refused.message),
    }
    println!("reason: {reason}");
    Ok(ExitCode::SUCCESS)
}

/// `coordctl reconcile --outbox NAME KEY`: the verdict through
/// `Outbox::resolve` (the path of `coordctl outbox resolve`).
async fn reconcile_outbox(
    args: &ReconcileArgs,
    name: &str,
    reason: &str,
) -> Result<ExitCode, Error> {
    let board: std::sync::Arc<dyn coord_adapters::board::Board> = std::sync::Arc::new(
        coord_adapters::board::BoardAdapter::new(coord::connect(&args.store).await?),
    );
    let outbox = match coord_adapters::outbox::Outbox::over(board, name) {
        Ok(outbox) => outbox,
        Err(e) => return refuse(5, format!("invalid input: {e}")),
    };
    let verdict = if args.applied {
        coord_adapters::outbox::Verdict::Applied
    } else {
        coord_adapters::outbox::Verdict::NotApplied
    };
    let code =
        crate::outbox_cmd::resolve_verdict(&outbox, &args.key, verdict, "coordctl reconcile")
            .await?;
    if code == ExitCode::SUCCESS && !reason.is_empty() {
        println!("reason: {reason}");
    }
    Ok(code)
}

/// A refusal with the reason an operator needs; store failures stay errors.
async fn not_resolved(
    adapter: &SideEffectAdapter,
    key: &str,
    e: SideEffectError,
) -> Result<Result<Resolved, Refused>, Error> {
    let refused = |code: u8, message: String| Ok(Err(Refused { code, message }));
    match e {
        SideEffectError::NotUncertain => {
            let now = match adapter.key_status(key).await.map_err(side_effect_error)? {
                KeyStatus::Idle => "idle (never run, abandoned, or already cleared)".to_owned(),
                KeyStatus::InFlight { fence, .. } => format!(
                    "in flight with a live lease ({fence}): its holder may still complete it; retry after the lease expires"
                ),
                KeyStatus::Completed { result } => format!(
                    "already completed with result {:?}",
                    String::from_utf8_lossy(result.as_bytes())
                ),
                KeyStatus::Uncertain { .. } => "uncertain again (raced); retry".to_owned(),
                _ => "in a state this coordctl does not know".to_owned(),
            };
            refused(3, format!("key {key:?} is not uncertain: {now}; nothing changed"))
        }
        SideEffectError::ReconcileLost => refused(
            4,
            format!("lost the reconcile claim on {key:?} (it lapsed or another reconciler resolved the key); nothing changed"),
        ),
        SideEffectError::InvalidAction(why) => refused(5, format!("invalid input: {why}")),
        SideEffectError::Store(e) => Err(e),
        other => refused(1, format!("{other}")),
    }
}
