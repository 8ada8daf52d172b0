//! What every lease-backed grant carries beside what it grants: the secret
//! token, the TTL, the lease end and when the granting request was sent.
//! [`LockHandle`](crate::lock::LockHandle) (so also semaphore permits and
//! read-write lock handles) and [`Leadership`](crate::election::Leadership)
//! each hold one [`Grant`] and get their public accessors of it from
//! [`grant_accessors!`], so the lease rules are written once.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// The lease part of a grant (see the [module docs](self)). No `Debug`: the
/// token is a credential; each holder's `Debug` shows what it may.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    pub(crate) expires_at: SystemTime,
    pub(crate) requested_at: Instant,
}

impl Grant {
    /// A grant to `token` for `ttl`, ending at `expires_at`, requested now
    /// (until the holder's `requested_at` says when).
    pub(crate) fn new(token: String, ttl: Duration, expires_at: SystemTime) -> Self {
        Grant {
            token,
            ttl,
            expires_at,
            requested_at: Instant::now(),
        }
    }
}

/// The public accessors of a type with a `grant: Grant` field:
/// `requested_at`, `requested_instant`, `ttl`, `expires_at` and `token`,
/// their docs naming the grant as `$grant` (e.g. "this handle").
macro_rules! grant_accessors {
    ($grant:literal) => {
        #[doc = concat!("Say when the request that granted ", $grant, " was sent (local monotonic time). ")]
        #[doc = "The lease counts from then, not from the answer, so a slow answer cannot make the"]
        #[doc = "holder believe in a longer lease than the store granted. Implementations should"]
        #[doc = "always call this; without it the lease counts from the moment `new` was called."]
        pub fn requested_at(mut self, sent: tokio::time::Instant) -> Self {
            self.grant.requested_at = sent;
            self
        }

        /// When the granting request was sent, in local monotonic time (see
        /// [`Self::requested_at`]): the lease is surely over at this instant
        /// plus the TTL, whatever any clock says.
        pub fn requested_instant(&self) -> tokio::time::Instant {
            self.grant.requested_at
        }

        #[doc = concat!("The TTL ", $grant, " was granted with (renewals extend the lease by this much).")]
        pub fn ttl(&self) -> std::time::Duration {
            self.grant.ttl
        }

        #[doc = concat!("When the lease granted with ", $grant, " expires, by the implementation's clock. ")]
        #[doc = "Renewals extend the stored lease, not this copy."]
        pub fn expires_at(&self) -> std::time::SystemTime {
            self.grant.expires_at
        }

        #[doc = concat!("The random token of ", $grant, ", for implementations only. ")]
        #[doc = "It is a credential: do not log it."]
        pub fn token(&self) -> &str {
            &self.grant.token
        }
    };
}
pub(crate) use grant_accessors;
