//! sandbox-core (placeholder; filled in by its owner).
