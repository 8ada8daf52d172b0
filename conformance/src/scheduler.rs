//! The scheduler suite (not written yet).
