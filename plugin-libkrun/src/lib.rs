//! plugin-libkrun (placeholder; filled in by its owner).
