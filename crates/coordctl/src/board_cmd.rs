//! `coordctl board`: the operator's view of the task board and its work
//! queues (docs/queue.md, "Watching a queue"), and the two operator writes,
//! `retry` of a dead task and `cancel`.
//!
//! # Contract
//!
//! - The reads (`queues`, `list`, `show`, `dead`) build the same
//!   [`crate::views`] values as the web console's task page and its
//!   `/api/queues` and `/api/tasks` answers, so text, `--json` and console
//!   agree; `--json` prints that value (one line, schema in docs/console.md),
//!   the tables are rendered from it. No payload, result or token is shown.
//! - `list --queue/--state` pages past the tasks that do not match: it reads
//!   pages of the board (by id) until it has `--limit` matching tasks, the
//!   board ends, or it has read [`SCAN_LIMIT`] tasks; then `next_after` is
//!   the cursor to continue from (`--after`).
//! - The writes go through the adapter (`Board::retry_dead`, `Board::cancel`)
//!   after reading the task, so an operator is told what state it was in.
//!   The adapter's calls are idempotent (a retry of a task that is not dead
//!   does nothing); this command makes "nothing to do" a refusal instead.
//! - Exit codes: 0 done (for a write: it changed the task), 3 nothing
//!   changed (no such task, or not in a state the write applies to),
//!   1 the store failed, 2 bad arguments (clap's usage error: an empty id,
//!   a `--limit` of 0 or above [`views::MAX_LIMIT`], an unknown state).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use coord_adapters::board::{
    validate_queue, validate_task_id, Board, BoardError, RetryPolicy, TaskSpec,
};
use coord_backend::Error;

use crate::cron::fmt_time;
use crate::views::{
    self, shorten, span, DeadTasksView, Page, QueuesView, Stores, TaskView, TasksView,
};

/// The most tasks one `list --queue/--state` reads looking for matches.
const SCAN_LIMIT: usize = 10_000;

/// The exit code of a refused write or a missing task: nothing changed.
const NOTHING_CHANGED: u8 = 3;

/// The task states a view names (`--state`).
const STATES: [&str; 6] = [
    "open",
    "claimed",
    "expired",
    "completed",
    "dead",
    "cancelled",
];

/// Arguments of `coordctl board`.
#[derive(Args)]
pub(crate) struct BoardArgs {
    #[command(subcommand)]
    command: BoardCommand,
}

#[derive(Subcommand)]
enum BoardCommand {
    /// One row per work queue: depth, ready, timed, dead, age of the oldest ready task.
    Queues(QueuesArgs),
    /// Tasks by id (state, queue, priority, attempts, agent, not-before, last error), paged.
    List(ListArgs),
    /// One task: every field the views show (no payload, result or token).
    Show(ShowArgs),
    /// A queue's dead tasks, longest dead first: when each died, its attempts and last error.
    Dead(DeadArgs),
    /// Make a dead task claimable again, its attempts counted from zero (exit 3: not dead, nothing changed).
    Retry(WriteArgs),
    /// Cancel a task that is not completed: never claimed again (exit 3: completed or cancelled already).
    Cancel(WriteArgs),
    /// Put a task in a queue (a no-op when it exists with the same content).
    Add(AddArgs),
}

/// `--store`, as every command takes it.
#[derive(Args)]
struct StoreArg {
    /// Store URL (with `?namespace=NS` when the application uses one).
    #[arg(long, env = crate::STORE_ENV, hide_env_values = true)]
    store: String,
}

/// `--limit N`: 1 to [`views::MAX_LIMIT`].
fn limit(text: &str) -> Result<usize, String> {
    let n: usize = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if n == 0 || n > views::MAX_LIMIT {
        return Err(format!("must be 1 to {}, got {n}", views::MAX_LIMIT));
    }
    Ok(n)
}

/// A task id: non-empty, no NUL (the board's rule).
fn task_id(text: &str) -> Result<String, String> {
    validate_task_id(text).map_err(|_| "a task id must be non-empty, without NUL".to_owned())?;
    Ok(text.to_owned())
}

