//! `POST /reconcile`, the console's one write. It answers 403 unless the
//! console was started with `--allow-writes`, and 403 for a form without
//! this process's CSRF token. A valid form first gets a confirmation page
//! showing the key's current state; only `confirm=yes` records the verdict,
//! through the same adapter path as `coordctl reconcile`, and prints who
//! decided what.

use axum::extract::rejection::FormRejection;
use axum::extract::{Form, State};
use axum::http::StatusCode;
use axum::response::Response;
use coord_adapters::sideeffect::KeyStatus;
use serde::Deserialize;

use super::{
    html, html_answer, Answer, AppState, Failure, Shared, CLAIM_TTL, MAX_RESULT, MAX_TEXT,
};
use crate::sideeffect_cmd::{resolve, Resolved, Verdict};
use crate::views::{self, side_effect_error};

/// The reconcile form (first step) and its confirmation (second step, `confirm=yes`).
#[derive(Debug, Deserialize)]
pub(super) struct ReconcileForm {
    csrf: String,
    key: String,
    /// `applied` or `not_applied`.
    verdict: String,
    reason: String,
    #[serde(default)]
    result: String,
    confirm: Option<String>,
}

pub(super) async fn reconcile(
    State(state): State<Shared>,
    form: Result<Form<ReconcileForm>, FormRejection>,
) -> Response {
    let result = reconcile_step(&state, form).await;
    html_answer(&state, result)
}

async fn reconcile_step(
    state: &AppState,
    form: Result<Form<ReconcileForm>, FormRejection>,
) -> Answer<(String, &'static str, String)> {
    if !state.allow_writes {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "this console is read-only: start `coordctl serve` with --allow-writes to reconcile from it",
        ));
    }
    let Form(form) = form.map_err(|e| {
        Failure::bad_request(format!(
            "bad reconcile form: {} (fields: key, verdict=applied|not_applied, reason, result, csrf)",
            e.body_text()
        ))
    })?;
    if form.csrf != state.csrf {
        return Err(Failure::new(
            StatusCode::FORBIDDEN,
            "the form is stale or was not made by this console (reload the side-effects page)",
        ));
    }
    let key = form.key;
    if key.is_empty() || key.len() > MAX_TEXT || key.contains('\0') {
        return Err(Failure::bad_request(format!(
            "the key must be 1 to {MAX_TEXT} bytes without NUL"
        )));
    }
    let reason = form.reason.trim().to_owned();
    if reason.is_empty() || reason.len() > MAX_TEXT {
        return Err(Failure::bad_request(format!(
            "a reason is required (the evidence behind the verdict, at most {MAX_TEXT} bytes)"
        )));
    }
    if form.result.len() > MAX_RESULT {
        return Err(Failure::bad_request(format!(
            "the result must be at most {MAX_RESULT} bytes"
        )));
    }
    let verdict = match form.verdict.as_str() {
        "applied" => Verdict::Applied {
            result: form.result.clone(),
        },
        "not_applied" if form.result.is_empty() => Verdict::NotApplied,
        "not_applied" => {
            return Err(Failure::bad_request(
                "a result goes with an `applied` verdict only",
            ))
        }
        other => {
            return Err(Failure::bad_request(format!(
                "verdict must be `applied` or `not_applied` (got {:?})",
                views::shorten(other, 40)
            )))
        }
    };
    let adapter = &state.stores.effects;
    match form.confirm.as_deref() {
        None => {
            let current = match adapter
                .key_status(&key)
                .await
                .map_err(|e| Failure::store(side_effect_error(e)))?
            {
                KeyStatus::Uncertain { reason } => format!("uncertain: {reason}"),
                KeyStatus::InFlight {
                    live: false, fence, ..
                } => {
                    format!("in flight ({fence}), lease expired: reads as uncertain")
                }
                KeyStatus::InFlight { .. } => {
                    "in flight with a live lease: the verdict will be refused".into()
                }
                KeyStatus::Completed { .. } => "completed: the verdict will be refused".into(),
                KeyStatus::Idle => "idle: the verdict will be refused".into(),
                _ => "in a state this coordctl does not know".into(),
            };
            Ok((
                "Confirm the reconcile".to_owned(),
                "/sideeffects",
                html::confirm(
                    &key,
                    &form.verdict,
                    &reason,
                    &form.result,
                    &current,
                    &state.csrf,
                ),
            ))
        }
        Some("yes") => {
            let outcome = resolve(adapter, &key, None, &verdict, &reason, CLAIM_TTL)
                .await
                .map_err(Failure::store)?;
            match outcome {
                Ok(resolved) => {
                    // The record of who decided what: the reason is stored with an
                    // applied verdict by the adapter and printed here for both.
                    println!(
                        "coordctl serve: reconciled key {key:?} as {}; reason: {reason}",
                        form.verdict
                    );
                    let what = match resolved {
                        Resolved::Completed { .. } => {
                            "the key is completed; later runs replay its result"
                        }
                        Resolved::Cleared => "the mark is cleared; the key may run again",
                    };
                    Ok((
                        "Reconciled".to_owned(),
                        "/sideeffects",
                        html::reconciled(&key, &form.verdict, what, &reason),
                    ))
                }
                Err(refused) => Err(Failure::new(
                    if refused.code == 5 {
                        StatusCode::BAD_REQUEST
                    } else {
                        StatusCode::CONFLICT
                    },
                    refused.message,
                )),
            }
        }
        Some(_) => Err(Failure::bad_request("confirm must be `yes`")),
    }
}
