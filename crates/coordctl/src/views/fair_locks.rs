//! `FairLock` keys (`/api/fairlocks`): the holder's lease and the waiters'
//! tickets in queue order. A key appears once whether it has a lock record,
//! a line record or both; tickets alone do not make a key. No token is shown.

use coord_backend::Error;
use serde::Serialize;

use super::{list_names, lock_error, lock_state, ms, Listing, Page, Stores};

/// `limit` names of `names` (sorted) after the cursor, with `(truncated, next_after)`.
fn paged(names: Vec<String>, page: &Page) -> (Vec<String>, bool, Option<String>) {
    let mut names = names
        .into_iter()
        .filter(|n| page.after.as_deref().is_none_or(|after| n.as_str() > after));
    let taken: Vec<String> = names.by_ref().take(page.limit).collect();
    let truncated = names.next().is_some();
    let next_after = truncated.then(|| taken.last().cloned()).flatten();
    (taken, truncated, next_after)
}

/// One waiter's ticket of a fair lock (no token).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct TicketView {
    /// The ticket's number: its place in line.
    pub(crate) seq: u64,
    /// Whether the ticket's lease is live (a dead one is skipped and removed).
    pub(crate) live: bool,
    pub(crate) lease_expires_ms: Option<u64>,
}

/// One `FairLock` key: the holder's lease and the waiters in line.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FairLockView {
    pub(crate) key: String,
    /// The fence of the latest grant.
    pub(crate) fence: u64,
    /// `held`, `expired` or `free`, as for `GenericLock`.
    pub(crate) state: &'static str,
    pub(crate) lease_expires_ms: Option<u64>,
    /// The waiters, in queue order.
    pub(crate) waiting: Vec<TicketView>,
}

/// The fair locks of one page.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FairLocksView {
    #[serde(flatten)]
    pub(crate) listing: Listing,
    pub(crate) locks: Vec<FairLockView>,
}

/// The fair locks of `page` (keys with a lock record `fairlock/<key>/m` or
/// a line record `fairlock/<key>/n`).
pub(crate) async fn fair_locks(stores: &Stores, page: &Page) -> Result<FairLocksView, Error> {
    let prefix = stores.fair_locks.key_prefix().to_owned();
    let (names, _, _) = list_names(&stores.backend, &prefix, None).await?;
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
    let (keys, truncated, next_after) = paged(keys, page);
    let mut rows = Vec::with_capacity(keys.len());
    for key in keys {
        let Some(status) = stores.fair_locks.status(&key).await.map_err(lock_error)? else {
            continue;
        };
        rows.push(FairLockView {
            state: lock_state(status.expires_at, status.live),
            key: status.key,
            fence: status.fence,
            lease_expires_ms: status.expires_at.map(ms),
            waiting: status
                .waiting
                .into_iter()
                .map(|t| TicketView {
                    seq: t.seq,
                    live: t.live,
                    lease_expires_ms: t.expires_at.map(ms),
                })
                .collect(),
        });
    }
    Ok(FairLocksView {
        listing: Listing::of(stores, truncated, next_after),
        locks: rows,
    })
}
