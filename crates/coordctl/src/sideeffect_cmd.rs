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
//!   nothing here decides anything.
//! - `reconcile` resolves through the adapter's owned path:
//!   `begin_reconcile` (a claim, so two operators cannot race) then
//!   `resolve_uncertain_owned`. The verdict must come from downstream facts
//!   (did the e-mail leave? is the row there?); this command records it.
//!   Exit codes: 0 resolved, 3 the key is not uncertain (nothing changed),
//!   4 another reconciler holds or took the key (nothing changed),
//!   5 invalid input, 1 the store failed (2 is clap's usage error).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::Args;
use coord_adapters::sideeffect::{
    Action, KeyStatus, Outcome, Resolution, SideEffectAdapter, SideEffectError, SideEffectStore,
};
use coord_backend::{Backend, Error};

/// The adapter's record prefixes (its documented layout: SPEC / module docs).
const ACT_PREFIX: &str = "se/act/";
const RES_PREFIX: &str = "se/res/";

/// Arguments of `coordctl inspect`.
#[derive(Args)]
pub(crate) struct InspectArgs {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long)]
    store: String,
    /// Only these idempotency keys (repeatable); default: every key in the store.
    #[arg(long = "key")]
    keys: Vec<String>,
    /// Also list idle and completed keys (default: only those needing attention).
    #[arg(long)]
    all: bool,
}

/// Arguments of `coordctl reconcile`.
#[derive(Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["applied", "not_applied"])))]
pub(crate) struct ReconcileArgs {
    /// The idempotency key to resolve.
    key: String,
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long)]
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
    /// echoed here and in the adapter's log for `--not-applied`.
    #[arg(long)]
    reason: String,
    /// The action's resource; default: the one of the key's open intent, if any.
    /// Resolutions check no fence, so it only has to be a valid resource name.
    #[arg(long)]
    resource: Option<String>,
    /// How long the reconcile claim holds the key against other reconcilers.
    #[arg(long, default_value_t = 30_000)]
    claim_ttl_ms: u64,
}

/// One key's row (uncertain, in flight, idle or completed).
struct KeyRow {
    key: String,
    status: KeyStatus,
    /// For an intent: the holder of its resource and when that lease ends.
    holder: Option<(Option<String>, Option<SystemTime>)>,
}

fn strip_all(keys: Vec<String>, prefix: &str) -> Vec<String> {
    keys.into_iter()
        .filter_map(|k| k.strip_prefix(prefix).map(str::to_owned))
        .collect()
}

/// "in 1.250s" / "expired 3.100s ago" / "-".
fn relative(at: Option<SystemTime>, now: SystemTime) -> String {
    match at {
        None => "-".into(),
        Some(at) => match at.duration_since(now) {
            Ok(ahead) => format!("in {:.3}s", ahead.as_secs_f64()),
            Err(behind) => format!("expired {:.3}s ago", behind.duration().as_secs_f64()),
        },
    }
}

fn live_word(live: bool) -> &'static str {
    if live {
        "live"
    } else {
        "expired"
    }
}

fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_owned()
    } else {
        let mut s: String = text.chars().take(max.saturating_sub(1)).collect();
        s.push('…');
        s
    }
}

async fn open(url: &str) -> Result<(Arc<dyn Backend>, SideEffectAdapter), Error> {
    let backend = coord::connect(url).await?;
    let adapter = SideEffectAdapter::new(backend.clone());
    Ok((backend, adapter))
}

/// Store errors pass through; every other side-effect error is unexpected
/// for a read and is reported as a config error with its text.
fn store_error(e: SideEffectError) -> Error {
    match e {
        SideEffectError::Store(e) => e,
        other => Error::Config(other.to_string()),
    }
}

