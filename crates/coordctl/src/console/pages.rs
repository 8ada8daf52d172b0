//! The HTML pages, `/metrics` and the answer for unknown paths. A page reads
//! the same views as its API twin and renders them through `html`; a store
//! failure becomes an error page, never an empty listing.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, MethodRouter};

use super::{
    html, html_answer, job_runs, page_of, parse_cursor, query, read_listing, Answer, AppState,
    Failure, ListQuery, ReadPage, Shared, DEFAULT_LIMIT,
};
use crate::views::{self, Page, RunsView};

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

/// The page of a second listing shown beside `page`'s: the same limit, its
/// own cursor (`?res_after=` on the locks page, ...).
fn beside(page: &Page, cursor: Option<&str>) -> Answer<Page> {
    Ok(Page {
        limit: page.limit,
        after: parse_cursor(cursor)?,
    })
}

pub(super) async fn locks_page(
    State(state): State<Shared>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let result = async {
        let q = query(q)?;
        let page = page_of(&q, DEFAULT_LIMIT)?;
        let (res_page, fair_page, sem_page) = (
            beside(&page, q.res_after.as_deref())?,
            beside(&page, q.fair_after.as_deref())?,
            beside(&page, q.sem_after.as_deref())?,
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
        let rw_page = beside(&page, q.rw_after.as_deref())?;
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

/// `GET` of a page showing one listing: the page from the query, the view
/// `read` for it, then `render`ed with the console's state and the limit.
pub(super) fn listing_page<T>(
    title: &'static str,
    nav: &'static str,
    read: ReadPage<T>,
    render: fn(&T, &AppState, usize) -> String,
) -> MethodRouter<Shared>
where
    T: Send + 'static,
{
    get(
        move |State(state): State<Shared>, q: Result<Query<ListQuery>, QueryRejection>| async move {
            let result = read_listing(&state, q, read)
                .await
                .map(|(page, view)| (title.to_owned(), nav, render(&view, &state, page.limit)));
            html_answer(&state, result)
        },
    )
}

pub(super) async fn job_page(
    State(state): State<Shared>,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Response {
    let page = |view: RunsView| (format!("Job {}", view.job), "/jobs", html::job_runs(&view));
    html_answer(&state, job_runs(&state, path, q).await.map(page))
}

/// Prometheus text of this process's metrics (docs/operations.md), behind
/// the same Host guard as every page.
pub(super) async fn metrics_text(State(state): State<Shared>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(&state.metrics, Some(&state.uncertain), Some(&state.queues)).await,
    )
        .into_response()
}

pub(super) async fn not_found(State(state): State<Shared>, request: Request) -> Response {
    let json = request.uri().path().starts_with("/api/");
    Failure::new(
        StatusCode::NOT_FOUND,
        "no such page (pages: /, /locks, /leaders, /tasks, /sideeffects, /jobs, /jobs/JOB; API: /api/locks, \
/api/elections, /api/rwlocks, /api/fairlocks, /api/semaphores, /api/resources, /api/tasks, /api/queues, /api/sideeffects, \
/api/jobs, /api/jobs/JOB/runs)",
    )
    .respond(&state, json)
}
