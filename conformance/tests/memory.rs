//! The suites against the in-process reference store.
use std::sync::Arc;

use coord_backend::Backend;
use coord_memory::SingleProcessMemoryBackend;

coord_conformance::backend_tests!(coord_conformance::factory(|namespace| async move {
    Ok(Arc::new(SingleProcessMemoryBackend::shared(&namespace)?) as Arc<dyn Backend>)
}));
