//! `coordctl outbox`: a transactional outbox (docs/outbox.md) from the
//! shell: `run` dispatches its intents to a command, `enqueue` records one,
//! `status` shows one, `resolve` records an operator's verdict on an
//! uncertain one.
//!
//! # Contract
//!
//! - `run -- COMMAND [ARGS...]` runs COMMAND (no shell: wrap it in
//!   `sh -c '...'` for one) once per claimed intent, with the payload on its
//!   stdin and `COORD_OUTBOX_KEY`, `COORD_OUTBOX_FENCE`, `COORD_OUTBOX_NAME`
//!   in its environment; its stderr is coordctl's. Its exit status is the
//!   handler's answer: 0 applied (its stdout, at most [`RESULT_CAP`] bytes,
//!   is the stored result), [`EX_TEMPFAIL`] (75, sysexits.h) not applied
//!   (retried after a backoff), anything else, or death by a signal, unknown
//!   (the intent becomes uncertain). A command that cannot be started did
//!   not run: not applied. One line per dispatch on stdout (`KEY OUTCOME`).
//! - SIGINT/SIGTERM: no new intent is taken; a running command is left to
//!   finish and its answer recorded; then exit 0. The loop checks for the
//!   signal between dispatches only (a claim in flight is never dropped
//!   half way, which would leave its intent uncertain), so stopping may
//!   take up to the one-second claim wait plus the running command.
//! - Exit codes (as `coordctl board`): 0 done, 3 nothing changed (`enqueue`:
//!   the key exists with another payload; `status`: no such intent;
//!   `resolve`: not uncertain or dead), 1 the store failed, 2 bad arguments.

use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};
use coord_adapters::board::{Board, BoardError};
use coord_adapters::outbox::{Dispatched, HandlerError, Intent, Outbox, Verdict};
use coord_backend::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::views::{self, board_error, Stores};

/// The exit status of a command whose intent did not take effect
/// (`EX_TEMPFAIL` of sysexits.h): retried after a backoff.
pub(crate) const EX_TEMPFAIL: i32 = 75;

/// The most bytes of a command's stdout kept as the intent's result; the
/// rest is read and dropped.
pub(crate) const RESULT_CAP: usize = 64 * 1024;

/// The exit code of a refusal: nothing changed.
const NOTHING_CHANGED: u8 = 3;

/// Arguments of `coordctl outbox`.
#[derive(Args)]
pub(crate) struct OutboxArgs {
    #[command(subcommand)]
    command: OutboxCommand,
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// Dispatch the outbox's intents to a command until SIGINT/SIGTERM (exit 0 applied, 75 retry, else uncertain).
    Run(RunArgs),
    /// Record an intent (a no-op when it exists with the same payload; exit 3 with another).
    Enqueue(EnqueueArgs),
    /// One intent's task: state, attempts, fence, last error (exit 3: no such intent).
    Status(StatusArgs),
    /// An operator's verdict on an uncertain (or dead) intent (exit 3: neither).
    Resolve(ResolveArgs),
}

/// `--store` and `--name`, as every subcommand takes them.
#[derive(Args)]
struct OutboxArg {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
    /// The outbox's name (its queue is `outbox.NAME`).
    #[arg(long, value_parser = outbox_name)]
    name: String,
}

/// An outbox name: a valid queue name (non-empty, no `/` or NUL).
fn outbox_name(text: &str) -> Result<String, String> {
    coord_adapters::board::validate_queue(text).map_err(|e| e.to_string())?;
    Ok(text.to_owned())
}

