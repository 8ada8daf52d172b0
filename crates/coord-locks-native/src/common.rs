//! What the two native locks share: the URL check, the default key prefix
//! and the spans and metrics around every [`Lock`](coord_adapters::lock::Lock) call.

use coord_backend::{Error, StoreUrl};

/// `Ok` when the scheme of `url` is one of `schemes`; otherwise a
/// [`Error::Config`] saying `needs` (what the lock needs) and what it got.
pub(crate) fn require_scheme(url: &StoreUrl, schemes: &[&str], needs: &str) -> Result<(), Error> {
    if schemes.contains(&url.scheme()) {
        Ok(())
    } else {
        Err(Error::Config(format!("{needs}, got {}://", url.scheme())))
    }
}

/// The default key prefix of `namespace`: `<namespace>:lock:` with each `:`
/// of the namespace written `{}` (namespaces never contain braces), so that
/// namespace `a` + key `b:lock:c` and namespace `a:lock:b` + key `c` never
/// share a lock.
pub(crate) fn default_prefix(namespace: &str) -> String {
    format!("{}:lock:", namespace.replace(':', "{}"))
}

/// `impl Lock for $lock`, labelled `$store` in spans and metrics: each call
/// checks its input with `validate_lock_input`, then runs the type's own
/// `try_lock_inner` / `renew_inner` / `release_inner` (which take the input
/// as valid), inside the `coord_adapters::lock` observer every lock
/// reports through. Names resolve where it is called, which imports
/// `async_trait`, `validate_lock_input`, `Lock`, `LockError`, `LockHandle`,
/// `Duration` and `observe_try_lock` / `observe_renew` / `observe_release`.
macro_rules! observed_lock {
    ($lock:ty, $store:literal) => {
        #[async_trait]
        impl Lock for $lock {
            async fn try_lock(
                &self,
                key: &str,
                ttl: Duration,
            ) -> Result<Option<LockHandle>, LockError> {
                let attempt = async {
                    validate_lock_input(key, ttl)?;
                    self.try_lock_inner(key, ttl).await
                };
                observe_try_lock($store, key, attempt).await
            }

            async fn renew(&self, handle: &LockHandle) -> Result<(), LockError> {
                let attempt = async {
                    validate_lock_input(handle.key(), handle.ttl())?;
                    self.renew_inner(handle).await
                };
                observe_renew($store, handle, attempt).await
            }

            async fn release(&self, handle: LockHandle) -> Result<(), LockError> {
                let (key, fence) = (handle.key().to_owned(), handle.fence());
                let attempt = async move {
                    validate_lock_input(handle.key(), handle.ttl())?;
                    self.release_inner(handle).await
                };
                observe_release($store, &key, fence, attempt).await
            }
        }
    };
}
pub(crate) use observed_lock;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_prefixes_keep_namespaces_apart() {
        let name = |ns: &str, key: &str| format!("{}{key}", default_prefix(ns));
        assert_eq!(name("coord", "job:1"), "coord:lock:job:1");
        assert_ne!(name("a", "b:lock:c"), name("a:lock:b", "c"));
        assert_ne!(name("a:", "lock:x"), name("a", ":lock:x"));
        // Decoding: the namespace ends at the first ':', `{}` is a ':' of it.
        for (ns, key) in [("a:lock:b", "c"), ("a", "b:lock:c"), (":", ":"), ("x", "")] {
            let full = name(ns, key);
            let (escaped, rest) = full.split_once(':').unwrap();
            assert_eq!(escaped.replace("{}", ":"), ns);
            assert_eq!(rest.strip_prefix("lock:"), Some(key));
        }
    }
}
