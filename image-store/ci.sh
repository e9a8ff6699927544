#!/usr/bin/env bash
# What CI runs for image-store: install the fixture tools (Debian bookworm packages), then the
# crate's tests (unit, in-process registry faults, concurrency, real docker-registry).
# Optional: IMAGE_BENCH=1 also runs the benchmark (release build, prints a table).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/../tests/fixtures/install.sh"
cd "$here/.."
cargo test -p image-store
if [ "${IMAGE_BENCH:-0}" = 1 ]; then
  cargo run -q -p image-store --features cli --release --bin image-bench -- --runs 3
fi
