//! iii-test-engine (placeholder; filled in by its owner).
