//! [`SideEffectAdapter`]: the apply side of the gate (acquire, complete,
//! release, renew, mark_uncertain, abandon) decided over the CAS engine.
//!
//! Every method reads the records it decides on (`se/act/<key>`,
//! `se/res/<resource>`) through [`CasEngine::decide`], so the txn asserts
//! each of them: a decision commits only if nothing it read changed.
//! Refusals are the decision's errors, which the engine confirms against
//! the store first when they were decided on a remembered (maybe stale) record.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use coord_backend::{Backend, Clock, Error, Mutation, SystemClock};

use super::error::SideEffectError;
use super::record::{
    act_key, intent_is_live, lease_is_current, open_key, res_key, standing, ActRecord, Holder,
    KeyState, ResRecord, Standing, DONE_INDEX,
};
use super::store::SideEffectStore;
use super::types::{
    Acquired, Action, EffectResult, Execution, Fence, KeyStatus, Lease, ReconcileClaim, Resolution,
    ResourceStatus, RetrySafety,
};
use crate::cas::record::time_at;
use crate::cas::{whole_millis, LeaseRecord, Nonce, Record, View};
use crate::{mint_token, CasEngine, Decision};

/// What a decision returns: what to write and answer, or a refusal.
pub(crate) type Step<T> = Result<Decision<T>, SideEffectError>;

/// The one [`SideEffectStore`] implementation, over any [`Backend`].
///
/// Expiry is judged with the injected [`Clock`] (the system clock by
/// default): instances sharing a store must agree on time within a fraction
/// of the TTLs they use. Clocks only affect liveness; fences keep safety.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use coord_adapters::sideeffect::{Action, Outcome, SideEffectAdapter, SideEffectStore};
/// use coord_memory::SingleProcessMemoryBackend;
///
/// let backend = Arc::new(SingleProcessMemoryBackend::new("docs")?);
/// let store = SideEffectAdapter::new(backend);
/// let action = Action::new("order-1/email", "mailer");
///
/// let acquired = store.acquire(&action, Duration::from_secs(30)).await?;
/// assert_eq!(acquired.outcome(), Outcome::Applied);
/// let lease = acquired.into_lease().expect("a grant comes with a lease");
/// // ... send the e-mail, passing lease.fence downstream ...
/// store.complete(&action, &lease, "sent".into()).await?;
///
/// let again = store.acquire(&action, Duration::from_secs(30)).await?;
/// assert_eq!(again.outcome(), Outcome::Replayed);
/// assert_eq!(again.result().unwrap().as_bytes(), b"sent");
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SideEffectAdapter {
    engine: CasEngine,
    clock: Arc<dyn Clock>,
}