/// A queue name: non-empty, no `/` or NUL (the board's rule).
fn queue_name(text: &str) -> Result<String, String> {
    validate_queue(text).map_err(|e| e.to_string())?;
    Ok(text.to_owned())
}

#[derive(Args)]
struct QueuesArgs {
    #[command(flatten)]
    store: StoreArg,
    /// At most this many queues (by name; 1 to 500), and in `--json` this many dead tasks each.
    #[arg(long, default_value = "100", value_parser = limit)]
    limit: usize,
    /// Print one JSON document (the `/api/queues` answer, docs/console.md).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ListArgs {
    #[command(flatten)]
    store: StoreArg,
    /// Only tasks of this queue (pages past the others, reading at most 10,000 tasks).
    #[arg(long, value_parser = queue_name)]
    queue: Option<String>,
    /// Only tasks in this state (pages past the others, reading at most 10,000 tasks).
    #[arg(long, value_parser = STATES)]
    state: Option<String>,
    /// At most this many tasks (1 to 500).
    #[arg(long, default_value = "100", value_parser = limit)]
    limit: usize,
    /// Only tasks whose id sorts after this one (the `next_after` of the previous page).
    #[arg(long)]
    after: Option<String>,
    /// Print one JSON document (the `/api/tasks` shape, docs/console.md).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct ShowArgs {
    /// The task's id.
    #[arg(value_parser = task_id)]
    id: String,
    #[command(flatten)]
    store: StoreArg,
    /// Print the task as one JSON object (a row of `/api/tasks`).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct DeadArgs {
    /// The queue.
    #[arg(value_parser = queue_name)]
    queue: String,
    #[command(flatten)]
    store: StoreArg,
    /// At most this many dead tasks (1 to 500).
    #[arg(long, default_value = "100", value_parser = limit)]
    limit: usize,
    /// Print one JSON document (`dead_tasks` as `/api/queues` lists them).
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct WriteArgs {
    /// The task's id.
    #[arg(value_parser = task_id)]
    id: String,
    #[command(flatten)]
    store: StoreArg,
}

#[derive(Args)]
struct AddArgs {
    /// The task's id.
    #[arg(value_parser = task_id)]
    id: String,
    #[command(flatten)]
    store: StoreArg,
    /// Its queue.
    #[arg(long, value_parser = queue_name)]
    queue: String,
    /// Its payload, as text (UTF-8 bytes).
    #[arg(long, default_value = "")]
    payload: String,
    /// Higher priorities are claimed first.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    priority: i16,
    /// Attempts before it is dead (default: retried for ever).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Not claimed before this time: RFC 3339 (`2026-12-05T23:00:00Z`) or `+DURATION` (`+5m`).
    #[arg(long, value_parser = run_at)]
    run_at: Option<std::time::SystemTime>,
}

/// `--run-at`: an RFC 3339 time, or `+DURATION` from now.
fn run_at(text: &str) -> Result<std::time::SystemTime, String> {
    if let Some(after) = text.strip_prefix('+') {
        let wait = coord_scheduler::parse_duration(after)?;
        return std::time::SystemTime::now()
            .checked_add(wait)
            .ok_or_else(|| format!("{text:?} is too far ahead"));
    }
    let at = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("{text:?}: {e} (write an RFC 3339 time or +DURATION)"))?;
    let ms =
        u64::try_from(at.timestamp_millis()).map_err(|_| format!("{text:?} is before 1970"))?;
    Ok(std::time::UNIX_EPOCH + Duration::from_millis(ms))
}

/// `coordctl board …`.
pub(crate) async fn run(args: BoardArgs) -> Result<ExitCode, Error> {
    match args.command {
        BoardCommand::Queues(a) => queues(a).await,
        BoardCommand::List(a) => list(a).await,
        BoardCommand::Show(a) => show(a).await,
        BoardCommand::Dead(a) => dead(a).await,
        BoardCommand::Retry(a) => retry(a).await,
        BoardCommand::Cancel(a) => cancel(a).await,
        BoardCommand::Add(a) => add(a).await,
    }
}

