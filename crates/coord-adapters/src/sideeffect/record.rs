//! How the adapter's two records look in the store, and the three-way check.
//!
//! - `se/act/<key>` (key level): idle / execution intent / uncertain /
//!   completed, plus an optional reconcile claim;
//! - `se/res/<resource>` (resource level): the highest fence ever issued and
//!   the current holder. Never deleted, so the fence is never reset;
//! - `se/open/<key>`: present while the key is in flight or uncertain
//!   (written unasserted in the txn of each state change: every such txn
//!   asserts the key's record, so they apply in the record's order);
//! - `se/done/<minute>/<key>` and `se/done/cursor`: the retention index of
//!   completed keys (written in the completing txn; see
//!   [`crate::retention`]), which `SideEffectAdapter::prune` walks.
//!
//! Records are JSON ([`Record`]); bytes are base64. Every record carries a
//! [`Nonce`] stamped on each write, so the CAS engine can tell whether an
//! indeterminate txn landed (no two writes are byte-identical). Records
//! written before it was named `nonce` carry it as `w`.

use serde::{Deserialize, Serialize};

use super::types::{Action, Lease, RetrySafety};
use coord_backend::Error;

use crate::cas::{record_kind, LeaseRecord, Nonce, Record, View};

pub(crate) const ACT_PREFIX: &str = "se/act/";
pub(crate) const RES_PREFIX: &str = "se/res/";
pub(crate) const SINK_PREFIX: &str = "se/sink/";
/// One empty entry per key in flight or uncertain (the keys needing
/// attention), written in the same txn as the state change, so an
/// inspection lists them without reading every key.
pub(crate) const OPEN_PREFIX: &str = "se/open/";

/// The attention entry of `key` (see [`OPEN_PREFIX`]).
pub(crate) fn open_key(key: &str) -> String {
    format!("{OPEN_PREFIX}{key}")
}

/// The retention index of completed keys (see [`crate::retention`]):
/// `se/done/<minute>/<key>` and `se/done/cursor`.
pub(crate) const DONE_INDEX: crate::retention::RetentionIndex =
    crate::retention::RetentionIndex::new("se/done/");

pub(crate) fn act_key(key: &str) -> String {
    format!("{ACT_PREFIX}{key}")
}

pub(crate) fn res_key(resource: &str) -> String {
    format!("{RES_PREFIX}{resource}")
}

pub(crate) fn sink_key(resource: &str) -> String {
    format!("{SINK_PREFIX}{resource}")
}

/// Resource level: who holds it, and the fence counter.
// No `Debug`: it holds a token (and results); see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct ResRecord {
    /// Highest fence ever issued on this resource.
    pub(crate) fence: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) holder: Option<Holder>,
    #[serde(alias = "w")]
    pub(crate) nonce: Nonce,
}

/// The current grant of a resource (its fence is [`ResRecord::fence`]).
// No `Debug`: it holds a token (and results); see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct Holder {
    /// The idempotency key the grant went to.
    pub(crate) key: String,
    /// The grant's token and lease.
    #[serde(flatten)]
    pub(crate) lease: LeaseRecord,
}

impl ResRecord {
    /// The holder, if its lease is unexpired at `now`.
    pub(crate) fn live_holder(&self, now: u64) -> Option<&Holder> {
        self.holder.as_ref().filter(|h| h.lease.is_live(now))
    }
}

/// Key level state.
// No `Debug`: it holds a token (and results); see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub(crate) enum KeyState {
    Idle,
    /// Granted and not yet completed, abandoned or marked.
    Intent {
        resource: String,
        fence: u64,
        token: String,
        retry_safety: RetrySafety,
        since_ms: u64,
    },
    Uncertain {
        resource: String,
        fence: Option<u64>,
        reason: String,
        since_ms: u64,
    },
    Completed {
        #[serde(with = "b64")]
        result: Vec<u8>,
        /// The fence of the completing lease; `None` when set by a resolution.
        fence: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        at_ms: u64,
    },
}

