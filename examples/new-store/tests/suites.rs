//! Every conformance suite against the example store, as docs/new-store.md
//! tells a new store to do; and the walkthrough quotes this crate's code
//! exactly (so the two cannot drift apart).

use std::sync::Arc;

use coord_backend::Backend;
use coord_conformance::{factory, BackendFactory};
use coord_example_store::BTreeServer;

/// One server for the whole test binary: clients in the same namespace see
/// each other's writes, as they would on a real server.
fn server() -> BTreeServer {
    static SERVER: std::sync::OnceLock<BTreeServer> = std::sync::OnceLock::new();
    SERVER.get_or_init(BTreeServer::new).clone()
}

fn store_factory() -> BackendFactory {
    factory(
        |namespace| async move { Ok(Arc::new(server().client(&namespace)?) as Arc<dyn Backend>) },
    )
}

coord_conformance::all_suites_tests!(store_factory());

#[test]
fn the_walkthrough_quotes_this_crate() {
    let doc = include_str!("../../../docs/new-store.md");
    for (name, source) in [
        ("src/lib.rs", include_str!("../src/lib.rs")),
        ("tests/suites.rs", include_str!("suites.rs")),
    ] {
        let fenced = format!("```rust\n{source}```");
        assert!(
            doc.contains(&fenced),
            "docs/new-store.md must quote examples/new-store/{name} verbatim in a rust block"
        );
    }
}
