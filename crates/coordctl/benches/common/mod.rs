//! What the coordctl benches share: the list of stores to measure.

use std::path::Path;

use coord_backend::StoreUrl;

/// A name unique to this bench run (process id + clock).
pub(crate) fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("{}-{:x}", std::process::id(), nanos % (1 << 40))
}

/// A store to measure: its name, its URL (`None` = its variable is unset:
/// print SKIPPED) and the variable that names it (empty for local stores).
pub(crate) type BenchStore = (&'static str, Option<String>, &'static str);

/// memory, SQLite (a file `sqlite_file` under `temp`), Redis, PostgreSQL and
/// etcd, all in `namespace`; servers come from the `COORD_TEST_*` variables.
pub(crate) fn stores(temp: &Path, sqlite_file: &str, namespace: &str) -> Vec<BenchStore> {
    let mut stores: Vec<BenchStore> = vec![
        (
            "memory",
            Some(format!("memory://?namespace={namespace}")),
            "",
        ),
        (
            "sqlite",
            Some(format!(
                "sqlite://{}?namespace={namespace}",
                temp.join(sqlite_file).display()
            )),
            "",
        ),
    ];
    for (name, var) in [
        ("redis", "COORD_TEST_REDIS_URL"),
        ("postgres", "COORD_TEST_POSTGRES_URL"),
    ] {
        let url = server(var).map(|u| {
            StoreUrl::parse(&u)
                .unwrap_or_else(|e| panic!("{var}: {e}"))
                .with_namespace(namespace)
        });
        stores.push((name, url, var));
    }
    stores.push((
        "etcd",
        server("COORD_TEST_ETCD_ENDPOINTS")
            .map(|e| format!("etcd://{}?namespace={namespace}", e.trim())),
        "COORD_TEST_ETCD_ENDPOINTS",
    ));
    stores
}

fn server(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.trim().is_empty())
}
