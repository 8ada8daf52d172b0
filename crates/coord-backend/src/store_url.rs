//! Store URLs: `memory://`, `sqlite://PATH`, `redis://`, `rediss://`,
//! `postgres://`, `etcd://host:port[,host:port]`, each with an optional
//! `?namespace=NAME` (default [`DEFAULT_NAMESPACE`]).
//!
//! This module only splits a URL into scheme, namespace and the rest; each
//! store crate interprets the rest, and the `coord` facade crate maps schemes
//! to stores.

use std::fmt;

use crate::{validate_namespace, Error, Result};

/// The namespace used when a URL names none.
pub const DEFAULT_NAMESPACE: &str = "coord";

/// A parsed store URL.
///
/// ```
/// use coord_backend::StoreUrl;
///
/// let url = StoreUrl::parse("sqlite://data/coord.db?namespace=billing").unwrap();
/// assert_eq!(url.scheme(), "sqlite");
/// assert_eq!(url.namespace(), "billing");
/// assert_eq!(url.without_namespace(), "sqlite://data/coord.db");
/// ```
///
/// `Debug` and `Display` hide the password (`postgres://app:***@db/x`, see
/// [`crate::redact::url`]); [`StoreUrl::without_namespace`] and
/// [`StoreUrl::with_namespace`] give the full URL for connecting.
///
/// ```
/// use coord_backend::StoreUrl;
///
/// let url = StoreUrl::parse("postgres://app:s3cret@db/x?namespace=n").unwrap();
/// assert_eq!(url.to_string(), "postgres://app:***@db/x?namespace=n");
/// assert!(!format!("{url:?}").contains("s3cret"));
/// assert!(url.without_namespace().contains("s3cret"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    scheme: String,
    namespace: String,
    without_namespace: String,
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreUrl")
            .field("scheme", &self.scheme)
            .field("namespace", &self.namespace)
            .field("url", &crate::redact::url(&self.without_namespace))
            .finish()
    }
}

impl fmt::Display for StoreUrl {
    /// The URL with its namespace and without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::redact::url(&self.with_namespace(&self.namespace)))
    }
}

impl StoreUrl {
    /// Parse a store URL; the scheme must be followed by `://`.
    pub fn parse(raw: &str) -> Result<Self> {
        let (scheme, rest) = raw.split_once("://").ok_or_else(|| {
            Error::Config(format!(
                "store URL {:?} has no scheme (expected e.g. sqlite://coord.db)",
                crate::redact::url(raw)
            ))
        })?;
        if scheme.is_empty()
            || !scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
        {
            return Err(Error::Config(format!(
                "store URL {:?} has an invalid scheme",
                crate::redact::url(raw)
            )));
        }
        let (body, query) = match rest.split_once('?') {
            Some((body, query)) => (body, Some(query)),
            None => (rest, None),
        };
        let mut namespace = None;
        let mut kept = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("namespace", value)) => {
                    let decoded = url::form_urlencoded::parse(format!("n={value}").as_bytes())
                        .next()
                        .map(|(_, v)| v.into_owned())
                        .unwrap_or_default();
                    namespace = Some(decoded);
                }
                _ => kept.push(pair),
            }
        }
        let namespace = namespace.unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        validate_namespace(&namespace)?;
        let mut without_namespace = format!("{scheme}://{body}");
        if !kept.is_empty() {
            without_namespace.push('?');
            without_namespace.push_str(&kept.join("&"));
        }
        Ok(StoreUrl {
            scheme: scheme.to_ascii_lowercase(),
            namespace,
            without_namespace,
        })
    }

    /// The scheme, lower-cased (`sqlite`, `redis`, ...).
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The namespace (from `?namespace=`, or [`DEFAULT_NAMESPACE`]).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The URL without the `namespace` query parameter, as the store's client expects it.
    pub fn without_namespace(&self) -> &str {
        &self.without_namespace
    }

    /// The same store under another namespace, as a URL string.
    pub fn with_namespace(&self, namespace: &str) -> String {
        let encoded: String = url::form_urlencoded::byte_serialize(namespace.as_bytes()).collect();
        let sep = if self.without_namespace.contains('?') {
            '&'
        } else {
            '?'
        };
        format!("{}{sep}namespace={encoded}", self.without_namespace)
    }

    /// Everything after `scheme://` and before `?` (a path for SQLite, hosts for etcd).
    pub fn body(&self) -> &str {
        let rest = &self.without_namespace[self.scheme.len() + 3..];
        rest.split_once('?').map(|(b, _)| b).unwrap_or(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let u =
            StoreUrl::parse("postgres://u:p@h:5432/db?sslmode=require&namespace=a%3Ab").unwrap();
        assert_eq!(u.namespace(), "a:b");
        assert_eq!(
            u.without_namespace(),
            "postgres://u:p@h:5432/db?sslmode=require"
        );
        assert_eq!(u.body(), "u:p@h:5432/db");
        assert_eq!(
            StoreUrl::parse("memory://").unwrap().namespace(),
            DEFAULT_NAMESPACE
        );
        assert!(StoreUrl::parse("nope").is_err());
        let again = StoreUrl::parse(&u.with_namespace("x y")).unwrap();
        assert_eq!(again.namespace(), "x y");
        assert_eq!(again.without_namespace(), u.without_namespace());
        assert!(StoreUrl::parse("memory://?namespace={x}").is_err());
    }

    #[test]
    fn debug_and_display_hide_the_password() {
        let u = StoreUrl::parse("redis://user:hunter2@h:6379/0?password=alsosecret&namespace=ns")
            .unwrap();
        for shown in [format!("{u:?}"), format!("{u}"), format!("{u:#?}")] {
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(!shown.contains("alsosecret"), "{shown}");
            assert!(shown.contains("h:6379"), "{shown}");
        }
        assert_eq!(
            u.to_string(),
            "redis://user:***@h:6379/0?password=***&namespace=ns"
        );
        assert!(u.without_namespace().contains("hunter2"));
        for bad in ["postgres//u:hunter2@h/db", "p g://u:hunter2@h/db"] {
            let error = StoreUrl::parse(bad).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
    }
}
