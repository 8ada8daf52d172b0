//! Where an adapter keeps its records, and the options every adapter shares.
//!
//! Each adapter (lock, fair lock, semaphore, read-write lock, election,
//! board) decides through one [`CasEngine`], judges leases by one
//! [`Clock`] and keeps its records under one key prefix: a [`RecordSpace`].
//! Its options struct is made by `record_options!`, so `clock`,
//! `key_prefix` and `cas` mean the same everywhere, with the same
//! `with_*` setters.

use std::sync::Arc;

use coord_backend::{Backend, Clock, Error};

use super::{CasEngine, CasOptions, CasStats, Decision, Record};

/// What a decision over one record does (see [`RecordSpace::decide_record`]).
pub(crate) enum Verdict<R, T> {
    /// Answer, writing nothing (confirmed like [`Decision::Return`]).
    Keep(T),
    /// Write the record (stamped with a fresh nonce), then answer.
    Write(R, T),
}

/// What a grant fixes before its decision's first attempt (the engine may
/// decide several times): when it was asked for, now by the space's clock,
/// when the lease would end, and the grant's fresh token. Every attempt
/// grants the same token, and the lease counts from no later than `sent`.
pub(crate) struct LeaseOffer {
    pub(crate) sent: tokio::time::Instant,
    pub(crate) now: u64,
    pub(crate) expires_ms: u64,
    pub(crate) token: String,
}

impl LeaseOffer {
    /// When the offered lease ends, as a time.
    pub(crate) fn expires_at(&self) -> std::time::SystemTime {
        super::record::time_at(self.expires_ms)
    }
}

/// An adapter's engine, clock and key prefix (see the [module docs](self)).
#[derive(Clone, Debug)]
pub struct RecordSpace {
    engine: CasEngine,
    clock: Arc<dyn Clock>,
    prefix: String,
}

impl RecordSpace {
    /// Records under `prefix` in `backend`, decided by an engine tuned by
    /// `cas`, leases judged by `clock`.
    pub fn new(
        backend: Arc<dyn Backend>,
        cas: CasOptions,
        clock: Arc<dyn Clock>,
        prefix: String,
    ) -> Self {
        RecordSpace {
            engine: CasEngine::with_options(backend, cas),
            clock,
            prefix,
        }
    }

    /// Decide over the one record of `name` (`<prefix><name>`): `decide`
    /// gets it as the view holds it (`None`: missing) and keeps or rewrites
    /// it; an `Err` is a refusal, confirmed like every answer decided on a
    /// remembered view (see [`CasEngine::decide`]).
    pub(crate) async fn decide_record<R, T, E>(
        &self,
        name: &str,
        mut decide: impl FnMut(Option<R>) -> Result<Verdict<R, T>, E>,
    ) -> Result<T, E>
    where
        R: Record,
        E: From<Error>,
    {
        let record_key = self.key(name);
        let keys = [record_key.clone()];
        self.engine
            .decide(&keys, |view| {
                Ok(match decide(R::read(view, &record_key)?)? {
                    Verdict::Keep(answer) => Decision::Return(answer),
                    Verdict::Write(mut record, then) => Decision::Commit {
                        mutations: vec![record.put(record_key.clone())],
                        then,
                    },
                })
            })
            .await
    }

    /// The key of the record named `name`: `<prefix><name>`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The prefix of every record key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The engine every decision goes through.
    pub fn engine(&self) -> &CasEngine {
        &self.engine
    }

    /// The backend under the engine.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.engine.backend()
    }

    /// The backend's store name (see [`CasEngine::store_name`]).
    pub fn store_name(&self) -> &'static str {
        self.engine.store_name()
    }

    /// How many keys one store call may name (the backend's
    /// `max_keys_per_call`).
    pub fn keys_per_call(&self) -> usize {
        self.engine.backend().limits().max_keys_per_call
    }

    /// The clock leases are written and judged by.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Now, by [`RecordSpace::clock`], in milliseconds since the epoch.
    pub fn now_millis(&self) -> u64 {
        self.clock.now_millis()
    }

    /// The record named `name`, by one consistent read: for inspection
    /// (status pages, `coordctl`), never a basis for a decision. `None`: no record.
    pub async fn inspect<R: Record>(&self, name: &str) -> Result<Option<R>, Error> {
        let key = self.key(name);
        let entries = self.engine.snapshot(std::slice::from_ref(&key)).await?;
        R::from_value(&key, entries.first().and_then(|e| e.value.as_deref()))
    }

    /// A watch on the record named `name` (on every key under it, when the
    /// adapter keeps several records per name), or polling without change
    /// notifications.
    pub async fn watch(&self, name: &str) -> crate::wake::Wake {
        crate::wake::Wake::watch(self.backend().as_ref(), &self.key(name)).await
    }

    /// A lease of `ttl` offered now (see [`LeaseOffer`]).
    pub(crate) fn offer(&self, ttl: std::time::Duration) -> LeaseOffer {
        let sent = tokio::time::Instant::now();
        let now = self.now_millis();
        LeaseOffer {
            sent,
            now,
            expires_ms: now.saturating_add(super::whole_millis(ttl)),
            token: crate::mint_token(),
        }
    }

    /// Store calls made so far (for tests and benchmarks).
    pub fn stats(&self) -> CasStats {
        self.engine.stats()
    }
}

/// An adapter's options struct: `clock`, `key_prefix` (default `$prefix`)
/// and `cas`, then the adapter's own fields with their defaults and
/// setters; `Default` and the `with_clock`, `with_key_prefix` and
/// `with_cas` setters (all written by `coord_backend::setters!`).
macro_rules! record_options {
    (
        $(#[$meta:meta])*
        pub struct $name:ident, prefix $prefix:literal {
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty = $default:expr, set by $setter:ident,)*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug)]
        #[non_exhaustive]
        pub struct $name {
            /// Where expiry is read from (written into records and judged against).
            pub clock: std::sync::Arc<dyn coord_backend::Clock>,
            #[doc = concat!("Prefix of the records in the backend's namespace (default `", $prefix, "`): several can share one namespace under different prefixes.")]
            pub key_prefix: String,
            /// Tuning of the CAS loop.
            pub cas: $crate::cas::CasOptions,
            $($(#[$field_meta])* pub $field: $ty,)*
        }

        impl Default for $name {
            fn default() -> Self {
                $name {
                    clock: std::sync::Arc::new(coord_backend::SystemClock),
                    key_prefix: $prefix.to_owned(),
                    cas: $crate::cas::CasOptions::default(),
                    $($field: $default,)*
                }
            }
        }

        coord_backend::setters! {
            $name {
                /// Judge expiry with `clock` (tests inject a `ManualClock`).
                with_clock(clock: std::sync::Arc<dyn coord_backend::Clock>) => clock = clock;
                /// Keep the records under another prefix.
                with_key_prefix(prefix: impl Into<String>) => key_prefix = prefix.into();
                /// Tune the CAS loop.
                with_cas(cas: $crate::cas::CasOptions) => cas = cas;
                $(
                    #[doc = concat!("Set `", stringify!($field), "` (see the field).")]
                    $setter($field: $ty) => $field = $field;
                )*
            }
        }

        impl $name {
            /// The record space these options describe, over `backend`.
            #[allow(dead_code)]
            pub(crate) fn space(
                &self,
                backend: std::sync::Arc<dyn coord_backend::Backend>,
            ) -> $crate::cas::RecordSpace {
                $crate::cas::RecordSpace::new(
                    backend,
                    self.cas.clone(),
                    self.clock.clone(),
                    self.key_prefix.clone(),
                )
            }
        }
    };
}
pub(crate) use record_options;
