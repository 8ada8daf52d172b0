//! Announcements of storage formats on etcd (see `coord_backend::reclaim`,
//! "Mixed versions"): one key per client under
//! `coord-meta/<namespace>/clients/`, the namespace's required format at
//! `coord-meta/<namespace>/required`, and the compares that make a reclaim's
//! deletes fail when either changed after the reclaim checked them.

use std::time::Instant;

use coord_backend::reclaim::{self as floor};
use coord_backend::{Error, ReclaimOptions, Result};
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};

use crate::errors::Call;
use crate::{prefix_range_end, EtcdBackend};

/// Most stale announcements one announcement removes.
const MAX_STALE_REMOVED: usize = 32;

/// An announcement or a reclaim's check changes nothing a reader sees: an
/// unknown outcome is "try again later".
fn harmless(error: Error) -> Error {
    match error {
        Error::Indeterminate { message, source } => Error::Unavailable { message, source },
        other => other,
    }
}

fn gets(response: Vec<TxnOpResponse>) -> Result<Vec<Vec<KeyValue>>> {
    response
        .into_iter()
        .map(|r| match r {
            TxnOpResponse::Get(mut get) => Ok(get.take_kvs()),
            _ => Err(Error::Unavailable {
                message: "etcd answered a get with another op".to_owned(),
                source: None,
            }),
        })
        .collect()
}

/// A required format as stored (a decimal).
fn decode_required(kv: &KeyValue) -> Result<u32> {
    std::str::from_utf8(kv.value())
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| {
            Error::malformed(
                "<required storage format>",
                "not a decimal (not written by coord-etcd)",
            )
        })
}

/// An announcement as stored: `(format, milliseconds)`, `None` when it
/// cannot be read (such a key is treated as stale).
fn decode_announcement(kv: &KeyValue) -> Option<(u32, u64)> {
    let (format, at) = std::str::from_utf8(kv.value()).ok()?.split_once(':')?;
    Some((format.parse().ok()?, at.parse().ok()?))
}

impl EtcdBackend {
    fn clients_range(&self) -> GetOptions {
        GetOptions::new().with_range(prefix_range_end(&self.clients))
    }

