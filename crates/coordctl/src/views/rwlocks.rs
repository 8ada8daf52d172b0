//! `GenericRwLock` records (`/api/rwlocks`, the leaders page): the mode the
//! lock is held in, every holder with its fence and lease, and how many
//! writers wait. No token is shown.

use coord_adapters::rwlock::{GenericRwLock, RwLock, RwMode, RwStatus};
use coord_backend::Error;
use serde::Serialize;

use super::{lock_error, ms, read_page, Page, Paged, Row, Stores};

/// One holder of a read-write lock (no token: it is a credential).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RwHolderView {
    /// `read` or `write`.
    pub(crate) mode: &'static str,
    pub(crate) fence: u64,
    /// `held` (live lease) or `expired` (dropped at the record's next write).
    pub(crate) state: &'static str,
    pub(crate) lease_expires_ms: u64,
}

/// One record of `GenericRwLock` (`rwlock/<key>`).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RwLockView {
    pub(crate) key: String,
    /// The fence of the latest grant (readers and writers share the counter).
    pub(crate) fence: u64,
    /// `read` (live readers only), `write`, or `free`.
    pub(crate) state: &'static str,
    pub(crate) holders: Vec<RwHolderView>,
    /// Live writers waiting in `write` (new readers wait behind them).
    pub(crate) queued_writers: usize,
}

impl Row for RwLockView {
    const FIELD: &'static str = "rwlocks";
}

/// The read-write lock records of one page.
pub(crate) type RwLocksView = Paged<RwLockView>;

/// The read-write lock records of `page` (default prefix `rwlock/`).
pub(crate) async fn rwlocks(stores: &Stores, page: &Page) -> Result<RwLocksView, Error> {
    let rw = GenericRwLock::new(stores.backend.clone());
    let prefix = rw.key_prefix().to_owned();
    read_page(stores, &prefix, page, |key| {
        let rw = &rw;
        async move {
            let status = rw.status(&key).await.map_err(lock_error)?;
            Ok(status.map(rwlock_view))
        }
    })
    .await
}

fn rwlock_view(status: RwStatus) -> RwLockView {
    let live = |mode| status.holders.iter().any(|h| h.live && h.mode == mode);
    RwLockView {
        state: if live(RwMode::Write) {
            "write"
        } else if live(RwMode::Read) {
            "read"
        } else {
            "free"
        },
        holders: status
            .holders
            .iter()
            .map(|h| RwHolderView {
                mode: match h.mode {
                    RwMode::Read => "read",
                    RwMode::Write => "write",
                },
                fence: h.fence,
                state: if h.live { "held" } else { "expired" },
                lease_expires_ms: ms(h.expires_at),
            })
            .collect(),
        key: status.key,
        fence: status.fence,
        queued_writers: status.queued_writers,
    }
}