impl SideEffectAdapter {
    /// An adapter over `backend` judging expiry with the system clock.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self::with_clock(backend, Arc::new(SystemClock))
    }

    /// An adapter over `backend` judging expiry with `clock`.
    pub fn with_clock(backend: Arc<dyn Backend>, clock: Arc<dyn Clock>) -> Self {
        Self::with_engine(CasEngine::new(backend), clock)
    }

    /// An adapter deciding through `engine` (shared cache and counters).
    pub fn with_engine(engine: CasEngine, clock: Arc<dyn Clock>) -> Self {
        SideEffectAdapter { engine, clock }
    }

    /// The CAS engine (its [`stats`](CasEngine::stats) count round trips).
    pub fn engine(&self) -> &CasEngine {
        &self.engine
    }

    /// The clock expiry is judged with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub(crate) fn now(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The idempotency keys needing attention: in flight (granted, not yet
    /// completed or abandoned) or marked uncertain, in byte order. Read from
    /// the entries each state change writes in its own txn
    /// (`se/open/<key>`), so the cost follows these keys, not every key the
    /// store holds. Keys granted before those entries existed are not
    /// listed (a full walk, e.g. `coordctl inspect --all`, finds them).
    pub async fn open_keys(&self) -> Result<Vec<String>, SideEffectError> {
        let prefix = super::record::OPEN_PREFIX;
        Ok(self
            .engine
            .backend()
            .keys(prefix)
            .await?
            .into_iter()
            .filter_map(|k| k.strip_prefix(prefix).map(str::to_owned))
            .collect())
    }

    /// Remove keys completed more than `options.retention` ago (by this
    /// adapter's clock), at most `options.max_records` per call; see
    /// [`crate::retention`] for how they are found and why several pruners
    /// may run at once. Only completed keys go: idle, in-flight and
    /// uncertain keys and every resource record (the fence counters) stay.
    ///
    /// **What a retried key does after its record went:** it runs again,
    /// as a new key would (its resource's fence still only grows). At-most-
    /// once holds within the retention, like an idempotency-key window
    /// (Stripe keeps keys 24 hours); without pruning (the default) it holds
    /// forever.
    pub async fn prune(
        &self,
        options: &crate::retention::PruneOptions,
    ) -> Result<crate::retention::Pruned, SideEffectError> {
        use crate::retention::{remove_if, Verdict};
        let judge = |view: &crate::cas::View, record: &str, cutoff_ms: u64| {
            let act = ActRecord::read(view, record)?;
            Ok(match act.map(|a| a.state) {
                Some(KeyState::Completed { at_ms, .. }) if at_ms <= cutoff_ms => Verdict::Remove,
                Some(KeyState::Completed { .. }) => Verdict::Keep,
                _ => Verdict::Stale,
            })
        };
        let pruned = crate::retention::prune(
            &self.engine,
            &DONE_INDEX,
            self.now(),
            options,
            act_key,
            |record, entry, cutoff_ms| async move {
                remove_if(&self.engine, &record, &entry, cutoff_ms, judge).await
            },
        )
        .await?;
        crate::telemetry::pruned("sideeffect", pruned.removed);
        Ok(pruned)
    }

    /// How many completed keys [`prune`](Self::prune) would look at now
    /// (`removed`: an upper bound of what it removes; `more`: the count
    /// stopped at `options.max_minutes` minutes of the index). Writes nothing.
    pub async fn prune_candidates(
        &self,
        options: &crate::retention::PruneOptions,
    ) -> Result<crate::retention::Pruned, SideEffectError> {
        Ok(crate::retention::due(&self.engine, &DONE_INDEX, self.now(), options).await?)
    }

    /// Refuse an action that cannot be stored, before any I/O; answer its
    /// record keys (`se/act/<key>`, `se/res/<resource>`) when it can be.
    pub(crate) fn check_action(
        &self,
        action: &Action,
    ) -> Result<(String, String), SideEffectError> {
        let max = self.engine.backend().limits().max_key_bytes;
        let invalid = |why: String| Err(SideEffectError::InvalidAction(why));
        if action.key.is_empty() {
            return invalid("empty idempotency key".into());
        }
        if action.resource.is_empty() {
            return invalid("empty resource".into());
        }
        let (ak, rk) = (act_key(&action.key), res_key(&action.resource));
        for (what, value, stored) in [
            ("key", &action.key, &ak),
            ("resource", &action.resource, &rk),
        ] {
            if value.contains('\0') {
                return invalid(format!("NUL byte in {what} {value:?}"));
            }
            if stored.len() > max {
                return invalid(format!(
                    "{what} of {} bytes does not fit the store's {max}-byte keys",
                    value.len()
                ));
            }
        }
        Ok((ak, rk))
    }

    /// Now and the end of a lease of `ttl` counted from now, by the
    /// adapter's clock; a zero TTL is refused.
    pub(crate) fn lease_window(&self, ttl: Duration) -> Result<(u64, u64), SideEffectError> {
        if ttl.is_zero() {
            return Err(SideEffectError::InvalidAction("zero TTL".into()));
        }
        let now = self.now();
        Ok((now, now.saturating_add(whole_millis(ttl))))
    }

    /// Decide over the key's record `ak` and its resource's record `rk`
    /// (both read, so both asserted), plus the `more` keys the decision
    /// reads; `decide` gets the view and the two records as it holds them.
    async fn decide_on_action<T>(
        &self,
        (ak, rk): (&str, &str),
        more: &[String],
        mut decide: impl FnMut(&View, Option<ActRecord>, Option<ResRecord>) -> Step<T>,
    ) -> Result<T, SideEffectError> {
        let mut keys = vec![ak.to_owned(), rk.to_owned()];
        keys.extend_from_slice(more);
        self.engine
            .decide(&keys, |view| {
                let act = ActRecord::read(view, ak)?;
                let res = ResRecord::read(view, rk)?;
                decide(view, act, res)
            })
            .await
    }

    /// What the store holds for `key` (one consistent read; inspection only,
    /// never a basis for a decision).
    pub async fn key_status(&self, key: &str) -> Result<KeyStatus, SideEffectError> {
        let ak = act_key(key);
        let entries = self.engine.snapshot(std::slice::from_ref(&ak)).await?;
        let act = ActRecord::from_value(&ak, entries[0].value.as_deref())?;
        let Some(act) = act else {
            return Ok(KeyStatus::Idle);
        };
        Ok(match act.state {
            KeyState::Idle => KeyStatus::Idle,
            KeyState::Uncertain { reason, .. } => KeyStatus::Uncertain { reason },
            KeyState::Completed { result, .. } => KeyStatus::Completed {
                result: EffectResult(result),
            },
            KeyState::Intent {
                resource,
                fence,
                token,
                ..
            } => {
                let rk = res_key(&resource);
                let entries = self.engine.snapshot(std::slice::from_ref(&rk)).await?;
                let res = ResRecord::from_value(&rk, entries[0].value.as_deref())?;
                KeyStatus::InFlight {
                    live: intent_is_live(&token, res.as_ref(), self.now()),
                    resource,
                    fence: Fence(fence),
                }
            }
        })
    }

    /// What the store holds for `resource` (inspection only).
    pub async fn resource_status(&self, resource: &str) -> Result<ResourceStatus, SideEffectError> {
        let rk = res_key(resource);
        let entries = self.engine.snapshot(std::slice::from_ref(&rk)).await?;
        let res = ResRecord::from_value(&rk, entries[0].value.as_deref())?;
        let now = self.now();
        Ok(match res {
            None => ResourceStatus {
                highest_fence: Fence(0),
                holder: None,
                expires_at: None,
                live: false,
            },
            Some(res) => ResourceStatus {
                highest_fence: Fence(res.fence),
                live: res.live_holder(now).is_some(),
                expires_at: res.holder.as_ref().map(|h| time_at(h.lease.expires_ms)),
                holder: res.holder.map(|h| h.key),
            },
        })
    }
}

