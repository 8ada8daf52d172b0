//! A `coordctl serve` process and a tiny HTTP/1.1 client (std::net only):
//! what the console's and the leaders page's tests share.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::COORDCTL;

/// One HTTP answer: its status, its head (status line and headers) and its body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: String,
    pub(crate) body: String,
}

impl Reply {
    /// The body as JSON (a panic when it is not).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The body as JSON of an answer that must be `200 OK`.
    pub(crate) fn json_ok(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.body);
        self.json()
    }
}

/// One request on a new connection (`Connection: close`), read to the end.
pub(crate) fn http(addr: &str, method: &str, path: &str, host: &str, form: Option<&str>) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("console reachable");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = form.unwrap_or("");
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    if form.is_some() {
        request.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "this client reads whole bodies only: {head}"
    );
    Reply {
        status,
        headers: head.to_owned(),
        body: body.to_owned(),
    }
}

/// `fields` as an `application/x-www-form-urlencoded` body.
pub(crate) fn form_encode(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{k}={}", url_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// `text` percent-encoded for a query value or form field.
pub(crate) fn url_encode(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A `coordctl serve` process on a free loopback port, killed when dropped.
pub(crate) struct Server {
    child: Child,
    pub(crate) addr: String,
    /// stdout lines after the first (the reconcile records).
    pub(crate) lines: mpsc::Receiver<String>,
}

impl Server {
    /// `coordctl serve --store url` with `extra` arguments, once it answers.
    pub(crate) fn start(url: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(COORDCTL)
            .args(["serve", "--store", url, "--addr", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("coordctl serve starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let first = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("coordctl serve prints its address");
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_owned();
        let server = Server {
            child,
            addr,
            lines: rx,
        };
        // Wait until it answers.
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&server.addr).is_err() {
            assert!(Instant::now() < deadline, "console never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// `GET path` with this server's own `Host`.
    pub(crate) fn get(&self, path: &str) -> Reply {
        http(&self.addr, "GET", path, &self.addr, None)
    }

    /// `POST path` of the form `fields`.
    pub(crate) fn post(&self, path: &str, fields: &[(&str, &str)]) -> Reply {
        http(
            &self.addr,
            "POST",
            path,
            &self.addr,
            Some(&form_encode(fields)),
        )
    }

    /// The full URL of `path` on this server.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The item of the JSON list `list` whose `field` is `value` (a panic when none is).
pub(crate) fn find<'v>(list: &'v Value, field: &str, value: &str) -> &'v Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .find(|item| item[field] == value)
        .unwrap_or_else(|| panic!("no {field}={value:?} in {list}"))
}
