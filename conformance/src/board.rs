//! The board suite (not written yet).
