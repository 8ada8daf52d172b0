//! lock adapter (not written yet).
