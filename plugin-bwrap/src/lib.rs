//! plugin-bwrap (placeholder; filled in by its owner).