    /// Announce this client's format when due: one read (the required
    /// format, the marker, one key of the namespace, the announcements),
    /// once per namespace one txn writing the required format, and one txn
    /// putting this client's announcement and removing stale ones that did
    /// not change since the read.
    pub(crate) async fn announce(&self) -> Result<()> {
        if !self.announcer.due() {
            return Ok(());
        }
        let sent = Instant::now();
        let now = floor::now_ms();
        let ours = self.announcer.format();
        let look = Txn::new().and_then(vec![
            TxnOp::get(self.required.clone(), None),
            TxnOp::get(self.marker.clone(), None),
            TxnOp::get(
                self.prefix.to_vec(),
                Some(
                    GetOptions::new()
                        .with_range(prefix_range_end(&self.prefix))
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
            TxnOp::get(self.clients.clone(), Some(self.clients_range())),
        ]);
        let mut kv = self.kv.clone();
        let response = self.call("announce", Call::Read, kv.txn(look)).await?;
        let [required, marker, first, clients]: [Vec<KeyValue>; 4] = gets(response.op_responses())?
            .try_into()
            .map_err(|_| Error::Unavailable {
                message: "etcd: the announcement read got too few answers".to_owned(),
                source: None,
            })?;
        let required = match required.first() {
            Some(kv) => decode_required(kv)?,
            None => {
                // The first announcement: records (or a marker, made by an
                // older client's reclaim) from before announcements → 0.
                let fresh = marker.is_empty() && first.is_empty();
                let value = if fresh { ours } else { 0 };
                let mut compares =
                    vec![Compare::version(self.required.clone(), CompareOp::Equal, 0)];
                if fresh {
                    compares.push(Compare::version(self.marker.clone(), CompareOp::Equal, 0));
                    compares.push(
                        Compare::version(self.prefix.to_vec(), CompareOp::Equal, 0)
                            .with_range(prefix_range_end(&self.prefix)),
                    );
                }
                let create = Txn::new()
                    .when(compares)
                    .and_then(vec![TxnOp::put(
                        self.required.clone(),
                        value.to_string(),
                        None,
                    )])
                    .or_else(vec![TxnOp::get(self.required.clone(), None)]);
                let response = self
                    .call("announce", Call::Write, kv.txn(create))
                    .await
                    .map_err(harmless)?;
                if response.succeeded() {
                    value
                } else {
                    match gets(response.op_responses())?
                        .pop()
                        .unwrap_or_default()
                        .first()
                    {
                        Some(kv) => decode_required(kv)?,
                        // Someone wrote the namespace meanwhile: try again.
                        None => {
                            return Err(Error::Unavailable {
                                message: "etcd: the namespace changed while its required \
                                          storage format was written; try again"
                                    .to_owned(),
                                source: None,
                            })
                        }
                    }
                }
            }
        };
        floor::check_announce(ours, required)?;
        let mut own = self.clients.clone();
        own.extend_from_slice(self.announcer.id().as_bytes());
        let since = floor::recent_since(now);
        let stale: Vec<&KeyValue> = clients
            .iter()
            .filter(|kv| kv.key() != own.as_slice())
            .filter(|kv| decode_announcement(kv).is_none_or(|(_, at)| at < since))
            .take(MAX_STALE_REMOVED)
            .collect();
        let put = TxnOp::put(own.clone(), format!("{ours}:{now}"), None);
        let upsert = Txn::new()
            .when(
                stale
                    .iter()
                    .map(|kv| Compare::mod_revision(kv.key(), CompareOp::Equal, kv.mod_revision()))
                    .collect::<Vec<_>>(),
            )
            .and_then(
                std::iter::once(put.clone())
                    .chain(stale.iter().map(|kv| TxnOp::delete(kv.key(), None)))
                    .collect::<Vec<_>>(),
            )
            .or_else(vec![put]);
        self.call("announce", Call::Write, kv.txn(upsert))
            .await
            .map_err(harmless)?;
        self.announcer.announced(sent);
        Ok(())
    }

    /// A reclaim's check: refuses while an older client was seen (or the
    /// namespace's required format says so), raises the required format
    /// when the operator said older clients are stopped, and returns the
    /// compares every delete of this reclaim carries: no announcement and
    /// no required format written since the check.
    pub(crate) async fn check_formats(&self, options: &ReclaimOptions) -> Result<Vec<Compare>> {
        let ours = self.announcer.format();
        let look = Txn::new().and_then(vec![
            TxnOp::get(self.required.clone(), None),
            TxnOp::get(self.clients.clone(), Some(self.clients_range())),
        ]);
        let mut kv = self.kv.clone();
        let response = self.call("reclaim", Call::Read, kv.txn(look)).await?;
        let mut revision = response.header().map(|h| h.revision()).unwrap_or(0);
        let [required, clients]: [Vec<KeyValue>; 2] = gets(response.op_responses())?
            .try_into()
            .map_err(|_| Error::Unavailable {
                message: "etcd: the reclaim's check got too few answers".to_owned(),
                source: None,
            })?;
        let (required_value, required_rev) = match required.first() {
            Some(kv) => (decode_required(kv)?, kv.mod_revision()),
            None => (0, 0),
        };
        let since = floor::recent_since(floor::now_ms());
        let older = clients
            .iter()
            .filter_map(decode_announcement)
            .filter(|(format, at)| *format < ours && *at >= since)
            .max_by_key(|(_, at)| *at);
        let raise =
            floor::check_reclaim(ours, required_value, older, options.older_clients_stopped)?;
        if raise {
            let put = Txn::new()
                .when(vec![Compare::mod_revision(
                    self.required.clone(),
                    CompareOp::Equal,
                    required_rev,
                )])
                .and_then(vec![TxnOp::put(
                    self.required.clone(),
                    ours.to_string(),
                    None,
                )]);
            let response = self
                .call("reclaim", Call::Write, kv.txn(put))
                .await
                .map_err(harmless)?;
            if !response.succeeded() {
                return Err(Error::Unavailable {
                    message: "etcd: the required storage format changed during the reclaim's \
                              check; try again"
                        .to_owned(),
                    source: None,
                });
            }
            revision = response.header().map(|h| h.revision()).unwrap_or(revision);
        }
        if revision <= 0 {
            return Err(Error::Unavailable {
                message: "etcd sent no revision with the reclaim's check".to_owned(),
                source: None,
            });
        }
        Ok(vec![
            Compare::mod_revision(self.required.clone(), CompareOp::Less, revision + 1),
            Compare::mod_revision(self.clients.clone(), CompareOp::Less, revision + 1)
                .with_range(prefix_range_end(&self.clients)),
        ])
    }
}
