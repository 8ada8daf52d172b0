//! `GenericSemaphore` keys (`/api/semaphores`): the permits asked for, how
//! many are held now, each permit's fence and lease, and how many waiters
//! stand in line. No token is shown.

use coord_backend::Error;
use serde::Serialize;

use super::{lock_error, ms, read_page, Page, Paged, Row, Stores};

/// One permit of a semaphore (no token).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct PermitView {
    pub(crate) fence: u64,
    pub(crate) live: bool,
    pub(crate) lease_expires_ms: u64,
}

/// One `GenericSemaphore` key: its permits and their holders.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct SemaphoreView {
    pub(crate) key: String,
    /// The fence of the latest permit.
    pub(crate) fence: u64,
    /// How many permits the holders asked for.
    pub(crate) permits: u32,
    /// How many permits are held now (live leases).
    pub(crate) held: usize,
    pub(crate) holders: Vec<PermitView>,
    /// How many waiting acquires stand in line (live places).
    pub(crate) waiting: usize,
}

impl Row for SemaphoreView {
    const FIELD: &'static str = "semaphores";
}

/// The semaphores of one page.
pub(crate) type SemaphoresView = Paged<SemaphoreView>;

/// The semaphores of `page` (records `sem/<key>`).
pub(crate) async fn semaphores(stores: &Stores, page: &Page) -> Result<SemaphoresView, Error> {
    let prefix = stores.semaphores.key_prefix().to_owned();
    read_page(stores, &prefix, page, |key| async move {
        let Some(status) = stores.semaphores.status(&key).await.map_err(lock_error)? else {
            return Ok(None);
        };
        let holders: Vec<PermitView> = status
            .holders
            .iter()
            .map(|h| PermitView {
                fence: h.fence,
                live: h.live,
                lease_expires_ms: ms(h.expires_at),
            })
            .collect();
        Ok(Some(SemaphoreView {
            held: holders.iter().filter(|h| h.live).count(),
            key: status.key,
            fence: status.fence,
            permits: status.permits,
            holders,
            waiting: status.waiting,
        }))
    })
    .await
}
