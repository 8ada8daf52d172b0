//! Golden namespaces: what a release of a storage format leaves in a store,
//! kept by each store crate as a file in that store's own layout (a SQLite
//! database, a dump of Redis keys, ...) and read back by every later
//! release. [`write_namespace`] fills a namespace the way applications do
//! (puts, an update, deletes, a reclaim that raises the floor, a create
//! above it); [`read_back`] checks that a store opened on the restored
//! namespace reads the same keys, versions and values, and that versions
//! continue above them and above the floor.

use coord_backend::{Backend, BackendExt, Mutation, ReclaimOptions, Version};

use crate::support::applied;
use crate::{ensure, CheckResult};

/// The live keys of a golden namespace: key, version, value.
pub const ENTRIES: [(&str, u64, &str); 4] = [
    ("a/kept", 1, "first"),
    ("a/updated", 2, "second"),
    ("b/recreated", 4, "after the reclaim"),
    ("c/\u{e9}t\u{e9}", 1, "non-ASCII key"),
];

fn put(key: &str, value: &str) -> Mutation {
    Mutation::put(key, value.as_bytes().to_vec())
}

/// Fill `store`'s (empty) namespace with the golden history.
pub async fn write_namespace(store: &dyn Backend) -> CheckResult {
    let out = store
        .txn(
            &[],
            &[
                put("a/kept", "first"),
                put("a/updated", "first"),
                put("a/deleted", "x"),
                put("c/\u{e9}t\u{e9}", "non-ASCII key"),
            ],
        )
        .await?;
    ensure!(out.applied, "the first txn was refused");
    let steps = [
        applied(store.put_if("a/updated", Version(1), b"second".to_vec())).await,
        applied(store.put_if("b/recreated", Version::MISSING, b"x".to_vec())).await,
        applied(store.put_if("b/recreated", Version(1), b"y".to_vec())).await,
        applied(store.delete_if("b/recreated", Version(2))).await,
        applied(store.delete_if("a/deleted", Version(1))).await,
    ];
    ensure!(steps.iter().all(|s| *s), "a write was refused: {steps:?}");
    let reclaimed = store.reclaim(&ReclaimOptions::DEFAULT).await?;
    ensure!(
        reclaimed.removed == 2,
        "the reclaim removed {} tombstones, not 2",
        reclaimed.removed
    );
    ensure!(
        applied(store.put_if(
            "b/recreated",
            Version::MISSING,
            b"after the reclaim".to_vec()
        ))
        .await,
        "the create after the reclaim was refused"
    );
    Ok(())
}

/// Check a store opened on a restored golden namespace (this writes to it).
pub async fn read_back(store: &dyn Backend) -> CheckResult {
    let keys = store.keys("").await?;
    let entries = store.snapshot(&keys).await?;
    let read: Vec<(String, u64, String)> = entries
        .iter()
        .map(|e| {
            let value = String::from_utf8_lossy(e.value.as_deref().unwrap_or_default());
            (e.key.clone(), e.version.0, value.into_owned())
        })
        .collect();
    let expected: Vec<(String, u64, String)> = ENTRIES
        .iter()
        .map(|(k, v, value)| ((*k).to_owned(), *v, (*value).to_owned()))
        .collect();
    ensure!(
        read == expected,
        "read {read:?}, the golden namespace holds {expected:?}"
    );
    // Writes continue from the stored versions; a key deleted before the
    // reclaim starts above its floor, never at a version it had before.
    ensure!(
        applied(store.put_if("a/updated", Version(2), b"third".to_vec())).await,
        "a write at the stored version was refused"
    );
    ensure!(
        store.get("a/updated").await?.version == Version(3),
        "the version after 2 is not 3"
    );
    ensure!(
        applied(store.put_if("a/deleted", Version::MISSING, b"again".to_vec())).await,
        "re-creating a reclaimed key was refused"
    );
    let version = store.get("a/deleted").await?.version;
    ensure!(
        version > Version(2),
        "a reclaimed key came back at {version:?}, a version it had before the floor"
    );
    Ok(())
}

/// The golden dump of storage format `format` of the store crate at
/// `manifest_dir` (its `CARGO_MANIFEST_DIR`): `tests/golden/format-<format>.json`.
pub fn dump_path(manifest_dir: &str, format: u32) -> std::path::PathBuf {
    std::path::Path::new(manifest_dir)
        .join("tests/golden")
        .join(format!("format-{format}.json"))
}

/// Write `dump` (a store's own picture of a golden namespace) as the golden
/// dump of the current storage format. For a NEW format only: the dumps of
/// earlier formats stay as they are.
pub fn save_dump(manifest_dir: &str, dump: serde_json::Value) {
    let format = coord_backend::reclaim::STORAGE_FORMAT;
    let doc = serde_json::json!({ "storage_format": format, "dump": dump });
    let text = serde_json::to_string_pretty(&doc).expect("JSON") + "\n";
    std::fs::write(dump_path(manifest_dir, format), text).expect("the golden dump is written");
}

/// The golden dump of storage format `format`, as [`save_dump`] wrote it.
pub fn load_dump(manifest_dir: &str, format: u32) -> serde_json::Value {
    let path = dump_path(manifest_dir, format);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("a JSON dump");
    assert_eq!(doc["storage_format"], format, "{}", path.display());
    doc["dump"].take()
}