#[async_trait]
impl SideEffectStore for SideEffectAdapter {
    #[tracing::instrument(name = "sideeffect.acquire", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = tracing::field::Empty,
    ))]
    async fn acquire(&self, action: &Action, ttl: Duration) -> Result<Acquired, SideEffectError> {
        let (ak, rk) = self.check_action(action)?;
        let (now, expires_ms) = self.lease_window(ttl)?;
        let token = mint_token();
        let decided = self
            .decide_on_action((&ak, &rk), &[], |view, act, res| -> Step<Acquired> {
                // Key-level states outrank the resource: a done or unknown key
                // must never be reported as merely "busy".
                let refused = |acquired| Ok(Decision::Return(acquired));
                match standing(view, act.as_ref(), now)? {
                    Err(resource) => return Ok(Decision::Expand(vec![resource])),
                    Ok(Standing::Completed(result)) => {
                        let result = EffectResult(result.to_vec());
                        return Ok(Decision::Return(Acquired::Replayed(result)));
                    }
                    Ok(Standing::Uncertain) => return refused(Acquired::Uncertain),
                    Ok(Standing::InFlight) => return refused(Acquired::Contended),
                    // The holder died or released between grant and
                    // complete: it may have applied. Only an action the
                    // host declared retry-safe (at grant time AND now)
                    // may be granted again.
                    Ok(Standing::Abandoned { retry_safety }) => {
                        let regrant = retry_safety == RetrySafety::Safe
                            && action.retry_safety == RetrySafety::Safe;
                        if !regrant {
                            return refused(Acquired::Uncertain);
                        }
                    }
                    Ok(Standing::Idle) => {}
                }
                if res.as_ref().and_then(|r| r.live_holder(now)).is_some() {
                    return Ok(Decision::Return(Acquired::Contended));
                }
                let fence = res
                    .as_ref()
                    .map_or(0, |r| r.fence)
                    .checked_add(1)
                    .ok_or_else(|| Error::malformed(rk.clone(), "fence counter exhausted"))?;
                let mut new_res = ResRecord {
                    fence,
                    holder: Some(Holder {
                        key: action.key.clone(),
                        lease: LeaseRecord::new(token.clone(), expires_ms),
                    }),
                    nonce: Nonce::default(),
                };
                let mut new_act = ActRecord::new(KeyState::Intent {
                    resource: action.resource.clone(),
                    fence,
                    token: token.clone(),
                    retry_safety: action.retry_safety,
                    since_ms: now,
                });
                let lease = Lease {
                    resource: action.resource.clone(),
                    fence: Fence(fence),
                    token: token.clone(),
                    holder: action.key.clone(),
                    expires_at: time_at(expires_ms),
                };
                Ok(Decision::CommitWithUnasserted {
                    mutations: vec![new_res.put(&rk), new_act.put(&ak)],
                    unasserted: vec![Mutation::put(open_key(&action.key), Vec::new())],
                    then: Acquired::Applied(lease),
                })
            })
            .await;
        if let Ok(acquired) = &decided {
            if let Some(lease) = acquired.lease() {
                tracing::Span::current().record("fence", lease.fence.0);
            }
            tracing::debug!(
                key = %action.key,
                resource = %action.resource,
                outcome = %acquired.outcome(),
                fence = acquired.lease().map(|l| l.fence.0),
                "sideeffect acquire"
            );
        }
        decided
    }

    #[tracing::instrument(name = "sideeffect.complete", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = lease.fence.0,
    ))]
    async fn complete(
        &self,
        action: &Action,
        lease: &Lease,
        result: EffectResult,
    ) -> Result<EffectResult, SideEffectError> {
        let (ak, rk) = self.check_action(action)?;
        let now = self.now();
        let cursor = DONE_INDEX.cursor();
        self.decide_on_action(
            (&ak, &rk),
            &[cursor],
            |view, act, res| -> Step<EffectResult> {
                if let Some(KeyState::Completed { result, .. }) = act.as_ref().map(|a| &a.state) {
                    // First result wins; nothing is written.
                    return Ok(Decision::Return(EffectResult(result.clone())));
                }
                let Some(mut new_res) = res.filter(|r| lease_is_current(Some(r), action, lease))
                else {
                    return Err(SideEffectError::FenceStale);
                };
                match act.map(|a| a.state) {
                    Some(KeyState::Uncertain { .. }) => Err(SideEffectError::OutcomeUnknown {
                        reason: "the key is marked uncertain; only a resolution completes it"
                            .into(),
                        source: None,
                    }),
                    Some(KeyState::Intent { token, .. }) if token == lease.token => {
                        // The key is done: its lease has no purpose left, so
                        // it is freed in the same txn (saves the release round trip).
                        new_res.holder = None;
                        let mut new_act = ActRecord::new(KeyState::Completed {
                            result: result.0.clone(),
                            fence: Some(lease.fence.0),
                            reason: None,
                            at_ms: now,
                        });
                        let (cursor, entry) = DONE_INDEX.final_writes(view, now, &action.key);
                        let mut mutations = vec![new_res.put(&rk), new_act.put(&ak)];
                        mutations.extend(cursor);
                        Ok(Decision::CommitWithUnasserted {
                            mutations,
                            unasserted: vec![entry, Mutation::delete(open_key(&action.key))],
                            then: result.clone(),
                        })
                    }
                    // The attempt was abandoned or resolved meanwhile.
                    _ => Err(SideEffectError::FenceStale),
                }
            },
        )
        .await
    }

    #[tracing::instrument(name = "sideeffect.release", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = lease.fence.0,
    ))]
    async fn release(&self, action: &Action, lease: &Lease) -> Result<(), SideEffectError> {
        let (_, rk) = self.check_action(action)?;
        self.engine
            .decide(std::slice::from_ref(&rk), |view| -> Step<()> {
                let res = ResRecord::read(view, &rk)?;
                let Some(mut new_res) = res.filter(|r| lease_is_current(Some(r), action, lease))
                else {
                    return Err(SideEffectError::FenceStale);
                };
                new_res.holder = None;
                Ok(Decision::Commit {
                    mutations: vec![new_res.put(&rk)],
                    then: (),
                })
            })
            .await
    }

    #[tracing::instrument(name = "sideeffect.renew", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = lease.fence.0,
    ))]
    async fn renew(
        &self,
        action: &Action,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<Lease, SideEffectError> {
        let (ak, rk) = self.check_action(action)?;
        let (now, expires_ms) = self.lease_window(ttl)?;
        self.decide_on_action((&ak, &rk), &[], |_, act, res| -> Step<Lease> {
            let attempt_open = matches!(
                act.map(|a| a.state),
                Some(KeyState::Intent { token, .. }) if token == lease.token
            );
            let held = res
                .filter(|r| lease_is_current(Some(r), action, lease))
                .filter(|r| r.live_holder(now).is_some());
            // Renewing an expired lease is a fake renew even if nobody
            // took over yet: the holder may already have been judged dead.
            let (Some(mut new_res), true) = (held, attempt_open) else {
                return Err(SideEffectError::LeaseLost);
            };
            if let Some(holder) = new_res.holder.as_mut() {
                holder.lease.expires_ms = expires_ms;
            }
            let mut renewed = lease.clone();
            renewed.expires_at = time_at(expires_ms);
            Ok(Decision::Commit {
                mutations: vec![new_res.put(&rk)],
                then: renewed,
            })
        })
        .await
    }

    #[tracing::instrument(name = "sideeffect.mark_uncertain", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = lease.fence.0,
    ))]
    async fn mark_uncertain(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        let (ak, rk) = self.check_action(action)?;
        let now = self.now();
        self.decide_on_action((&ak, &rk), &[], |_, act, res| -> Step<()> {
            match act.as_ref().map(|a| &a.state) {
                // Idempotent: already marked, nothing to write.
                Some(KeyState::Uncertain { .. }) => return Ok(Decision::Return(())),
                // Never turn a known result into an unknown one.
                Some(KeyState::Completed { .. }) => return Err(SideEffectError::FenceStale),
                _ => {}
            }
            if !lease_is_current(res.as_ref(), action, lease) {
                return Err(SideEffectError::FenceStale);
            }
            // Marking and dropping the intent is one put of one record:
            // if the txn fails, the intent is still there and still blocks.
            let mut new_act = ActRecord::new(KeyState::Uncertain {
                resource: action.resource.clone(),
                fence: Some(lease.fence.0),
                reason: reason.to_owned(),
                since_ms: now,
            });
            // The entry exists since the grant; written again for keys
            // granted before the attention entries existed.
            Ok(Decision::CommitWithUnasserted {
                mutations: vec![new_act.put(&ak)],
                unasserted: vec![Mutation::put(open_key(&action.key), Vec::new())],
                then: (),
            })
        })
        .await
    }

    #[tracing::instrument(name = "sideeffect.resolve_uncertain", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = tracing::field::Empty,
    ))]
    async fn resolve_uncertain(
        &self,
        action: &Action,
        resolution: &Resolution,
    ) -> Result<Execution, SideEffectError> {
        self.resolve(action, resolution, None).await
    }

    #[tracing::instrument(name = "sideeffect.abandon", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = lease.fence.0,
    ))]
    async fn abandon(
        &self,
        action: &Action,
        lease: &Lease,
        reason: &str,
    ) -> Result<(), SideEffectError> {
        let (ak, rk) = self.check_action(action)?;
        if lease.resource != action.resource {
            return Err(SideEffectError::FenceStale);
        }
        let decided = self
            .decide_on_action((&ak, &rk), &[], |_, act, res| -> Step<()> {
                let own_intent = matches!(
                    act.as_ref().map(|a| &a.state),
                    Some(KeyState::Intent { token, .. }) if *token == lease.token
                );
                if !own_intent {
                    // Completed, uncertain, or another attempt: dropping it
                    // would erase a fact (or someone else's attempt).
                    return Err(SideEffectError::FenceStale);
                }
                let mut new_act = ActRecord::new(KeyState::Idle);
                let mut mutations = vec![new_act.put(&ak)];
                if let Some(mut new_res) = res.filter(|r| lease_is_current(Some(r), action, lease))
                {
                    new_res.holder = None;
                    mutations.push(new_res.put(&rk));
                }
                Ok(Decision::CommitWithUnasserted {
                    mutations,
                    unasserted: vec![Mutation::delete(open_key(&action.key))],
                    then: (),
                })
            })
            .await;
        if decided.is_ok() {
            tracing::debug!(key = %action.key, fence = lease.fence.0, reason, "sideeffect abandon");
        }
        decided
    }

    #[tracing::instrument(name = "sideeffect.begin_reconcile", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = tracing::field::Empty,
    ))]
    async fn begin_reconcile(
        &self,
        action: &Action,
        ttl: Duration,
    ) -> Result<Option<ReconcileClaim>, SideEffectError> {
        self.begin(action, ttl).await
    }

    #[tracing::instrument(name = "sideeffect.resolve_uncertain_owned", skip_all, fields(
        key = %action.key, resource = %action.resource,
        store = self.engine.store_name(), fence = tracing::field::Empty,
    ))]
    async fn resolve_uncertain_owned(
        &self,
        action: &Action,
        resolution: &Resolution,
        holder: &str,
    ) -> Result<Execution, SideEffectError> {
        self.resolve(action, resolution, Some(holder)).await
    }
}
