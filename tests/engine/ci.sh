#!/usr/bin/env bash
# CI steps for the test engine and the trigger example. No system packages needed.
# Usage: tests/engine/ci.sh   (from anywhere; honours CARGO_TARGET_DIR)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo fmt -p iii-test-engine -p sandbox-examples -- --check
cargo clippy -p iii-test-engine -p sandbox-examples --all-targets -- -D warnings
cargo test -p iii-test-engine -p sandbox-examples
# Round-trip table (informational; asserts nothing). ROUNDTRIP_N=200 keeps it short.
ROUNDTRIP_N="${ROUNDTRIP_N:-200}" cargo bench -p iii-test-engine --bench roundtrip