/// `coordctl inspect`: uncertain keys, in-flight intents, resources.
pub(crate) async fn inspect(args: InspectArgs) -> Result<ExitCode, Error> {
    let (backend, adapter) = open(&args.store).await?;
    let keys = if args.keys.is_empty() {
        strip_all(backend.keys(ACT_PREFIX).await?, ACT_PREFIX)
    } else {
        args.keys.clone()
    };
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let status = adapter.key_status(&key).await.map_err(store_error)?;
        let holder = match &status {
            KeyStatus::InFlight { resource, .. } => {
                let res = adapter
                    .resource_status(resource)
                    .await
                    .map_err(store_error)?;
                Some((res.holder, res.expires_at))
            }
            _ => None,
        };
        rows.push(KeyRow {
            key,
            status,
            holder,
        });
    }
    let resources: Vec<String> = if args.keys.is_empty() {
        strip_all(backend.keys(RES_PREFIX).await?, RES_PREFIX)
    } else {
        // Only the resources the named keys are in flight on.
        let mut named: Vec<String> = rows
            .iter()
            .filter_map(|r| match &r.status {
                KeyStatus::InFlight { resource, .. } => Some(resource.clone()),
                _ => None,
            })
            .collect();
        named.sort();
        named.dedup();
        named
    };
    let now = adapter.clock().now();

    println!(
        "coordctl inspect: namespace {:?}, {} key(s), {} resource(s)",
        backend.namespace(),
        rows.len(),
        resources.len()
    );

    // What `acquire` answers `Uncertain` for: marked keys, and intents whose
    // lease is gone (the holder died or released before completing).
    let uncertain: Vec<(&KeyRow, String)> = rows
        .iter()
        .filter_map(|r| match &r.status {
            KeyStatus::Uncertain { reason } => Some((r, reason.clone())),
            KeyStatus::InFlight {
                fence, live: false, ..
            } => Some((
                r,
                format!("intent ({fence}) lost its lease before completing: the holder died or released"),
            )),
            _ => None,
        })
        .collect();
    println!(
        "\nUNCERTAIN KEYS ({}): check downstream, then `coordctl reconcile KEY --applied|--not-applied`",
        uncertain.len()
    );
    if !uncertain.is_empty() {
        println!("{:<40} reason", "key");
        for (r, reason) in uncertain {
            println!("{:<40} {}", r.key, shorten(&reason, 100));
        }
    }

    let in_flight: Vec<&KeyRow> = rows
        .iter()
        .filter(|r| matches!(r.status, KeyStatus::InFlight { .. }))
        .collect();
    println!(
        "\nIN-FLIGHT INTENTS ({}): an expired one reads as uncertain until reconciled",
        in_flight.len()
    );
    if !in_flight.is_empty() {
        println!(
            "{:<40} {:<32} {:>8} {:<24} {:<22} state",
            "key", "resource", "fence", "resource holder", "lease"
        );
        for r in in_flight {
            if let KeyStatus::InFlight {
                resource,
                fence,
                live,
            } = &r.status
            {
                let (holder, expires) = r.holder.clone().unwrap_or((None, None));
                // The resource may since have gone to another key: then the
                // lease column is that key's, not this intent's.
                let holder = holder.unwrap_or_else(|| "(released)".into());
                let state = if *live {
                    "live (in flight)"
                } else {
                    "expired (uncertain)"
                };
                println!(
                    "{:<40} {:<32} {:>8} {:<24} {:<22} {}",
                    r.key,
                    resource,
                    fence.0,
                    shorten(&holder, 24),
                    relative(expires, now),
                    state
                );
            }
        }
    }

    println!("\nRESOURCES ({})", resources.len());
    if !resources.is_empty() {
        println!(
            "{:<40} {:>13} {:<32} {:<22} state",
            "resource", "highest fence", "holder", "lease"
        );
        for resource in &resources {
            let s = adapter
                .resource_status(resource)
                .await
                .map_err(store_error)?;
            let state = match (&s.holder, s.live) {
                (None, _) => "free",
                (Some(_), live) => live_word(live),
            };
            println!(
                "{:<40} {:>13} {:<32} {:<22} {}",
                resource,
                s.highest_fence.0,
                s.holder.as_deref().unwrap_or("-"),
                relative(s.expires_at, now),
                state
            );
        }
    }

    let completed = rows
        .iter()
        .filter(|r| matches!(r.status, KeyStatus::Completed { .. }))
        .count();
    let idle = rows
        .iter()
        .filter(|r| matches!(r.status, KeyStatus::Idle))
        .count();
    println!("\ncompleted keys: {completed}, idle keys: {idle}");
    if args.all {
        println!("{:<40} {:<10} result", "key", "state");
        for r in &rows {
            match &r.status {
                KeyStatus::Completed { result } => println!(
                    "{:<40} {:<10} {}",
                    r.key,
                    "completed",
                    shorten(&String::from_utf8_lossy(result.as_bytes()), 80)
                ),
                KeyStatus::Idle => println!("{:<40} {:<10} -", r.key, "idle"),
                _ => {}
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn refuse(code: u8, message: String) -> Result<ExitCode, Error> {
    eprintln!("coordctl reconcile: {message}");
    Ok(ExitCode::from(code))
}

/// `coordctl reconcile`: claim the key, record the verdict, print the outcome.
pub(crate) async fn reconcile(args: ReconcileArgs) -> Result<ExitCode, Error> {
    if args.claim_ttl_ms == 0 {
        return refuse(5, "--claim-ttl-ms must be at least 1".into());
    }
    let (_backend, adapter) = open(&args.store).await?;
    let resource = match args.resource.clone() {
        Some(r) => r,
        None => match adapter.key_status(&args.key).await.map_err(store_error)? {
            KeyStatus::InFlight { resource, .. } => resource,
            // The adapter does not expose an uncertain key's resource, and
            // resolving checks none: any valid name will do.
            _ => "coordctl-reconcile".to_owned(),
        },
    };
    let action = Action::new(args.key.clone(), resource);
    let resolution = if args.applied {
        Resolution::applied(args.result.as_str(), args.reason.clone())
    } else {
        Resolution::not_applied(args.reason.clone())
    };

    let claim = match adapter
        .begin_reconcile(&action, Duration::from_millis(args.claim_ttl_ms))
        .await
    {
        Ok(Some(claim)) => claim,
        Ok(None) => {
            return refuse(
                4,
                format!(
                    "key {:?} is being reconciled by someone else; nothing changed (retry after their claim lapses)",
                    args.key
                ),
            )
        }
        Err(e) => return not_resolved(&adapter, &args.key, e).await,
    };
    match adapter
        .resolve_uncertain_owned(&action, &resolution, &claim.holder)
        .await
    {
        Ok(execution) => {
            let verdict = if args.applied {
                "applied"
            } else {
                "not applied"
            };
            match execution.outcome {
                Outcome::Replayed => {
                    let stored = execution
                        .result
                        .map(|r| String::from_utf8_lossy(r.as_bytes()).into_owned())
                        .unwrap_or_default();
                    println!(
                        "resolved {:?} as {verdict}: the key is completed; runs replay result {stored:?}",
                        args.key
                    );
                }
                _ => println!(
                    "resolved {:?} as {verdict}: the mark is cleared; the key may run again",
                    args.key
                ),
            }
            println!("reason: {}", args.reason);
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => not_resolved(&adapter, &args.key, e).await,
    }
}

/// A refusal with the reason an operator needs; store failures stay errors.
async fn not_resolved(
    adapter: &SideEffectAdapter,
    key: &str,
    e: SideEffectError,
) -> Result<ExitCode, Error> {
    match e {
        SideEffectError::NotUncertain => {
            let now = match adapter.key_status(key).await.map_err(store_error)? {
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
            refuse(3, format!("key {key:?} is not uncertain: {now}; nothing changed"))
        }
        SideEffectError::ReconcileLost => refuse(
            4,
            format!("lost the reconcile claim on {key:?} (it lapsed or another reconciler resolved the key); nothing changed"),
        ),
        SideEffectError::InvalidAction(why) => refuse(5, format!("invalid input: {why}")),
        SideEffectError::Store(e) => Err(e),
        other => refuse(1, format!("{other}")),
    }
}
