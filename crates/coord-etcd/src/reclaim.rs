//! `Backend::reclaim` on etcd: the floor marker, then real deletes of the
//! tombstones written before it (the crate docs, "Versions", say why no
//! version is ever handed out twice); and the marker a namespace nobody has
//! written yet starts with.

use std::sync::atomic::Ordering;

use coord_backend::{Error, ReclaimOptions, Reclaimed, Result};
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};

use crate::errors::Call;
use crate::layout::{Mode, MARKER_CLEAN, MARKER_DIRTY, TOMBSTONE};
use crate::EtcdBackend;

/// A reclaim changes nothing a reader can see: whatever became of a call
/// whose answer was lost, trying again later is right.
fn harmless(error: Error) -> Error {
    match error {
        Error::Indeterminate { message, source } => Error::Unavailable { message, source },
        other => other,
    }
}

impl EtcdBackend {
    pub(crate) async fn reclaim_impl(&self, options: &ReclaimOptions) -> Result<Reclaimed> {
        self.announce().await?;
        let guard = self.check_formats(options).await?;
        if let Mode::Floor { clean: true, .. } = self.ensure_marker().await? {
            return Ok(Reclaimed::new(0, false));
        }
        let max = options.max_tombstones.max(1);
        let (found, complete) = self.find_tombstones(max).await?;
        let mut removed = 0;
        // Two compares of the guard per txn (the limits keep room for them).
        let per_txn = self.limits.max_keys_per_call.max(1);
        for batch in found.chunks(per_txn) {
            removed += self.delete_tombstones(batch, &guard).await?;
        }
        if complete {
            // Every tombstone the scan saw is gone or no tombstone any more,
            // and none can be written after the marker: say so, so that
            // later reclaims return at once.
            let mut kv = self.kv.clone();
            let put = Txn::new().and_then(vec![TxnOp::put(
                self.marker.clone(),
                MARKER_CLEAN.to_vec(),
                None,
            )]);
            self.call("reclaim", Call::Write, kv.txn(put))
                .await
                .map_err(harmless)?;
            if let Some(Mode::Floor { floor, .. }) = self.known_mode() {
                self.learn_mode(Mode::Floor { floor, clean: true });
            }
        }
        Ok(Reclaimed::new(removed, !complete))
    }

    /// Before this backend's first txn, when it has not seen the marker: a
    /// namespace without marker and without any etcd key (never written)
    /// gets the marker, "clean", so it starts in floor mode and deletes are
    /// real from its first write on. One read (the marker and at most one
    /// key of the namespace) per backend, and for a new namespace one txn
    /// that creates the marker only while the marker is absent and the
    /// namespace's whole range is empty: a client that wrote meanwhile (in
    /// tombstone mode, under its "no marker" compare) keeps the namespace
    /// in tombstone mode, and of two clients creating it at once one
    /// creates the marker and the other reads it. A namespace with keys and
    /// no marker (written before this version) stays in tombstone mode
    /// until its first reclaim.
    pub(crate) async fn start_namespace(&self) -> Result<()> {
        if !self.options.new_namespaces_in_floor_mode
            || self.known_mode().is_some()
            || self.probed.load(Ordering::Acquire)
        {
            return Ok(());
        }
        let end = crate::prefix_range_end(&self.prefix);
        let look = Txn::new().and_then(vec![
            TxnOp::get(self.marker.clone(), None),
            TxnOp::get(
                self.prefix.to_vec(),
                Some(
                    GetOptions::new()
                        .with_range(end.clone())
                        .with_limit(1)
                        .with_keys_only(),
                ),
            ),
        ]);
        let mut kv = self.kv.clone();
        let response = self.call("txn", Call::Read, kv.txn(look)).await?;
        let mut responses = response.op_responses().into_iter();
        let (Some(marker), Some(etcd_client::TxnOpResponse::Get(first))) =
            (responses.next(), responses.next())
        else {
            return Err(Error::Unavailable {
                message: "etcd: the namespace probe got too few answers".to_owned(),
                source: None,
            });
        };
        if self.decode_marker(marker)?.is_some() || !first.kvs().is_empty() {
            self.probed.store(true, Ordering::Release);
            return Ok(());
        }
        let create = Txn::new()
            .when(vec![
                Compare::version(self.marker.clone(), CompareOp::Equal, 0),
                Compare::version(self.prefix.to_vec(), CompareOp::Equal, 0).with_range(end),
                Compare::version(self.required.clone(), CompareOp::Equal, 0),
            ])
            .and_then(vec![
                TxnOp::put(self.marker.clone(), MARKER_CLEAN.to_vec(), None),
                // Started by this build: no record from before announcements.
                TxnOp::put(
                    self.required.clone(),
                    self.announcer.format().to_string(),
                    None,
                ),
            ])
            .or_else(vec![TxnOp::get(self.marker.clone(), None)]);
        let response = self
            .call("txn", Call::Write, kv.txn(create))
            .await
            .map_err(harmless)?;
        if response.succeeded() {
            let floor = response.header().map(|h| h.revision()).unwrap_or(0);
            if floor > 0 {
                self.learn_mode(Mode::Floor { floor, clean: true });
            }
        } else if let Some(get) = response.op_responses().pop() {
            // The marker (learnt if it exists), or someone wrote first.
            self.decode_marker(get)?;
        }
        self.probed.store(true, Ordering::Release);
        Ok(())
    }

