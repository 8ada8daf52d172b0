//! `GenericLock` records (`/api/locks`): each key's latest fence and whether
//! its lease is held, expired or free. No token is shown.

use std::time::SystemTime;

use coord_backend::Error;
use serde::Serialize;

use super::{lock_error, lock_state, ms, read_page, Page, Paged, Row, Stores};

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

impl LockView {
    /// The row of a lock whose holder's lease ends at `expires_at` (`None`:
    /// nobody holds it), `live` or not; `FairLock` keys share it.
    pub(crate) fn of(key: String, fence: u64, expires_at: Option<SystemTime>, live: bool) -> Self {
        LockView {
            key,
            fence,
            state: lock_state(expires_at, live),
            lease_expires_ms: expires_at.map(ms),
        }
    }
}

impl Row for LockView {
    const FIELD: &'static str = "locks";
}

/// The lock records of one page.
pub(crate) type LocksView = Paged<LockView>;

/// The lock records of `page`.
pub(crate) async fn locks(stores: &Stores, page: &Page) -> Result<LocksView, Error> {
    let prefix = stores.locks.key_prefix().to_owned();
    read_page(stores, &prefix, page, |key| async move {
        let status = stores.locks.status(&key).await.map_err(lock_error)?;
        Ok(status.map(|s| LockView::of(s.key, s.fence, s.expires_at, s.live)))
    })
    .await
}
