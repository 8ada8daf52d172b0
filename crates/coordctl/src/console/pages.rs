//! The HTML pages, `/metrics` and the answer for unknown paths. A page reads
//! the same views as its API twin and renders them through `html`; a store
//! failure becomes an error page, never an empty listing.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{
    html, html_answer, job_name, page_of, parse_cursor, parse_limit, query, Failure, ListQuery,
    Shared, DEFAULT_LIMIT, DEFAULT_RUNS, RECENT_RUNS,
};
use crate::views::{self, Page};

pub(super) async fn overview_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        query(q)?;
        let page = Page::first(DEFAULT_LIMIT);
        let s = &state.stores;
        let locks = views::locks(s, &page).await.map_err(Failure::store)?;
        let tasks = views::tasks(s, &page).await.map_err(Failure::store)?;
        let effects = views::side_effects(s, None, Some(&page), false)
            .await
            .map_err(Failure::store)?;
        let jobs = views::jobs(s, &page, 1).await.map_err(Failure::store)?;
        Ok((
            "Overview".to_owned(),
            "/",
            html::overview(&locks, &tasks, &effects, &jobs),
        ))
    }
    .await;
    html_answer(&state, result)
}

pub(super) async fn locks_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let q = query(q)?;
        let page = page_of(&q, DEFAULT_LIMIT)?;
        let cursor = |raw: Option<&str>| -> Result<Page, Failure> {
            Ok(Page {
                limit: page.limit,
                after: parse_cursor(raw)?,
            })
        };
        let (res_page, fair_page, sem_page) = (
            cursor(q.res_after.as_deref())?,
            cursor(q.fair_after.as_deref())?,
            cursor(q.sem_after.as_deref())?,
        );
        let s = &state.stores;
        let locks = views::locks(s, &page).await.map_err(Failure::store)?;
        let resources = views::resources(s, None, Some(&res_page))
            .await
            .map_err(Failure::store)?;
        let fair = views::fair_locks(s, &fair_page)
            .await
            .map_err(Failure::store)?;
        let semaphores = views::semaphores(s, &sem_page)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Locks held".to_owned(),
            "/locks",
            html::locks(
                &html::LockViews {
                    locks: &locks,
                    resources: &resources,
                    fair: &fair,
                    semaphores: &semaphores,
                },
                page.limit,
            ),
        ))
    }
    .await;
    html_answer(&state, result)
}

pub(super) async fn leaders_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let q = query(q)?;
        let page = page_of(&q, DEFAULT_LIMIT)?;
        let rw_page = Page {
            limit: page.limit,
            after: parse_cursor(q.rw_after.as_deref())?,
        };
        let elections = views::elections(&state.stores, &page)
            .await
            .map_err(Failure::store)?;
        let rwlocks = views::rwlocks(&state.stores, &rw_page)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Leaders and read-write locks".to_owned(),
            "/leaders",
            html::leaders(&elections, &rwlocks, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

pub(super) async fn tasks_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
        let view = views::tasks(&state.stores, &page)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Task board".to_owned(),
            "/tasks",
            html::tasks(&view, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

pub(super) async fn side_effects_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
        let view = views::side_effects(&state.stores, None, Some(&page), false)
            .await
            .map_err(Failure::store)?;
        let writes = html::Writes { csrf: &state.csrf };
        Ok((
            "Side-effect keys needing attention".to_owned(),
            "/sideeffects",
            html::side_effects(
                &view,
                &state.command_url,
                state.allow_writes.then_some(&writes),
                page.limit,
            ),
        ))
    }
    .await;
    html_answer(&state, result)
}

pub(super) async fn jobs_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let page = page_of(&query(q)?, DEFAULT_LIMIT)?;
        let view = views::jobs(&state.stores, &page, RECENT_RUNS)
            .await
            .map_err(Failure::store)?;
        Ok((
            "Scheduler jobs".to_owned(),
            "/jobs",
            html::jobs(&view, page.limit),
        ))
    }
    .await;
    html_answer(&state, result)
}

pub(super) async fn job_page(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let job = job_name(path)?;
        let limit = parse_limit(query(q)?.limit.as_deref(), DEFAULT_RUNS)?;
        let view = views::runs(&state.stores.runs, &job, limit, None)
            .await
            .map_err(Failure::store)?;
        Ok((format!("Job {job}"), "/jobs", html::job_runs(&view)))
    }
    .await;
    html_answer(&state, result)
}

/// Prometheus text of this process's metrics (docs/operations.md), behind
/// the same Host guard as every page.
pub(super) async fn metrics_text(State(state): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&state.metrics, Some(&state.uncertain)).await,
    )
        .into_response()
}

pub(super) async fn not_found(State(state): State<Shared>, request: Request) -> Response {
    let json = request.uri().path().starts_with("/api/");
    Failure::new(
        StatusCode::NOT_FOUND,
        "no such page (pages: /, /locks, /leaders, /tasks, /sideeffects, /jobs, /jobs/JOB; API: /api/locks, \
/api/elections, /api/rwlocks, /api/fairlocks, /api/semaphores, /api/resources, /api/tasks, /api/sideeffects, /api/jobs, /api/jobs/JOB/runs)",
    )
    .respond(&state, json)
}
