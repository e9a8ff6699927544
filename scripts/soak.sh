#!/usr/bin/env bash
# The bounded soak: mixed create / exec / fs::write / fs::read / stop at the caps
# on the bwrap plugin for SECONDS (default 600), with a guest flooding its agent with signals
# and a worker VM flooding its output all along (their host logs held to the README's "Logs"
# ceiling each round), then the adapter's fds, threads and RSS, the
# sandboxes' cgroups, the host's mounts and the state directories must be back where they
# started (the start, peak and end are printed). CI runs the same test for 60 s.
# Needs what the e2e suite needs: `source /tmp/env/vars`-style SANDBOX_TEST_REGISTRY and
# SANDBOX_AGENT_PATH (see README "Tests").
# Usage: scripts/soak.sh [SECONDS]
set -euo pipefail
secs="${1:-600}"
case "$secs" in
  ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
SANDBOX_SOAK_SECS="$secs" exec cargo test -p e2e-tests --test soak -- --nocapture
