//! What the layer stores as a key's result: the response the handler gave
//! (status, end-to-end headers, body) and the fingerprint of the request
//! that produced it.
//!
//! Layout: one JSON line (`{"v":1,"fingerprint":..,"status":..,"headers":[[name,value],..]}`),
//! a newline, then the body's bytes as they are (no base64: a stored body
//! costs its own size plus the line).

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The version of the stored response layout.
const LAYOUT: u32 = 1;

/// Headers that describe one connection or one transfer, not the response:
/// never stored (the server computes its own on replay).
const NOT_STORED: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "content-length",
    "date",
    crate::REPLAYED_HEADER,
];

/// The default request fingerprint: SHA-256 over the method, the path with
/// its query, and the body, hex-encoded. Two requests with one key and
/// different fingerprints are different requests (`422`).
pub fn request_fingerprint(parts: &http::request::Parts, body: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(parts.method.as_str().as_bytes());
    hash.update(b"\n");
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |pq| pq.as_str());
    hash.update(target.as_bytes());
    hash.update(b"\n");
    hash.update(body);
    hex::encode(hash.finalize())
}

#[derive(Serialize, Deserialize)]
struct Head {
    v: u32,
    fingerprint: String,
    status: u16,
    headers: Vec<(String, String)>,
}

/// One stored response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    /// The fingerprint of the request that produced it.
    pub(crate) fingerprint: String,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl StoredResponse {
    /// The response of a handler, with the end-to-end headers only.
    pub(crate) fn new(
        fingerprint: String,
        status: StatusCode,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Self {
        let mut kept = HeaderMap::new();
        for (name, value) in headers {
            if !NOT_STORED.contains(&name.as_str()) {
                kept.append(name.clone(), value.clone());
            }
        }
        StoredResponse {
            fingerprint,
            status,
            headers: kept,
            body,
        }
    }

    /// The bytes stored as the key's result. Header values that are not
    /// visible ASCII are left out (logged).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let headers = self
            .headers
            .iter()
            .filter_map(|(name, value)| match value.to_str() {
                Ok(text) => Some((name.as_str().to_owned(), text.to_owned())),
                Err(_) => {
                    tracing::warn!(header = %name, "a response header value that is not visible ASCII is not stored");
                    None
                }
            })
            .collect();
        let head = Head {
            v: LAYOUT,
            fingerprint: self.fingerprint.clone(),
            status: self.status.as_u16(),
            headers,
        };
        let mut bytes = serde_json::to_vec(&head).unwrap_or_default();
        bytes.push(b'\n');
        bytes.extend_from_slice(&self.body);
        bytes
    }

    /// The stored response in `bytes`; `None` when they are not one (a
    /// result an operator stored with `coordctl reconcile --applied
    /// --result ...`, say).
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let newline = bytes.iter().position(|&b| b == b'\n')?;
        let head: Head = serde_json::from_slice(&bytes[..newline]).ok()?;
        if head.v != LAYOUT {
            return None;
        }
        let mut headers = HeaderMap::new();
        for (name, value) in head.headers {
            headers.append(
                HeaderName::try_from(name).ok()?,
                HeaderValue::try_from(value).ok()?,
            );
        }
        Some(StoredResponse {
            fingerprint: head.fingerprint,
            status: StatusCode::from_u16(head.status).ok()?,
            headers,
            body: Bytes::copy_from_slice(&bytes[newline + 1..]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_response_reads_back_without_its_transfer_headers() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        headers.insert("content-length", HeaderValue::from_static("7"));
        headers.insert(
            "date",
            HeaderValue::from_static("Sat, 05 Dec 2026 15:00:00 GMT"),
        );
        let body = Bytes::from_static(b"{\"a\":\n1}");
        let stored = StoredResponse::new("fp".into(), StatusCode::CREATED, &headers, body.clone());
        let read = StoredResponse::decode(&stored.encode()).expect("a stored response");
        assert_eq!(read, stored);
        assert_eq!(read.body, body);
        assert_eq!(read.headers.get_all("set-cookie").iter().count(), 2);
        assert!(read.headers.get("content-length").is_none());
        assert!(read.headers.get("date").is_none());
        assert_eq!(
            StoredResponse::decode(b"plain text an operator stored"),
            None
        );
    }

    #[test]
    fn the_fingerprint_covers_method_target_and_body() {
        let parts = |method: &str, uri: &str| {
            http::Request::builder()
                .method(method)
                .uri(uri)
                .body(())
                .unwrap()
                .into_parts()
                .0
        };
        let base = request_fingerprint(&parts("POST", "/a?x=1"), b"body");
        assert_eq!(base, request_fingerprint(&parts("POST", "/a?x=1"), b"body"));
        for other in [
            request_fingerprint(&parts("PATCH", "/a?x=1"), b"body"),
            request_fingerprint(&parts("POST", "/a?x=2"), b"body"),
            request_fingerprint(&parts("POST", "/b?x=1"), b"body"),
            request_fingerprint(&parts("POST", "/a?x=1"), b"bodY"),
        ] {
            assert_ne!(base, other);
        }
    }
}
