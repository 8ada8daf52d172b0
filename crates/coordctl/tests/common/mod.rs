//! What coordctl's test binaries share: unique names, scratch directories,
//! store URLs, and (in `serve`) a console process with an HTTP client.
// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

pub(crate) mod serve;

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

/// The coordctl binary under test.
pub(crate) const COORDCTL: &str = env!("CARGO_BIN_EXE_coordctl");

/// `coordctl` run with `args`, to the end.
pub(crate) fn coordctl(args: &[&str]) -> Output {
    Command::new(COORDCTL)
        .args(args)
        .output()
        .expect("run coordctl")
}

/// The text report of `coordctl inspect --store url` (which must succeed).
pub(crate) fn inspect_text(url: &str) -> String {
    let inspect = coordctl(&["inspect", "--store", url]);
    let text = String::from_utf8_lossy(&inspect.stdout).into_owned();
    assert!(inspect.status.success(), "inspect failed: {text}");
    text
}

/// `label` made unique to this process and moment: a namespace or a file
/// name no other test run sees.
pub(crate) fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("{label}-{}-{nanos:x}", std::process::id())
}

/// A per-test scratch directory under the system's temp dir, removed at the end.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(label: &str) -> Self {
        let dir = std::env::temp_dir().join(unique(&format!("coordctl-{label}")));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(dir)
    }
}

impl Scratch {
    /// The URL of a SQLite store in `file` of this directory, in
    /// `namespace` when one is given.
    pub(crate) fn sqlite_url(&self, file: &str, namespace: Option<&str>) -> String {
        let path = self.0.join(file);
        match namespace {
            Some(ns) => format!("sqlite://{}?namespace={ns}", path.display()),
            None => format!("sqlite://{}", path.display()),
        }
    }
}

/// The store the environment variable `var` names (`None`, SKIPPED, when it
/// is not set: see `coord_conformance::server_env`), in a namespace made
/// unique from `label`.
pub(crate) fn server_url(var: &str, label: &str) -> Option<String> {
    let base = coord_conformance::server_env(var)?;
    let url = coord_backend::StoreUrl::parse(&base)
        .unwrap_or_else(|e| panic!("{var} does not parse: {e}"));
    Some(url.with_namespace(&unique(label)))
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
