//! `GenericLock` records (`/api/locks`): each key's latest fence and whether
//! its lease is held, expired or free. No token is shown.

use coord_backend::Error;
use serde::Serialize;

use super::{lock_error, lock_state, ms, read_page, Listing, Page, Stores};

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
    #[serde(flatten)]
    pub(crate) listing: Listing,
    pub(crate) locks: Vec<LockView>,
}

/// The lock records of `page`.
pub(crate) async fn locks(stores: &Stores, page: &Page) -> Result<LocksView, Error> {
    let prefix = stores.locks.key_prefix().to_owned();
    let (listing, statuses) = read_page(stores, &prefix, page, |key| async move {
        stores.locks.status(&key).await.map_err(lock_error)
    })
    .await?;
    let locks = statuses
        .into_iter()
        .map(|status| LockView {
            state: lock_state(status.expires_at, status.live),
            key: status.key,
            fence: status.fence,
            lease_expires_ms: status.expires_at.map(ms),
        })
        .collect();
    Ok(LocksView { listing, locks })
}
