//! The default task board (`/api/tasks`): each task's state, agent, lease,
//! dependencies and queue fields; and its work queues (`/api/queues`): each
//! queue's counts and its dead tasks with their errors. Payloads and results
//! belong to the application and are not shown; a task listed but gone by
//! the time it is read is left out.

use coord_adapters::board::{Board, BoardError, DeadTask, Task, TaskState};
use coord_backend::Error;
use serde::Serialize;

use super::{board_error, ms, now_ms, read_page, shorten, Page, Paged, Row, Stores};

/// Task records of the default board (`BoardOptions::default`, prefix `board/`).
const TASK_PREFIX: &str = "board/task/";

/// The most keys one count of a queue's index reads (past it the count is
/// a lower bound, flagged `*_more`).
const COUNT_LIMIT: usize = 10_000;

/// The longest last error shown (in characters; longer ones end in `…`).
const MAX_ERROR: usize = 1000;

/// One task of the board (no payload, no result: those are the application's values).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TaskView {
    pub(crate) id: String,
    /// `open`, `claimed`, `expired`, `completed`, `dead` or `cancelled`.
    pub(crate) state: &'static str,
    /// Who holds (claimed), held (expired) or completed it.
    pub(crate) agent: Option<String>,
    /// When the claim's lease ends (claimed) or ended (expired), UTC ms.
    pub(crate) lease_expires_ms: Option<u64>,
    /// The fence of the latest claim (0 = never claimed).
    pub(crate) fence: u64,
    pub(crate) deps: Vec<String>,
    /// Its work queue, if any.
    pub(crate) queue: Option<String>,
    /// Its priority in its queue (higher first).
    pub(crate) priority: i16,
    /// Attempts counted so far, and allowed (`None`: no limit).
    pub(crate) attempts: u32,
    pub(crate) max_attempts: Option<u32>,
    /// The error of its last failed attempt (cut to 1,000 characters).
    pub(crate) last_error: Option<String>,
    /// Not claimable before this time (a run-at or a backoff still ahead), UTC ms.
    pub(crate) not_before_ms: Option<u64>,
}

impl Row for TaskView {
    const FIELD: &'static str = "tasks";
}

/// The tasks of one page.
pub(crate) type TasksView = Paged<TaskView>;

/// `task` as a row.
fn task_view(task: Task) -> TaskView {
    let (state, agent, lease) = match task.state {
        TaskState::Open => ("open", None, None),
        TaskState::Claimed { agent, expires_at } => ("claimed", Some(agent), Some(expires_at)),
        TaskState::Expired { agent, expired_at } => ("expired", Some(agent), Some(expired_at)),
        TaskState::Completed { agent, .. } => ("completed", Some(agent), None),
        TaskState::Dead { .. } => ("dead", None, None),
        TaskState::Cancelled => ("cancelled", None, None),
        TaskState::Uncertain { .. } => ("uncertain", None, None),
        _ => ("unknown", None, None),
    };
    TaskView {
        id: task.id,
        state,
        agent,
        lease_expires_ms: lease.map(ms),
        fence: task.fence,
        deps: task.deps,
        queue: task.queue,
        priority: task.priority,
        attempts: task.attempts,
        max_attempts: task.max_attempts,
        last_error: task.last_error.map(|e| shorten(&e, MAX_ERROR)),
        not_before_ms: task.not_before.map(ms),
    }
}

/// The tasks of `page`.
pub(crate) async fn tasks(stores: &Stores, page: &Page) -> Result<TasksView, Error> {
    read_page(stores, TASK_PREFIX, page, |id| async move {
        match stores.board.get(&id).await {
            Ok(task) => Ok(Some(task_view(task))),
            // Listed but gone: skipped, not invented.
            Err(BoardError::NotFound { .. }) => Ok(None),
            Err(e) => Err(board_error(e)),
        }
    })
    .await
}

/// One task by id (`None`: no such task), as a row of [`tasks`] shows it.
pub(crate) async fn task(stores: &Stores, id: &str) -> Result<Option<TaskView>, Error> {
    match stores.board.get(id).await {
        Ok(task) => Ok(Some(task_view(task))),
        Err(BoardError::NotFound { .. }) => Ok(None),
        Err(e) => Err(board_error(e)),
    }
}

