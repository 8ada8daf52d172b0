//! `txn` on etcd: coord asserts as etcd compares (the crate docs, "Versions",
//! say why each compare is there).

use std::collections::HashSet;

use coord_backend::{Assert, Error, Mutation, Result, TxnOutcome, Version};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use crate::errors::Call;
use crate::layout::{encode_live, etcd_version_of, Mode, Stored, TOMBSTONE};
use crate::{EtcdBackend, Hint};

/// How many txns one `txn` call may send when its guesses about how an
/// asserted key is represented (absent or tombstone; which lifetime) keep
/// being wrong. Each retry follows a change someone else made (a delete of
/// a deleted key, a reclaim creating the marker or removing a tombstone),
/// so a call settles unless others keep moving its keys all along.
const MAX_REPRESENTATION_ATTEMPTS: usize = 16;

/// How one asserted key is compared: a guess at its etcd representation,
/// from what this backend last saw of it. A wrong guess is refused by etcd,
/// and the `Else` gets show the real one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Guess {
    /// "missing" as no etcd key.
    Absent,
    /// "missing" as a tombstone at this etcd version.
    Tombstone(i64),
    /// A live version, as etcd version `version` of the lifetime created at
    /// `create` (unknown: a lifetime from before the floor marker, the only
    /// kind whose etcd version is coord's); `seen_live`: this backend saw
    /// that write hold a live value, so it cannot be a tombstone.
    Live {
        version: i64,
        create: Option<i64>,
        seen_live: bool,
    },
}

impl Guess {
    /// The first guess for `assert`, from the key's hint.
    fn first(assert: &Assert, hint: Option<Hint>, mode: Mode) -> Guess {
        if assert.version.is_missing() {
            return match hint {
                Some(Hint::Tombstone(t)) => Guess::Tombstone(t),
                _ => Guess::Absent,
            };
        }
        let coord = i64::try_from(assert.version.0).unwrap_or(i64::MAX);
        match hint {
            Some(Hint::Live {
                version,
                create: Some(create),
            }) => match etcd_version_of(assert.version, create, mode) {
                Some(at) => Guess::Live {
                    version: at,
                    create: Some(create),
                    seen_live: at == version,
                },
                None => Guess::Live {
                    version: coord,
                    create: None,
                    seen_live: false,
                },
            },
            Some(Hint::Live {
                version,
                create: None,
            }) => Guess::Live {
                version: coord,
                create: None,
                seen_live: version == coord,
            },
            _ => Guess::Live {
                version: coord,
                create: None,
                seen_live: false,
            },
        }
    }

    /// The exact guess for a key etcd showed as `stored`.
    fn exact(stored: &Stored) -> Guess {
        match stored {
            Stored::Absent => Guess::Absent,
            Stored::Tombstone(t) => Guess::Tombstone(*t),
            Stored::Live {
                version, create, ..
            } => Guess::Live {
                version: *version,
                create: Some(*create),
                seen_live: true,
            },
        }
    }

    /// At most three compares per key (the crate's limits count on it).
    fn compares(self, key: &[u8], mode: Mode, out: &mut Vec<Compare>) {
        let floor = match mode {
            Mode::Floor { floor, .. } => Some(floor),
            Mode::Tombstones => None,
        };
        match self {
            Guess::Absent => out.push(Compare::version(key, CompareOp::Equal, 0)),
            Guess::Tombstone(t) => {
                out.push(Compare::version(key, CompareOp::Equal, t));
                out.push(Compare::value(key, CompareOp::Equal, TOMBSTONE));
            }
            Guess::Live {
                version,
                create,
                seen_live,
            } => {
                out.push(Compare::version(key, CompareOp::Equal, version));
                match (create, floor) {
                    (Some(create), Some(_)) => {
                        out.push(Compare::create_revision(key, CompareOp::Equal, create))
                    }
                    // A lifetime from before the marker: a later lifetime
                    // at the same etcd version has another coord version.
                    (None, Some(floor)) => {
                        out.push(Compare::create_revision(key, CompareOp::Less, floor))
                    }
                    // No marker (the txn compares its absence): nothing was
                    // ever deleted in etcd, as a reclaim creates the marker
                    // before its first delete, so every key has had one
                    // lifetime and its version alone names the write.
                    (_, None) => {}
                }
                // Only lifetimes from before the marker hold tombstones.
                let may_be_tombstone = match (create, floor) {
                    (Some(create), Some(floor)) => create < floor,
                    _ => true,
                };
                if may_be_tombstone && !seen_live {
                    out.push(Compare::value(key, CompareOp::NotEqual, TOMBSTONE));
                }
            }
        }
    }
}