/// An intent key: non-empty, no NUL.
fn intent_key(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains('\0') {
        return Err("a key must be non-empty, without NUL".to_owned());
    }
    Ok(text.to_owned())
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    outbox: OutboxArg,
    /// This dispatcher's name in its claims (default: `coordctl-HOST-PID`, HOST from `$HOSTNAME`).
    #[arg(long)]
    agent: Option<String>,
    /// The lease of each claim, renewed every third of it while the command runs.
    #[arg(long, value_name = "DURATION", value_parser = coord_scheduler::parse_duration, default_value = "60s")]
    ttl: Duration,
    /// The command and its arguments (after `--`).
    #[arg(required = true, last = true, num_args = 1..)]
    command: Vec<String>,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").args(["payload", "payload_file"])))]
struct EnqueueArgs {
    /// The intent's key (its task is `outbox/NAME/KEY`).
    #[arg(value_parser = intent_key)]
    key: String,
    #[command(flatten)]
    outbox: OutboxArg,
    /// The payload, as text (UTF-8 bytes); default empty.
    #[arg(long)]
    payload: Option<String>,
    /// The payload, read from this file (`-`: stdin).
    #[arg(long)]
    payload_file: Option<std::path::PathBuf>,
}

#[derive(Args)]
struct StatusArgs {
    /// The intent's key.
    #[arg(value_parser = intent_key)]
    key: String,
    #[command(flatten)]
    outbox: OutboxArg,
    /// Print the task as one JSON object (a row of `/api/tasks`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("verdict").required(true).args(["applied", "not_applied"])))]
struct ResolveArgs {
    /// The intent's key.
    #[arg(value_parser = intent_key)]
    key: String,
    #[command(flatten)]
    outbox: OutboxArg,
    /// It DID take effect downstream: never run it (its task is cancelled).
    #[arg(long)]
    applied: bool,
    /// It did NOT take effect: run it again (its attempts from zero).
    #[arg(long)]
    not_applied: bool,
}

/// `coordctl outbox`.
pub(crate) async fn run(args: OutboxArgs) -> Result<ExitCode, Error> {
    match args.command {
        OutboxCommand::Run(args) => dispatch(args).await,
        OutboxCommand::Enqueue(args) => enqueue(args).await,
        OutboxCommand::Status(args) => status(args).await,
        OutboxCommand::Resolve(args) => {
            let verdict = if args.applied {
                Verdict::Applied
            } else {
                Verdict::NotApplied
            };
            let (_, outbox) = open(&args.outbox).await?;
            resolve_verdict(&outbox, &args.key, verdict, "coordctl outbox resolve").await
        }
    }
}

async fn open(arg: &OutboxArg) -> Result<(Stores, Outbox), Error> {
    let stores = Stores::new(coord::connect(&arg.store).await?)?;
    crate::warn_about_deployment(&arg.store).await;
    let board: Arc<dyn Board> = Arc::new(stores.board.clone());
    let outbox = Outbox::over(board, &arg.name).map_err(board_error)?;
    Ok((stores, outbox))
}

fn refuse(what: &str, message: String) -> Result<ExitCode, Error> {
    eprintln!("{what}: {message}");
    Ok(ExitCode::from(NOTHING_CHANGED))
}

/// Record `verdict` on intent `key` (the one path of `outbox resolve` and
/// `reconcile --outbox`): exit 0 recorded, 3 no such intent or not
/// uncertain/dead (nothing changed).
pub(crate) async fn resolve_verdict(
    outbox: &Outbox,
    key: &str,
    verdict: Verdict,
    what: &str,
) -> Result<ExitCode, Error> {
    match outbox.resolve(key, verdict).await {
        Ok(()) => {
            match verdict {
                Verdict::Applied => println!(
                    "resolved intent {key:?} of outbox {:?} as applied: it is never run",
                    outbox.name()
                ),
                _ => println!(
                    "resolved intent {key:?} of outbox {:?} as not applied: it runs again",
                    outbox.name()
                ),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(BoardError::Store(e)) => Err(e),
        Err(BoardError::NotFound { .. }) => refuse(
            what,
            format!("no intent {key:?} in outbox {:?}", outbox.name()),
        ),
        Err(other) => refuse(what, format!("{other}; nothing changed")),
    }
}

async fn enqueue(args: EnqueueArgs) -> Result<ExitCode, Error> {
    let payload = match (&args.payload, &args.payload_file) {
        (Some(text), _) => text.clone().into_bytes(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .map_err(|e| Error::Config(format!("cannot read stdin: {e}")))?;
            bytes
        }
        (None, Some(path)) => std::fs::read(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?,
        (None, None) => Vec::new(),
    };
    let (_, outbox) = open(&args.outbox).await?;
    match outbox.enqueue(&args.key, payload).await {
        Ok(()) => {
            println!(
                "enqueued {:?} in outbox {:?} (task {})",
                args.key,
                outbox.name(),
                outbox.task_id(&args.key)
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(BoardError::Store(e)) => Err(e),
        Err(BoardError::AlreadyExists { .. }) => refuse(
            "coordctl outbox enqueue",
            format!(
                "intent {:?} exists with another payload; nothing changed",
                args.key
            ),
        ),
        Err(other) => refuse(
            "coordctl outbox enqueue",
            format!("{other}; nothing changed"),
        ),
    }
}

async fn status(args: StatusArgs) -> Result<ExitCode, Error> {
    let (stores, outbox) = open(&args.outbox).await?;
    let Some(task) = views::task(&stores, &outbox.task_id(&args.key)).await? else {
        return refuse(
            "coordctl outbox status",
            format!("no intent {:?} in outbox {:?}", args.key, outbox.name()),
        );
    };
    if args.json {
        views::print_json(&task)?;
    } else {
        crate::board_cmd::print_task(&task, views::ms(SystemTime::now()));
    }
    Ok(ExitCode::SUCCESS)
}

/// `coordctl outbox run`: dispatch until SIGINT/SIGTERM.
async fn dispatch(args: RunArgs) -> Result<ExitCode, Error> {
    let mut signals = crate::cron::Signals::register()?;
    let (_, outbox) = open(&args.outbox).await?;
    let agent = args.agent.clone().unwrap_or_else(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
        format!("coordctl-{host}-{}", std::process::id())
    });
    let dispatcher = outbox.dispatcher(&agent).with_ttl(args.ttl);
    let name = outbox.name().to_owned();
    let command = Arc::new(args.command);
    eprintln!(
        "coordctl outbox run: dispatching outbox {name:?} as {agent:?} to {:?}",
        command[0]
    );
    let handler = |intent: Intent| run_command(command.clone(), name.clone(), intent);
    // `Dispatcher::run` looks at `stop` between dispatches only: a signal
    // lets the running command finish and its answer be recorded.
    let mut stopped = "";
    let stop = async {
        stopped = signals.next().await;
    };
    dispatcher.run(handler, report, stop).await;
    eprintln!("coordctl outbox run: {stopped}: stopped");
    Ok(ExitCode::SUCCESS)
}

/// One line per dispatch: `KEY OUTCOME`.
fn report(done: &Dispatched) {
    match done {
        Dispatched::Applied { key } => println!("{key} applied"),
        Dispatched::WillRetry { key, at } => {
            let wait = at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            println!("{key} not-applied retry-in={}ms", wait.as_millis());
        }
        Dispatched::GaveUp { key } => println!("{key} dead"),
        Dispatched::Uncertain { key } => println!("{key} uncertain"),
        Dispatched::LeaseLost { key } => println!("{key} lease-lost"),
        other => println!("{other:?}"),
    }
}

/// Run `command` for `intent`: its answer as the outbox expects it.
async fn run_command(
    command: Arc<Vec<String>>,
    name: String,
    intent: Intent,
) -> Result<Vec<u8>, HandlerError> {
    let spawned = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("COORD_OUTBOX_KEY", &intent.key)
        .env("COORD_OUTBOX_FENCE", intent.fence.to_string())
        .env("COORD_OUTBOX_NAME", &name)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            return Err(HandlerError::not_applied(format!(
                "could not start {:?}: {e}",
                command[0]
            )))
        }
    };
    let mut stdin = child.stdin.take();
    let payload = intent.payload;
    // Written beside the stdout read (a large payload and a chatty command
    // would block each other); a command that does not read it is fine.
    let writer = tokio::spawn(async move {
        if let Some(stdin) = stdin.as_mut() {
            let _ = stdin.write_all(&payload).await;
        }
    });
    let mut out = Vec::new();
    if let Some(mut stdout) = child.stdout.take() {
        let mut buf = [0u8; 8192];
        loop {
            match stdout.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let room = RESULT_CAP.saturating_sub(out.len());
                    out.extend_from_slice(&buf[..n.min(room)]);
                }
            }
        }
    }
    let _ = writer.await;
    let status = child
        .wait()
        .await
        .map_err(|e| HandlerError::unknown(format!("lost track of {:?}: {e}", command[0])))?;
    match status.code() {
        Some(0) => Ok(out),
        Some(EX_TEMPFAIL) => Err(HandlerError::not_applied(
            "command exited with status 75 (EX_TEMPFAIL)",
        )),
        _ => Err(HandlerError::unknown(crate::shell_jobs::exit_description(
            status,
        ))),
    }
}