/// A dead task of a queue.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DeadTaskView {
    /// When it died, UTC ms.
    pub(crate) died_ms: u64,
    #[serde(flatten)]
    pub(crate) task: TaskView,
}

/// One work queue: its counts (each `*_more` = the count stopped at 10,000
/// keys, a lower bound) and its first dead tasks, longest dead first.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct QueueView {
    pub(crate) queue: String,
    pub(crate) ready: usize,
    pub(crate) ready_more: bool,
    pub(crate) timed: usize,
    pub(crate) timed_more: bool,
    /// ready + timed.
    pub(crate) depth: usize,
    pub(crate) dead: usize,
    pub(crate) dead_more: bool,
    /// Since when the task ready longest is ready, UTC ms (`None`: none is).
    pub(crate) oldest_ready_ms: Option<u64>,
    /// How long that is, ms.
    pub(crate) oldest_ready_age_ms: Option<u64>,
    /// The first `limit` dead tasks.
    pub(crate) dead_tasks: Vec<DeadTaskView>,
    /// More dead tasks than listed.
    pub(crate) dead_tasks_more: bool,
}

/// The queues of the default board (`/api/queues`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct QueuesView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) queues: Vec<QueueView>,
    /// More queues than `limit`.
    pub(crate) truncated: bool,
}

/// The first `page.limit` queues (by name), each with its first
/// `page.limit` dead tasks. `page.after` is not used (queue names are few).
pub(crate) async fn queues(stores: &Stores, page: &Page) -> Result<QueuesView, Error> {
    let board = &stores.board;
    let names = board.queues(page.limit).await.map_err(board_error)?;
    let mut queues = Vec::with_capacity(names.names.len());
    for queue in names.names {
        let depth = board
            .queue_depth(&queue, COUNT_LIMIT)
            .await
            .map_err(board_error)?;
        let dead = board
            .dead_tasks(&queue, page.limit)
            .await
            .map_err(board_error)?;
        let total = depth.depth();
        queues.push(QueueView {
            ready: depth.ready.count,
            ready_more: depth.ready.more,
            timed: depth.timed.count,
            timed_more: depth.timed.more,
            depth: total.count,
            dead: depth.dead.count,
            dead_more: depth.dead.more,
            oldest_ready_ms: depth.oldest_ready_since.map(ms),
            oldest_ready_age_ms: depth
                .oldest_ready_age
                .map(|age| u64::try_from(age.as_millis()).unwrap_or(u64::MAX)),
            dead_tasks: dead_views(dead.tasks),
            dead_tasks_more: dead.more,
            queue,
        });
    }
    Ok(QueuesView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        queues,
        truncated: names.more,
    })
}

/// `dead` as rows.
fn dead_views(dead: Vec<DeadTask>) -> Vec<DeadTaskView> {
    dead.into_iter()
        .map(|d| DeadTaskView {
            died_ms: ms(d.died_at),
            task: task_view(d.task),
        })
        .collect()
}

/// One queue's dead tasks (`coordctl board dead`): the first `limit`,
/// longest dead first, as [`QueueView::dead_tasks`] lists them.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct DeadTasksView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) queue: String,
    pub(crate) dead_tasks: Vec<DeadTaskView>,
    /// More dead tasks than listed.
    pub(crate) dead_tasks_more: bool,
}

/// The first `limit` dead tasks of `queue`.
pub(crate) async fn dead_tasks(
    stores: &Stores,
    queue: &str,
    limit: usize,
) -> Result<DeadTasksView, Error> {
    let dead = stores
        .board
        .dead_tasks(queue, limit)
        .await
        .map_err(board_error)?;
    Ok(DeadTasksView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        queue: queue.to_owned(),
        dead_tasks: dead_views(dead.tasks),
        dead_tasks_more: dead.more,
    })
}

/// What the task page shows: the queues, then the tasks.
#[derive(Clone, Debug)]
pub(crate) struct TaskPageView {
    pub(crate) queues: QueuesView,
    pub(crate) tasks: TasksView,
}

/// The task page's view of `page`.
pub(crate) async fn task_page(stores: &Stores, page: &Page) -> Result<TaskPageView, Error> {
    Ok(TaskPageView {
        queues: queues(stores, &Page::first(page.limit)).await?,
        tasks: tasks(stores, page).await?,
    })
}
