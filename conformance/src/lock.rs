//! The lock suite (not written yet).
