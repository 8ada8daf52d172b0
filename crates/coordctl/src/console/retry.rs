//! `POST /retry`: retry a dead task of a work queue from the task page, the
//! console's second write, guarded as the reconcile form is (see
//! `reconcile.rs`): 403 unless the console was started with
//! `--allow-writes`, 403 for a form without this process's CSRF token (and
//! the Host guard in front of every route). A valid form first gets a
//! confirmation page showing the task's current state; only `confirm=yes`
//! calls `Board::retry_dead`, and prints which task was retried.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::StatusCode;
use axum::response::Response;
use coord_adapters::board::{Board, BoardError, TaskState};
use serde::Deserialize;

use super::{html, html_answer, Answer, AppState, Failure, Shared, MAX_TEXT};

/// The retry form (first step) and its confirmation (second step, `confirm=yes`).
#[derive(Debug, Deserialize)]
pub(super) struct RetryForm {
    csrf: String,
    id: String,
    confirm: Option<String>,
}

pub(super) async fn retry(
    State(state): State<Shared>,
    form: Result<Form<RetryForm>, FormRejection>,
) -> Response {
    let result = retry_step(&state, form).await;
    html_answer(&state, result)
}

/// A board error as the answer's status: refusals are the operator's to
/// read (404, 409, 400), store failures as every page's.
fn refused(e: BoardError) -> Failure {
    match e {
        BoardError::NotFound { id } => Failure::new(
            StatusCode::NOT_FOUND,
            format!("no task {id:?} on the board"),
        ),
        BoardError::Completed { id } => Failure::new(
            StatusCode::CONFLICT,
            format!("task {id:?} is completed: nothing to retry"),
        ),
        BoardError::Invalid(e) => Failure::bad_request(e.to_string()),
        BoardError::Store(e) => Failure::store(e),
        other => Failure::new(StatusCode::CONFLICT, other.to_string()),
    }
}

async fn retry_step(
    state: &AppState,
    form: Result<Form<RetryForm>, FormRejection>,
) -> Answer<(String, &'static str, String)> {
    if !state.allow_writes {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "this console is read-only: start `coordctl serve` with --allow-writes to retry tasks from it",
        ));
    }
    let Form(form) = form.map_err(|e| {
        Failure::bad_request(format!(
            "bad retry form: {} (fields: id, csrf, confirm=yes)",
            e.body_text()
        ))
    })?;
    if form.csrf != state.csrf {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "the form is stale or was not made by this console (reload the task page)",
        ));
    }
    let id = form.id;
    if id.is_empty() || id.len() > MAX_TEXT || id.contains('\0') {
        return Err(Failure::bad_request(format!(
            "the task id must be 1 to {MAX_TEXT} bytes without NUL"
        )));
    }
    let board = &state.stores.board;
    let task = board.get(&id).await.map_err(refused)?;
    let current = match &task.state {
        TaskState::Dead { error } => format!(
            "dead after {} attempt(s): {}",
            task.attempts,
            error.as_deref().unwrap_or("(no error recorded)")
        ),
        _ => {
            return Err(Failure::new(
                StatusCode::CONFLICT,
                format!("task {id:?} is not dead (retried already?): nothing to retry"),
            ))
        }
    };
    match form.confirm.as_deref() {
        None => Ok((
            "Confirm the retry".to_owned(),
            "/tasks",
            html::confirm_retry(&id, &current, &state.csrf),
        )),
        Some("yes") => {
            board.retry_dead(&id).await.map_err(refused)?;
            println!("coordctl serve: retried dead task {id:?} ({current})");
            Ok(("Retried".to_owned(), "/tasks", html::retried(&id)))
        }
        Some(_) => Err(Failure::bad_request("confirm must be `yes`")),
    }
}
