//! The default task board (`/api/tasks`): each task's state, agent, lease and
//! dependencies. Payloads and results belong to the application and are not
//! shown; a task listed but gone by the time it is read is left out.

use coord_adapters::board::{Board, BoardError, TaskState};
use coord_backend::Error;
use serde::Serialize;

use super::{board_error, ms, read_page, Page, Paged, Row, Stores};

/// Task records of the default board (`BoardOptions::default`, prefix `board/`).
const TASK_PREFIX: &str = "board/task/";

/// One task of the board (no payload, no result: those are the application's values).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TaskView {
    pub(crate) id: String,
    /// `open`, `claimed`, `expired` or `completed`.
    pub(crate) state: &'static str,
    /// Who holds (claimed), held (expired) or completed it.
    pub(crate) agent: Option<String>,
    /// When the claim's lease ends (claimed) or ended (expired), UTC ms.
    pub(crate) lease_expires_ms: Option<u64>,
    /// The fence of the latest claim (0 = never claimed).
    pub(crate) fence: u64,
    pub(crate) deps: Vec<String>,
}

impl Row for TaskView {
    const FIELD: &'static str = "tasks";
}

/// The tasks of one page.
pub(crate) type TasksView = Paged<TaskView>;

/// The tasks of `page`.
pub(crate) async fn tasks(stores: &Stores, page: &Page) -> Result<TasksView, Error> {
    read_page(stores, TASK_PREFIX, page, |id| async move {
        let task = match stores.board.get(&id).await {
            Ok(task) => task,
            // Listed but gone: skipped, not invented.
            Err(BoardError::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(board_error(e)),
        };
        let (state, agent, lease) = match task.state {
            TaskState::Open => ("open", None, None),
            TaskState::Claimed { agent, expires_at } => ("claimed", Some(agent), Some(expires_at)),
            TaskState::Expired { agent, expired_at } => ("expired", Some(agent), Some(expired_at)),
            TaskState::Completed { agent, .. } => ("completed", Some(agent), None),
            _ => ("unknown", None, None),
        };
        Ok(Some(TaskView {
            id: task.id,
            state,
            agent,
            lease_expires_ms: lease.map(ms),
            fence: task.fence,
            deps: task.deps,
        }))
    })
    .await
}
