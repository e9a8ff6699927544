//! plugin-api (placeholder; filled in by its owner).
