//! sideeffect adapter (not written yet).