async fn open(store: &StoreArg) -> Result<Stores, Error> {
    let stores = Stores::new(coord::connect(&store.store).await?)?;
    crate::warn_about_deployment(&store.store).await;
    Ok(stores)
}

fn refuse(what: &str, message: String) -> Result<ExitCode, Error> {
    eprintln!("coordctl board {what}: {message}");
    Ok(ExitCode::from(NOTHING_CHANGED))
}

/// Store errors pass through; a refusal the command did not foresee is
/// reported with its text (nothing changed: the adapter's refusals never write).
fn refused(what: &str, e: BoardError) -> Result<ExitCode, Error> {
    match e {
        BoardError::Store(e) => Err(e),
        BoardError::NotFound { id } => refuse(what, format!("no task {id:?} on the board")),
        other => refuse(what, format!("{other}; nothing changed")),
    }
}

/// A bounded count: `1000+` when it is a lower bound.
fn count(n: usize, more: bool) -> String {
    if more {
        format!("{n}+")
    } else {
        n.to_string()
    }
}

/// "2026-…Z (in 9m 53s)" / "2026-…Z (4.2s ago)" / "-".
fn when(at_ms: Option<u64>, now_ms: u64) -> String {
    match at_ms {
        None => "-".into(),
        Some(at) if at >= now_ms => format!("{} (in {})", fmt_time(at, None), span(at - now_ms)),
        Some(at) => format!("{} ({} ago)", fmt_time(at, None), span(now_ms - at)),
    }
}

/// "1/3", or "1/-" without a limit.
fn attempts(task: &TaskView) -> String {
    match task.max_attempts {
        Some(max) => format!("{}/{max}", task.attempts),
        None => format!("{}/-", task.attempts),
    }
}

