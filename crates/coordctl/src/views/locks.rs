//! `GenericLock` records (`/api/locks`): each key's latest fence and whether
//! its lease is held, expired or free. No token is shown.

use coord_backend::Error;
use serde::Serialize;

use super::{list_names, lock_error, ms, now_ms, Page, Stores};

/// One lock record of `GenericLock` (`lock/<key>`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct LockView {
    pub(crate) key: String,
    /// The fence of the latest grant.
    pub(crate) fence: u64,
    /// `held` (live lease), `expired` (a holder whose lease ran out) or `free`.
    pub(crate) state: &'static str,
    pub(crate) lease_expires_ms: Option<u64>,
}

/// The lock records of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct LocksView {
    pub(crate) namespace: String,
    pub(crate) now_ms: u64,
    pub(crate) truncated: bool,
    pub(crate) next_after: Option<String>,
    pub(crate) locks: Vec<LockView>,
}

/// The lock records of `page`.
pub(crate) async fn locks(stores: &Stores, page: &Page) -> Result<LocksView, Error> {
    let prefix = stores.locks.key_prefix().to_owned();
    let (keys, truncated, next_after) = list_names(&stores.backend, &prefix, Some(page)).await?;
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        // A key listed but gone (or unreadable as a lock key) is skipped, not invented.
        let Some(status) = stores.locks.status(&key).await.map_err(lock_error)? else {
            continue;
        };
        rows.push(LockView {
            state: match (status.expires_at, status.live) {
                (None, _) => "free",
                (Some(_), true) => "held",
                (Some(_), false) => "expired",
            },
            key: status.key,
            fence: status.fence,
            lease_expires_ms: status.expires_at.map(ms),
        });
    }
    Ok(LocksView {
        namespace: stores.backend.namespace().to_owned(),
        now_ms: now_ms(),
        truncated,
        next_after,
        locks: rows,
    })
}
