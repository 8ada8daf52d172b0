//! `FairLock` keys (`/api/fairlocks`): the holder's lease and the waiters'
//! tickets in queue order. A key appears once whether it has a lock record,
//! a line record or both; tickets alone do not make a key. No token is shown.

use coord_backend::Error;
use serde::Serialize;

use super::{list_names, lock_error, ms, LockView, Names, Page, Paged, Row, Stores};

/// One waiter's ticket of a fair lock (no token).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TicketView {
    /// The ticket's number: its place in line.
    pub(crate) seq: u64,
    /// Whether the ticket's lease is live (a dead one is skipped and removed).
    pub(crate) live: bool,
    pub(crate) lease_expires_ms: Option<u64>,
}

/// One `FairLock` key: the holder's lease, as a `GenericLock` row shows it
/// (same fields, same states), and the waiters in line.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FairLockView {
    #[serde(flatten)]
    pub(crate) lock: LockView,
    /// The waiters, in queue order.
    pub(crate) waiting: Vec<TicketView>,
}

impl Row for FairLockView {
    const FIELD: &'static str = "locks";
}

/// The fair locks of one page.
pub(crate) type FairLocksView = Paged<FairLockView>;

/// The fair locks of `page` (keys with a lock record `fairlock/<key>/m` or
/// a line record `fairlock/<key>/n`).
pub(crate) async fn fair_locks(stores: &Stores, page: &Page) -> Result<FairLocksView, Error> {
    let prefix = stores.fair_locks.key_prefix().to_owned();
    let names = list_names(&stores.backend, &prefix, None).await?.names;
    // Ticket keys end in `/q/<20 digits>`, lock records in `/m`, lines in `/n`.
    let mut keys: Vec<String> = names
        .into_iter()
        .filter_map(|n| {
            n.strip_suffix("/m")
                .or_else(|| n.strip_suffix("/n"))
                .map(str::to_owned)
        })
        .filter(|k| !k.is_empty())
        .collect();
    keys.sort();
    keys.dedup();
    Names::window(keys, page)
        .read(stores, |key| async move {
            let status = stores.fair_locks.status(&key).await.map_err(lock_error)?;
            Ok(status.map(|s| FairLockView {
                lock: LockView::of(s.key, s.fence, s.expires_at, s.live),
                waiting: s
                    .waiting
                    .into_iter()
                    .map(|t| TicketView {
                        seq: t.seq,
                        live: t.live,
                        lease_expires_ms: t.expires_at.map(ms),
                    })
                    .collect(),
            }))
        })
        .await
}
