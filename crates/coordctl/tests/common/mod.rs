//! What coordctl's test binaries share: unique names and scratch directories.
// Each test binary compiles this module and uses part of it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

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

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