// No `Debug`: it holds a token (and results); see coord_backend::redact.
#[derive(Clone, Serialize, Deserialize)]
pub(crate) struct ActRecord {
    pub(crate) state: KeyState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reconcile: Option<ClaimRecord>,
    #[serde(alias = "w")]
    pub(crate) nonce: Nonce,
}

impl ActRecord {
    /// A record in `state` with no reconcile claim: what every state change
    /// writes (a change ends any claim; only `begin_reconcile` sets one).
    pub(crate) fn new(state: KeyState) -> Self {
        ActRecord {
            state,
            reconcile: None,
            nonce: Nonce::default(),
        }
    }
}

record_kind!(ActRecord, "a side-effect key record");

record_kind!(ResRecord, "a side-effect resource record");

#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ClaimRecord {
    pub(crate) holder: String,
    pub(crate) expires_ms: u64,
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map_err(serde::de::Error::custom)
    }
}

/// The three-way check: the lease is the current grant of its resource
/// (same fence and token, holder present), the grant went to this action's
/// key, and the lease's resource is the action's resource.
pub(crate) fn lease_is_current(res: Option<&ResRecord>, action: &Action, lease: &Lease) -> bool {
    lease.resource == action.resource
        && lease.holder == action.key
        && res.is_some_and(|r| {
            r.fence == lease.fence.0
                && r.holder
                    .as_ref()
                    .is_some_and(|h| h.lease.token == lease.token && h.key == action.key)
        })
}

/// What a key's record says of it: THE judgement of whether a key is
/// uncertain, made here once for `acquire`, reconciliation and resolution.
pub(crate) enum Standing<'a> {
    /// Never granted, or back to idle.
    Idle,
    /// Completed, with its stored result.
    Completed(&'a [u8]),
    /// Granted and its grant still holds the resource: it may still complete.
    InFlight,
    /// Granted, and its grant no longer holds the resource (expired or
    /// released without completing): it may have applied. Only an action
    /// declared retry-safe when granted (`retry_safety`) may run again.
    Abandoned { retry_safety: RetrySafety },
    /// Marked uncertain: only a resolution clears it.
    Uncertain,
}

impl Standing<'_> {
    /// Whether the key awaits a resolution (what a reconciler may claim).
    pub(crate) fn is_uncertain(&self) -> bool {
        matches!(self, Standing::Uncertain | Standing::Abandoned { .. })
    }
}

/// Judge `act` (the record of a key, as `view` holds it) at `now`.
/// `Ok(Err(key))`: the view must first hold `key` (the resource of an
/// intent, whose grant decides between in flight and abandoned).
pub(crate) fn standing<'a>(
    view: &View,
    act: Option<&'a ActRecord>,
    now: u64,
) -> Result<Result<Standing<'a>, String>, Error> {
    Ok(Ok(match act.map(|a| &a.state) {
        None | Some(KeyState::Idle) => Standing::Idle,
        Some(KeyState::Uncertain { .. }) => Standing::Uncertain,
        Some(KeyState::Completed { result, .. }) => Standing::Completed(result),
        Some(KeyState::Intent {
            resource,
            token,
            retry_safety,
            ..
        }) => {
            let irk = res_key(resource);
            if !view.contains(&irk) {
                return Ok(Err(irk));
            }
            if intent_is_live(token, ResRecord::read(view, &irk)?.as_ref(), now) {
                Standing::InFlight
            } else {
                Standing::Abandoned {
                    retry_safety: *retry_safety,
                }
            }
        }
    }))
}

/// Whether an intent's grant still holds its resource at `now`.
pub(crate) fn intent_is_live(token: &str, res: Option<&ResRecord>, now: u64) -> bool {
    res.and_then(|r| r.live_holder(now))
        .is_some_and(|h| h.lease.token == token)
}
