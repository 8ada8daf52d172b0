//! The sideeffect suite (not written yet).