async fn queues(args: QueuesArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let view = views::queues(&stores, &Page::first(args.limit)).await?;
    if args.json {
        views::print_json(&view)?;
    } else {
        print_queues(&view);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_queues(view: &QueuesView) {
    println!(
        "coordctl board queues: namespace {:?}, {} queue(s){}",
        view.namespace,
        view.queues.len(),
        if view.truncated {
            " (more: raise --limit)"
        } else {
            ""
        }
    );
    if view.queues.is_empty() {
        return;
    }
    println!(
        "{:<24} {:>7} {:>7} {:>7} {:>7}  oldest ready",
        "queue", "depth", "ready", "timed", "dead"
    );
    for q in &view.queues {
        println!(
            "{:<24} {:>7} {:>7} {:>7} {:>7}  {}{}",
            q.queue,
            count(q.depth, q.ready_more || q.timed_more),
            count(q.ready, q.ready_more),
            count(q.timed, q.timed_more),
            count(q.dead, q.dead_more),
            q.oldest_ready_age_ms.map_or("-".into(), span),
            if q.ready_more && q.oldest_ready_age_ms.is_some() {
                "+"
            } else {
                ""
            },
        );
    }
    println!(
        "(+: a lower bound, the count stopped at 10,000; dead tasks: `coordctl board dead QUEUE`)"
    );
}

/// The tasks of `page` that match `keep`, reading further pages until
/// `page.limit` match, the board ends or [`SCAN_LIMIT`] tasks were read.
async fn matching(
    stores: &Stores,
    page: &Page,
    keep: impl Fn(&TaskView) -> bool,
) -> Result<TasksView, Error> {
    let mut read = 0;
    let mut cursor = Page {
        limit: page.limit,
        after: page.after.clone(),
    };
    let mut found = views::tasks(stores, &cursor).await?;
    let mut rows = Vec::new();
    loop {
        let more = found.listing.truncated;
        let next = found.listing.next_after.clone();
        read += found.rows.len();
        let mut taken = found.rows.into_iter();
        for task in taken.by_ref() {
            if keep(&task) {
                rows.push(task);
                if rows.len() == page.limit {
                    break;
                }
            }
        }
        let left = taken.len() > 0;
        if rows.len() == page.limit {
            // Full: continue after the last task shown.
            found.listing.truncated = left || more;
            found.listing.next_after = found
                .listing
                .truncated
                .then(|| rows.last().map(|t| t.id.clone()))
                .flatten();
            break;
        }
        if !more || read >= SCAN_LIMIT {
            found.listing.truncated = more;
            found.listing.next_after = next;
            break;
        }
        cursor.after = next;
        found = views::tasks(stores, &cursor).await?;
    }
    found.rows = rows;
    Ok(found)
}

async fn list(args: ListArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let page = Page {
        limit: args.limit,
        after: args.after.clone(),
    };
    let view = if args.queue.is_none() && args.state.is_none() {
        views::tasks(&stores, &page).await?
    } else {
        matching(&stores, &page, |t| {
            args.queue
                .as_deref()
                .is_none_or(|q| t.queue.as_deref() == Some(q))
                && args.state.as_deref().is_none_or(|s| t.state == s)
        })
        .await?
    };
    if args.json {
        views::print_json(&view)?;
    } else {
        print_tasks(&view);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_tasks(view: &TasksView) {
    let now = view.listing.now_ms;
    println!(
        "coordctl board list: namespace {:?}, {} task(s)",
        view.listing.namespace,
        view.rows.len()
    );
    if !view.rows.is_empty() {
        println!(
            "{:<28} {:<16} {:<9} {:>4} {:>8} {:<16} {:<40} last error",
            "id", "queue", "state", "prio", "attempts", "agent", "not before"
        );
    }
    for t in &view.rows {
        println!(
            "{:<28} {:<16} {:<9} {:>4} {:>8} {:<16} {:<40} {}",
            t.id,
            t.queue.as_deref().unwrap_or("-"),
            t.state,
            t.priority,
            attempts(t),
            t.agent.as_deref().unwrap_or("-"),
            when(t.not_before_ms, now),
            t.last_error
                .as_deref()
                .map_or("-".into(), |e| shorten(e, 80)),
        );
    }
    if let Some(after) = &view.listing.next_after {
        println!("more tasks may follow: --after {after:?}");
    }
}

async fn show(args: ShowArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let Some(task) = views::task(&stores, &args.id).await? else {
        return refuse("show", format!("no task {:?} on the board", args.id));
    };
    if args.json {
        views::print_json(&task)?;
    } else {
        print_task(&task, views::ms(std::time::SystemTime::now()));
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn print_task(t: &TaskView, now: u64) {
    let lease = |label: &str| println!("{label:<14}{}", when(t.lease_expires_ms, now));
    println!("{:<14}{}", "id", t.id);
    println!("{:<14}{}", "state", t.state);
    println!("{:<14}{}", "queue", t.queue.as_deref().unwrap_or("-"));
    println!("{:<14}{}", "priority", t.priority);
    println!("{:<14}{}", "attempts", attempts(t));
    println!("{:<14}{}", "agent", t.agent.as_deref().unwrap_or("-"));
    match t.state {
        "claimed" => lease("lease ends"),
        "expired" => lease("lease ended"),
        _ => {}
    }
    println!("{:<14}{}", "fence", t.fence);
    println!("{:<14}{}", "not before", when(t.not_before_ms, now));
    println!(
        "{:<14}{}",
        "deps",
        if t.deps.is_empty() {
            "-".to_owned()
        } else {
            t.deps.join(", ")
        }
    );
    println!(
        "{:<14}{}",
        "last error",
        t.last_error.as_deref().unwrap_or("-")
    );
}

async fn dead(args: DeadArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let view = views::dead_tasks(&stores, &args.queue, args.limit).await?;
    if args.json {
        views::print_json(&view)?;
    } else {
        print_dead(&view);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_dead(view: &DeadTasksView) {
    println!(
        "coordctl board dead: namespace {:?}, queue {:?}, {} dead task(s){}",
        view.namespace,
        view.queue,
        view.dead_tasks.len(),
        if view.dead_tasks_more {
            " (more: raise --limit)"
        } else {
            ""
        }
    );
    if view.dead_tasks.is_empty() {
        return;
    }
    println!("{:<28} {:<40} {:>8}  error", "id", "died", "attempts");
    for d in &view.dead_tasks {
        println!(
            "{:<28} {:<40} {:>8}  {}",
            d.task.id,
            when(Some(d.died_ms), view.now_ms),
            attempts(&d.task),
            d.task
                .last_error
                .as_deref()
                .unwrap_or("(no error recorded)"),
        );
    }
    println!("retry one: coordctl board retry ID");
}

/// A task's state and error, as the writes report it.
fn describe(t: &TaskView) -> String {
    let mut text = format!("{}, attempts {}", t.state, attempts(t));
    if let Some(agent) = &t.agent {
        text.push_str(&format!(", agent {agent:?}"));
    }
    if let Some(error) = &t.last_error {
        text.push_str(&format!(", last error: {}", shorten(error, 200)));
    }
    text
}

async fn retry(args: WriteArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let id = &args.id;
    let Some(task) = views::task(&stores, id).await? else {
        return refuse("retry", format!("no task {id:?} on the board"));
    };
    // An uncertain task is retried on the operator's word that it did not run.
    if task.state != "dead" && task.state != "uncertain" {
        return refuse(
            "retry",
            format!(
                "task {id:?} is not dead ({}): nothing to retry, nothing changed",
                describe(&task)
            ),
        );
    }
    if let Err(e) = stores.board.retry_dead(id).await {
        return refused("retry", e);
    }
    println!("retried task {id:?}: was {}", describe(&task));
    match views::task(&stores, id).await? {
        Some(now) => println!(
            "now {} in queue {:?}, attempts {}",
            now.state,
            now.queue.as_deref().unwrap_or("-"),
            attempts(&now)
        ),
        None => println!("now gone from the board (pruned since)"),
    }
    Ok(ExitCode::SUCCESS)
}

async fn cancel(args: WriteArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let id = &args.id;
    let Some(task) = views::task(&stores, id).await? else {
        return refuse("cancel", format!("no task {id:?} on the board"));
    };
    match task.state {
        "completed" => {
            return refuse(
                "cancel",
                format!("task {id:?} is completed: nothing to cancel, nothing changed"),
            )
        }
        "cancelled" => {
            return refuse(
                "cancel",
                format!("task {id:?} is cancelled already: nothing changed"),
            )
        }
        _ => {}
    }
    if let Err(e) = stores.board.cancel(id).await {
        return refused("cancel", e);
    }
    println!("cancelled task {id:?}: was {}", describe(&task));
    if task.state == "claimed" {
        println!(
            "its holder {:?} finds its lease lost at its next renew or complete; work it already started is not stopped",
            task.agent.as_deref().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}

async fn add(args: AddArgs) -> Result<ExitCode, Error> {
    let stores = open(&args.store).await?;
    let mut spec = TaskSpec::new(args.id.clone(), args.payload.into_bytes())
        .in_queue(args.queue.clone())
        .with_priority(args.priority);
    if let Some(max) = args.max_attempts {
        spec = spec.with_retry(RetryPolicy::attempts(max));
    }
    if let Some(at) = args.run_at {
        spec = spec.with_run_at(at);
    }
    let existed = views::task(&stores, &args.id).await?.is_some();
    if let Err(e) = stores.board.add(spec).await {
        return refused("add", e);
    }
    if existed {
        println!(
            "task {:?} is on the board already with the same content: nothing changed",
            args.id
        );
    } else {
        println!("added task {:?} to queue {:?}", args.id, args.queue);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_ids_are_checked_before_the_store() {
        assert_eq!(limit("1"), Ok(1));
        assert_eq!(limit("500"), Ok(500));
        assert!(limit("0").is_err());
        assert!(limit("501").is_err());
        assert!(limit("x").is_err());
        assert!(task_id("").is_err());
        assert!(queue_name("a/b").is_err());
        assert!(run_at("+5m").is_ok());
        assert!(run_at("2026-12-05T23:00:00Z").is_ok());
        assert!(run_at("tomorrow").is_err());
    }
}
