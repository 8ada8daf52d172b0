//! Side-effect keys and resources (`coordctl inspect --json`,
//! `/api/sideeffects`, `/api/resources`): each key's state as
//! `SideEffectAdapter::key_status` reports it, sorted into the keys a
//! reconcile must settle, the open intents and the settled keys, and each
//! resource's fence counter and lease. A completed key's result appears only
//! when the settled keys are asked for.

use coord_adapters::sideeffect::KeyStatus;
use coord_backend::Error;
use serde::Serialize;

use super::{list_names, ms, shorten, side_effect_error, Names, Page, Paged, Row, Stores};

/// Side-effect intents per idempotency key (the adapter's documented layout).
pub(crate) const ACT_PREFIX: &str = "se/act/";
/// Side-effect resources (fence counter and lease per resource).
pub(crate) const RES_PREFIX: &str = "se/res/";

/// Why an uncertain key is uncertain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum UncertainKind {
    /// Marked uncertain (an apply whose result is unknown).
    Marked,
    /// An intent whose lease ended before it completed (holder died or released).
    LeaseLost,
}

/// A key `acquire` answers `Uncertain` for: reconcile it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct UncertainKey {
    pub(crate) key: String,
    pub(crate) kind: UncertainKind,
    pub(crate) reason: String,
    /// The intent's resource (`lease_lost` only): `reconcile` defaults to it.
    pub(crate) resource: Option<String>,
    /// The intent's fence (`lease_lost` only).
    pub(crate) fence: Option<u64>,
}

/// An open execution intent.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct InFlightKey {
    pub(crate) key: String,
    pub(crate) resource: String,
    pub(crate) fence: u64,
    /// Whether the intent's lease is held and unexpired (false: the key reads as uncertain).
    pub(crate) live: bool,
    /// The key holding the resource now (it may since be another key's).
    pub(crate) resource_holder: Option<String>,
    /// When the resource holder's lease ends (UTC ms).
    pub(crate) lease_expires_ms: Option<u64>,
}

/// A key that needs nothing (listed with `inspect --all` only).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SettledKey {
    pub(crate) key: String,
    /// `completed` or `idle`.
    pub(crate) state: &'static str,
    /// A completed key's result as the text table shows it (lossy UTF-8, cut to 80 characters).
    pub(crate) result: Option<String>,
}

/// The side-effect keys of one page (or every key, for `inspect`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SideEffectsView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    /// How many keys were read.
    pub(crate) examined: usize,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) uncertain: Vec<UncertainKey>,
    pub(crate) in_flight: Vec<InFlightKey>,
    pub(crate) completed: usize,
    pub(crate) idle: usize,
    /// Completed and idle keys (only when asked for: `inspect --all`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) settled: Option<Vec<SettledKey>>,
}

/// One side-effect resource: its fence counter and lease.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct ResourceView {
    pub(crate) resource: String,
    pub(crate) highest_fence: u64,
    /// The idempotency key holding it, if any (expired or not).
    pub(crate) holder: Option<String>,
    pub(crate) lease_expires_ms: Option<u64>,
    /// `free`, `live` or `expired`.
    pub(crate) state: &'static str,
}

impl Row for ResourceView {
    const FIELD: &'static str = "resources";
}

/// The side-effect resources of one page.
pub(crate) type ResourcesView = Paged<ResourceView>;

/// `coordctl inspect --json`: the keys and the resources of the text report.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct InspectView {
    #[serde(flatten)]
    pub(crate) keys: SideEffectsView,
    pub(crate) resources: Vec<ResourceView>,
}

/// The side-effect keys: the named ones, or those of `page` (`None`: all).
pub(crate) async fn side_effects(
    stores: &Stores,
    named: Option<&[String]>,
    page: Option<&Page>,
    settled: bool,
) -> Result<SideEffectsView, Error> {
    let Names {
        names: keys,
        truncated,
        next_after,
    } = match named {
        Some(named) => Names::all(named.to_vec()),
        None => list_names(&stores.backend, ACT_PREFIX, page).await?,
    };
    let adapter = &stores.effects;
    let mut view = SideEffectsView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: 0,
        examined: keys.len(),
        truncated,
        next_after,
        uncertain: Vec::new(),
        in_flight: Vec::new(),
        completed: 0,
        idle: 0,
        settled: settled.then(Vec::new),
    };
    for key in keys {
        match adapter.key_status(&key).await.map_err(side_effect_error)? {
            KeyStatus::Uncertain { reason } => view.uncertain.push(UncertainKey {
                key,
                kind: UncertainKind::Marked,
                reason,
                resource: None,
                fence: None,
            }),
            KeyStatus::InFlight {
                resource,
                fence,
                live,
            } => {
                let res = adapter
                    .resource_status(&resource)
                    .await
                    .map_err(side_effect_error)?;
                // What `acquire` answers `Uncertain` for: an intent whose lease is gone.
                if !live {
                    view.uncertain.push(UncertainKey {
                        key: key.clone(),
                        kind: UncertainKind::LeaseLost,
                        reason: format!(
                            "intent ({fence}) lost its lease before completing: the holder died or released"
                        ),
                        resource: Some(resource.clone()),
                        fence: Some(fence.0),
                    });
                }
                view.in_flight.push(InFlightKey {
                    key,
                    resource,
                    fence: fence.0,
                    live,
                    resource_holder: res.holder,
                    lease_expires_ms: res.expires_at.map(ms),
                });
            }
            KeyStatus::Completed { result } => {
                view.completed += 1;
                if let Some(settled) = view.settled.as_mut() {
                    settled.push(SettledKey {
                        key,
                        state: "completed",
                        result: Some(shorten(&String::from_utf8_lossy(result.as_bytes()), 80)),
                    });
                }
            }
            KeyStatus::Idle => {
                view.idle += 1;
                if let Some(settled) = view.settled.as_mut() {
                    settled.push(SettledKey {
                        key,
                        state: "idle",
                        result: None,
                    });
                }
            }
            // A state this coordctl does not know: neither invented nor hidden.
            _ => view.uncertain.push(UncertainKey {
                key,
                kind: UncertainKind::Marked,
                reason: "in a state this coordctl does not know".into(),
                resource: None,
                fence: None,
            }),
        }
    }
    view.now_ms = ms(adapter.clock().now());
    Ok(view)
}

async fn resource_row(stores: &Stores, resource: String) -> Result<ResourceView, Error> {
    let s = stores
        .effects
        .resource_status(&resource)
        .await
        .map_err(side_effect_error)?;
    let state = match (&s.holder, s.live) {
        (None, _) => "free",
        (Some(_), true) => "live",
        (Some(_), false) => "expired",
    };
    Ok(ResourceView {
        resource,
        highest_fence: s.highest_fence.0,
        holder: s.holder,
        lease_expires_ms: s.expires_at.map(ms),
        state,
    })
}

/// The named resources, or those of `page` (`None`: all).
pub(crate) async fn resources(
    stores: &Stores,
    named: Option<Vec<String>>,
    page: Option<&Page>,
) -> Result<ResourcesView, Error> {
    let names = match named {
        Some(named) => Names::all(named),
        None => list_names(&stores.backend, RES_PREFIX, page).await?,
    };
    let mut view = names
        .read(stores, |name| async move {
            resource_row(stores, name).await.map(Some)
        })
        .await?;
    // The adapter's clock, as in the side-effect keys' view.
    view.listing.now_ms = ms(stores.effects.clock().now());
    Ok(view)
}
