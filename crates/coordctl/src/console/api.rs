//! The JSON API under `/api/`: each listing answers the same view its page
//! shows, bounded by `?limit=` and `?after=`, and every failure is
//! `{"error": "..."}` with the status of the page's error.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use axum::routing::{get, MethodRouter};

use super::{job_runs, json_answer, read_listing, ListQuery, ReadPage, Shared};

/// `GET` of a listing's JSON answer: the page from the query, then `read` it.
pub(super) fn api_listing<T>(read: ReadPage<T>) -> MethodRouter<Shared>
where
    T: serde::Serialize + Send + 'static,
{
    get(
        move |State(state): State<Shared>, q: Result<Query<ListQuery>, QueryRejection>| async move {
            let view = read_listing(&state, q, read).await;
            json_answer(&state, view.map(|(_, view)| view))
        },
    )
}

pub(super) async fn api_job_runs(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    json_answer(&state, job_runs(&state, path, q).await)
}
