#!/bin/sh
# CI for agent-proto and sandbox-agent: lint, unit + integration tests against both the
# debug build and the static release build, and the static-link check.
# Host needs: the Rust toolchain, coreutils, util-linux (`unshare`, for the PID-1 test;
# skipped with a notice without it), `file` (optional, for the static check).
set -eu
cd "$(dirname "$0")/.."
cargo fmt -p agent-proto -p sandbox-agent --check
cargo clippy -p agent-proto --all-targets -- -D warnings
cargo clippy -p agent-proto -p sandbox-agent --features agent-proto/client --all-targets -- -D warnings
cargo test -p agent-proto -p sandbox-agent --features agent-proto/client
bin=$(agent/build-static.sh)
SANDBOX_AGENT_BIN="$bin" cargo test -p sandbox-agent
echo "static agent: $bin"