    /// The namespace's mode, creating the marker if it does not exist yet.
    async fn ensure_marker(&self) -> Result<Mode> {
        if let Some(mode) = self.known_mode() {
            return Ok(mode);
        }
        let create = Txn::new()
            .when(vec![Compare::version(
                self.marker.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                self.marker.clone(),
                MARKER_DIRTY.to_vec(),
                None,
            )])
            .or_else(vec![TxnOp::get(self.marker.clone(), None)]);
        let mut kv = self.kv.clone();
        let response = self
            .call("reclaim", Call::Write, kv.txn(create))
            .await
            .map_err(harmless)?;
        if response.succeeded() {
            let floor = response.header().map(|h| h.revision()).unwrap_or(0);
            if floor <= 0 {
                return Err(Error::Unavailable {
                    message: "etcd created the floor marker but sent no revision".to_owned(),
                    source: None,
                });
            }
            let mode = Mode::Floor {
                floor,
                clean: false,
            };
            self.learn_mode(mode);
            return Ok(mode);
        }
        let mut responses = response.op_responses();
        let found = match responses.pop() {
            Some(get) => self.decode_marker(get)?,
            None => None,
        };
        found.ok_or_else(|| Error::Unavailable {
            message: "etcd refused to create the floor marker but shows none".to_owned(),
            source: None,
        })
    }

    /// Up to `max` tombstones of the namespace as `(etcd key, mod
    /// revision)`, read page by page at one revision; `true` when the scan
    /// reached the end of the namespace.
    async fn find_tombstones(&self, max: usize) -> Result<(Vec<(Vec<u8>, i64)>, bool)> {
        let mut found = Vec::new();
        let complete = self
            .scan("", "reclaim", |kv| {
                if kv.value() == TOMBSTONE {
                    found.push((kv.key().to_vec(), kv.mod_revision()));
                }
                Ok(found.len() < max)
            })
            .await?;
        Ok((found, complete))
    }

    /// Delete each tombstone that was not written since the scan (one txn;
    /// when one of them changed, one txn each); returns how many went.
    async fn delete_tombstones(&self, batch: &[(Vec<u8>, i64)], guard: &[Compare]) -> Result<u64> {
        let txn = |items: &[(Vec<u8>, i64)]| {
            Txn::new()
                .when(
                    items
                        .iter()
                        .map(|(key, rev)| {
                            Compare::mod_revision(key.clone(), CompareOp::Equal, *rev)
                        })
                        .chain(guard.iter().cloned())
                        .collect::<Vec<_>>(),
                )
                .and_then(
                    items
                        .iter()
                        .map(|(key, _)| TxnOp::delete(key.clone(), None))
                        .collect::<Vec<_>>(),
                )
        };
        let mut kv = self.kv.clone();
        let all = self
            .call("reclaim", Call::Write, kv.txn(txn(batch)))
            .await
            .map_err(harmless)?;
        let mut removed = 0;
        if all.succeeded() {
            removed = batch.len() as u64;
        } else {
            for item in batch {
                let one = self
                    .call(
                        "reclaim",
                        Call::Write,
                        kv.txn(txn(std::slice::from_ref(item))),
                    )
                    .await
                    .map_err(harmless)?;
                removed += u64::from(one.succeeded());
            }
        }
        for (key, _) in batch {
            self.remember(key, None);
        }
        Ok(removed)
    }
}
