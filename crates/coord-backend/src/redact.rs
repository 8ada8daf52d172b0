//! Keeping secrets and stored values out of `Debug` output, logs and spans.
//!
//! Tokens are credentials (whoever holds a lease's token can complete or
//! release it), URLs carry passwords, and record values are application data
//! that has no place in a log line. Types holding them implement `Debug` by
//! hand with these helpers instead of deriving it.

use std::fmt;

/// What a hidden secret prints as.
pub const HIDDEN: &str = "<redacted>";

/// Prints `<redacted>` whatever it wraps: use as a `Debug` field for a token or password.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Hidden;

impl fmt::Debug for Hidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(HIDDEN)
    }
}

/// Prints only the length of some bytes (`<12 bytes>`): use as a `Debug`
/// field for a stored value, a payload or a result.
#[derive(Clone, Copy)]
pub struct Bytes<'a>(pub &'a [u8]);

impl fmt::Debug for Bytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// Query parameters whose value is a credential (compared case-insensitively).
const SECRET_PARAMS: [&str; 6] = [
    "password",
    "passwd",
    "pass",
    "sslpassword",
    "token",
    "secret",
];

/// A URL with its password (in `user:password@`) and credential query
/// parameters (`password=`, `token=`, ...) replaced by `***`. Anything that
/// has no `scheme://` loses everything before its last `@` (it may be a
/// mistyped URL with a password).
///
/// ```
/// use coord_backend::redact::url;
///
/// assert_eq!(url("postgres://app:s3cret@db:5432/x?sslmode=require"),
///            "postgres://app:***@db:5432/x?sslmode=require");
/// assert_eq!(url("etcd://h:2379?user=u&password=p"), "etcd://h:2379?user=u&password=***");
/// ```
pub fn url(raw: &str) -> String {
    let Some((scheme, rest)) = raw.split_once("://") else {
        // Not a URL, but `user:password@host` may still be in it.
        return match raw.rfind('@') {
            Some(at) => format!("***{}", &raw[at..]),
            None => raw.to_owned(),
        };
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rfind('@') {
        Some(at) => {
            let (userinfo, hosts) = authority.split_at(at);
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***{hosts}"),
                // A lone userinfo (`redis://TOKEN@host`) may itself be the secret.
                None => format!("***{hosts}"),
            }
        }
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _))
                        if SECRET_PARAMS
                            .iter()
                            .any(|secret| name.eq_ignore_ascii_case(secret)) =>
                    {
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hides_passwords_and_credential_parameters_only() {
        assert_eq!(
            url("redis://:pw@h:6379/0?x=1&Token=abc"),
            "redis://:***@h:6379/0?x=1&Token=***"
        );
        assert_eq!(url("redis://pw@h:6379"), "redis://***@h:6379");
        assert_eq!(url("sqlite://data/a@b.db"), "sqlite://data/a@b.db");
        assert_eq!(url("etcd://a:1,b:2"), "etcd://a:1,b:2");
        assert_eq!(url("not a url"), "not a url");
        assert_eq!(url("postgres//u:pw@h/db"), "***@h/db");
        assert_eq!(format!("{:?}", Hidden), "<redacted>");
        assert_eq!(format!("{:?}", Bytes(b"secret")), "<6 bytes>");
    }
}
