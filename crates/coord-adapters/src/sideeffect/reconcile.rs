//! The resolution side of [`SideEffectAdapter`]: `resolve_uncertain`,
//! `begin_reconcile`, `resolve_uncertain_owned`.
//!
//! Resolutions check no fence: they rest on downstream facts, not on holding
//! the resource (the original holder may be long dead, which is exactly when
//! reconciling happens). A key counts as uncertain when it was marked, and
//! also when its execution intent lost its lease (the holder died or released
//! between apply and complete): that is what `acquire` reports as
//! `Uncertain`, so it is what a reconciler may resolve.

use std::time::Duration;

use coord_backend::Mutation;

use super::adapter::Step;
use super::error::SideEffectError;
use super::record::{open_key, standing, ActRecord, ClaimRecord, KeyState, Standing, DONE_INDEX};
use super::types::{Action, EffectResult, Execution, Outcome, ReconcileClaim, Resolution};
use super::SideEffectAdapter;
use crate::cas::record::time_at;
use crate::cas::Record;
use crate::{mint_token, Decision};

impl SideEffectAdapter {
    pub(crate) async fn resolve(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: Option<&str>,
    ) -> Result<Execution, SideEffectError> {
        let (ak, _) = self.check_action(action)?;
        let now = self.now();
        let decided = self
            .engine()
            .decide(
                &[ak.clone(), DONE_INDEX.cursor()],
                |view| -> Step<Execution> {
                    let act = ActRecord::read(view, &ak)?;
                    if let Some(holder) = holder {
                        let owns = act
                            .as_ref()
                            .and_then(|a| a.reconcile.as_ref())
                            .is_some_and(|c| c.holder == holder && c.expires_ms > now);
                        if !owns {
                            return Err(SideEffectError::ReconcileLost);
                        }
                    }
                    match standing(view, act.as_ref(), now)? {
                        Err(resource) => return Ok(Decision::Expand(vec![resource])),
                        Ok(Standing::Completed(result)) => {
                            // First resolution (or completion) wins.
                            return Ok(Decision::Return(Execution {
                                outcome: Outcome::Replayed,
                                result: Some(EffectResult(result.to_vec())),
                            }));
                        }
                        Ok(standing) if standing.is_uncertain() => {}
                        Ok(_) => return Err(SideEffectError::NotUncertain),
                    }
                    let (state, then) = if resolution.applied {
                        (
                            KeyState::Completed {
                                result: resolution.result.0.clone(),
                                fence: None,
                                reason: Some(resolution.reason.clone()),
                                at_ms: now,
                            },
                            Execution {
                                outcome: Outcome::Replayed,
                                result: Some(resolution.result.clone()),
                            },
                        )
                    } else {
                        (
                            KeyState::Idle,
                            Execution {
                                outcome: Outcome::Applied,
                                result: None,
                            },
                        )
                    };
                    let mut new_act = ActRecord::new(state);
                    let mut mutations = vec![new_act.put(&ak)];
                    // Resolved either way: the key needs no attention any more.
                    let mut unasserted = vec![Mutation::delete(open_key(&action.key))];
                    if resolution.applied {
                        let (cursor, entry) = DONE_INDEX.final_writes(view, now, &action.key);
                        mutations.extend(cursor);
                        unasserted.push(entry);
                    }
                    Ok(Decision::CommitWithUnasserted {
                        mutations,
                        unasserted,
                        then,
                    })
                },
            )
            .await;
        if decided.is_ok() {
            tracing::info!(
                key = %action.key,
                applied = resolution.applied,
                reason = %resolution.reason,
                owned = holder.is_some(),
                "sideeffect resolve_uncertain"
            );
        }
        decided
    }

    pub(crate) async fn begin(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError> {
        let (ak, _) = self.check_action(action)?;
        let (now, expires_ms) = self.lease_window(ttl)?;
        let holder = mint_token();
        self.engine()
            .decide(
                std::slice::from_ref(&ak),
                |view| -> Step<Option<ReconcileClaim>> {
                    let act = ActRecord::read(view, &ak)?;
                    match standing(view, act.as_ref(), now)? {
                        Err(resource) => return Ok(Decision::Expand(vec![resource])),
                        Ok(standing) if standing.is_uncertain() => {}
                        Ok(_) => return Err(SideEffectError::NotUncertain),
                    }
                    let Some(mut new_act) = act else {
                        return Err(SideEffectError::NotUncertain);
                    };
                    if new_act
                        .reconcile
                        .as_ref()
                        .is_some_and(|c| c.expires_ms > now)
                    {
                        return Ok(Decision::Return(None));
                    }
                    new_act.reconcile = Some(ClaimRecord {
                        holder: holder.clone(),
                        expires_ms,
                    });
                    Ok(Decision::Commit {
                        mutations: vec![new_act.put(&ak)],
                        then: Some(ReconcileClaim {
                            key: action.key.clone(),
                            holder: holder.clone(),
                            expires_at: time_at(expires_ms),
                        }),
                    })
                },
            )
            .await
    }
}
