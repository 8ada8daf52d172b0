//! board adapter (not written yet).
