//! agent-proto (placeholder; filled in by its owner).