/// One asserted key of a txn, as it is being compared.
struct Asserted<'a> {
    key: &'a str,
    etcd_key: Vec<u8>,
    version: Version,
    guess: Guess,
}

impl EtcdBackend {
    pub(crate) async fn txn_impl(
        &self,
        asserts: &[Assert],
        mutations: &[Mutation],
    ) -> Result<TxnOutcome> {
        self.start_namespace().await?;
        self.announce().await?;
        // Until the marker is known to exist, every txn also asserts that it
        // does not (a reclaim creating it changes how versions read).
        let mut mode = self.known_mode().unwrap_or(Mode::Tombstones);
        let mut seen = HashSet::new();
        let mut asserted: Vec<Asserted<'_>> = {
            let hints = self.hints();
            asserts
                .iter()
                .filter(|a| seen.insert(a.key.as_str()))
                .map(|a| {
                    let etcd_key = self.etcd_key(&a.key);
                    let guess = Guess::first(a, hints.get(&etcd_key).copied(), mode);
                    Asserted {
                        key: &a.key,
                        etcd_key,
                        version: a.version,
                        guess,
                    }
                })
                .collect()
        };
        for _attempt in 0..MAX_REPRESENTATION_ATTEMPTS {
            let mut compares = Vec::with_capacity(asserted.len() * 3 + 1);
            for a in &asserted {
                a.guess.compares(&a.etcd_key, mode, &mut compares);
            }
            let guarded = mode == Mode::Tombstones;
            if guarded {
                compares.push(Compare::version(
                    self.marker.as_slice(),
                    CompareOp::Equal,
                    0,
                ));
            }
            let writes: Vec<TxnOp> = mutations
                .iter()
                .map(|m| match (m, mode) {
                    (Mutation::Put { key, value }, _) => {
                        TxnOp::put(self.etcd_key(key), encode_live(value), None)
                    }
                    (Mutation::Delete { key }, Mode::Tombstones) => {
                        TxnOp::put(self.etcd_key(key), TOMBSTONE.to_vec(), None)
                    }
                    (Mutation::Delete { key }, Mode::Floor { .. }) => {
                        TxnOp::delete(self.etcd_key(key), None)
                    }
                })
                .collect();
            let mut gets: Vec<TxnOp> = asserted
                .iter()
                .map(|a| TxnOp::get(a.etcd_key.clone(), None))
                .collect();
            if guarded {
                gets.push(TxnOp::get(self.marker.clone(), None));
            }
            let request = Txn::new().when(compares).and_then(writes).or_else(gets);
            let mut kv = self.kv.clone();
            let response = self.call("txn", Call::Write, kv.txn(request)).await?;

            if response.succeeded() {
                let revision = response.header().map(|h| h.revision()).unwrap_or(0);
                let written = self.after_commit(&asserted, mutations, mode, revision);
                return Ok(TxnOutcome::applied_at(written));
            }

            let mut responses = response.op_responses();
            let expected = asserted.len() + usize::from(guarded);
            if responses.len() != expected {
                // The txn was rejected (nothing written), but its answer is unusable.
                return Err(Error::Unavailable {
                    message: format!(
                        "etcd txn: {} Else answers for {expected} gets",
                        responses.len()
                    ),
                    source: None,
                });
            }
            if guarded {
                let marker = responses.pop().expect("counted above");
                if let Some(found) = self.decode_marker(marker)? {
                    // A reclaim created the marker: decide again under it.
                    mode = found;
                }
            }
            let mut stored_now = Vec::with_capacity(asserted.len());
            for (a, response) in asserted.iter().zip(responses) {
                stored_now.push(self.decode_get(a.key, &a.etcd_key, response)?);
            }
            let all_hold = asserted
                .iter()
                .zip(&stored_now)
                .all(|(a, s)| s.coord_version(mode) == a.version);
            let current = asserted
                .iter()
                .zip(stored_now.iter().cloned())
                .map(|(a, s)| s.into_entry(a.key, mode))
                .collect();
            if !all_hold {
                return Ok(TxnOutcome::rejected(current));
            }
            // Every assert held as coord sees it: a key was compared in the
            // wrong representation, or the marker appeared. Compare each as
            // it is now.
            for (a, stored) in asserted.iter_mut().zip(&stored_now) {
                a.guess = Guess::exact(stored);
            }
        }
        // Every assert held at each look, but the representations kept
        // moving under us (concurrent deletes of deleted keys, reclaims).
        // Not a rejection (that would say an assert failed): nothing was
        // written, so the call is unavailable and safe to retry.
        Err(Error::Unavailable {
            message: format!(
                "etcd txn: the asserted keys changed representation {MAX_REPRESENTATION_ATTEMPTS} \
                 times while every assert held; nothing was written"
            ),
            source: None,
        })
    }

    /// Update the hints after a committed txn at etcd revision `revision`;
    /// the coord versions of the asserted keys it put (in floor mode a
    /// created key's version is its creation revision, which no caller can
    /// guess).
    fn after_commit(
        &self,
        asserted: &[Asserted<'_>],
        mutations: &[Mutation],
        mode: Mode,
        revision: i64,
    ) -> Vec<(String, Version)> {
        let mut written = Vec::new();
        for mutation in mutations {
            let etcd_key = self.etcd_key(mutation.key());
            let before = asserted
                .iter()
                .find(|a| a.key == mutation.key())
                .map(|a| a.guess);
            // Every compare held, so an asserted key was as guessed and this
            // write moved it on; of an unasserted key we know nothing.
            let hint = match (mutation, before, mode) {
                (Mutation::Delete { .. }, Some(Guess::Absent), Mode::Tombstones) => {
                    Some(Hint::Tombstone(1))
                }
                (Mutation::Delete { .. }, Some(Guess::Tombstone(t)), Mode::Tombstones) => {
                    Some(Hint::Tombstone(t + 1))
                }
                (Mutation::Delete { .. }, Some(Guess::Live { version, .. }), Mode::Tombstones) => {
                    Some(Hint::Tombstone(version + 1))
                }
                (Mutation::Put { .. }, Some(Guess::Absent), _) if revision > 0 => {
                    Some(Hint::Live {
                        version: 1,
                        create: Some(revision),
                    })
                }
                (Mutation::Put { .. }, Some(Guess::Tombstone(t)), _) => Some(Hint::Live {
                    version: t + 1,
                    create: None,
                }),
                (
                    Mutation::Put { .. },
                    Some(Guess::Live {
                        version, create, ..
                    }),
                    _,
                ) => Some(Hint::Live {
                    version: version + 1,
                    create,
                }),
                _ => None,
            };
            if let Some(Hint::Live { version, create }) = hint {
                let coord = match create {
                    Some(create) => crate::layout::coord_version_of(version, create, mode),
                    None => version as u64,
                };
                written.push((mutation.key().to_owned(), Version(coord)));
            }
            self.remember(&etcd_key, hint);
        }
        written
    }
}
