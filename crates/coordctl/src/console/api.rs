//! The JSON API under `/api/`: each listing answers the same view its page
//! shows, bounded by `?limit=` and `?after=`, and every failure is
//! `{"error": "..."}` with the status of the page's error.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::Response;
use coord_backend::Error;

use super::{
    job_name, json_answer, page_of, parse_limit, query, AppState, Failure, ListQuery, Shared,
    DEFAULT_LIMIT, DEFAULT_RUNS, RECENT_RUNS,
};
use crate::views::{self, Page};

/// A listing's JSON answer: the page from the query, then `read` it.
async fn api_list<T, Fut>(
    state: &AppState,
    q: Result<Query<ListQuery>, QueryRejection>,
    read: impl FnOnce(Page) -> Fut,
) -> Response
where
    T: serde::Serialize,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let result = match query(q).and_then(|q| page_of(&q, DEFAULT_LIMIT)) {
        Ok(page) => read(page).await.map_err(Failure::store),
        Err(f) => Err(f),
    };
    json_answer(state, result)
}

pub(super) async fn api_locks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::locks(stores, &page).await
    })
    .await
}

pub(super) async fn api_elections(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::elections(stores, &page).await
    })
    .await
}

pub(super) async fn api_rwlocks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::rwlocks(stores, &page).await
    })
    .await
}

pub(super) async fn api_fair_locks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::fair_locks(stores, &page).await
    })
    .await
}

pub(super) async fn api_semaphores(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::semaphores(stores, &page).await
    })
    .await
}

pub(super) async fn api_resources(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::resources(stores, None, Some(&page)).await
    })
    .await
}

pub(super) async fn api_tasks(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::tasks(stores, &page).await
    })
    .await
}

pub(super) async fn api_side_effects(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::side_effects(stores, None, Some(&page), false).await
    })
    .await
}

pub(super) async fn api_jobs(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let stores = &state.stores;
    api_list(&state, q, |page| async move {
        views::jobs(stores, &page, RECENT_RUNS).await
    })
    .await
}

pub(super) async fn api_job_runs(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let job = job_name(path)?;
        let limit = parse_limit(query(q)?.limit.as_deref(), DEFAULT_RUNS)?;
        views::runs(&state.stores.runs, &job, limit, None)
            .await
            .map_err(Failure::store)
    }
    .await;
    json_answer(&state, result)
}
