#!/bin/sh
# Every benchmark of the project, one table: scripts/bench.sh [--quick] [--compare REF]
#
# Builds in release mode (the adapter, plugin-bwrap, the static agent, sandbox-bench,
# image-bench), runs image-bench (pull + unpack against skopeo copy + umoci unpack) and then
# sandbox-bench, which measures everything through the engine against its baselines in the
# same run and merges image-bench's rows into one table: median and p95 of each figure and of
# its baseline, and their ratio. Written to $BENCH_OUT (default target/bench): bench.md (the
# table), bench.json (every sample), bench.png (the latency distributions).
# Then, unless --quick, the component benches print their own tables below it (agent exec
# overhead and fs grep/sed against direct tools, engine round trips).
# The microVM figures come from the VM lab only (tests/vm-lab/measure.sh); not run here.
#
# Needs root, bubblewrap, python3, grep; skopeo and umoci for the pull baseline (its row says
# when they are missing); `ip netns` for the download row. The fixture registry:
# $SANDBOX_TEST_REGISTRY (host:port) when set, else image-bench starts one from
# tests/fixtures/ (tests/fixtures/install.sh) and sandbox-bench uses the e2e harness's.
# --quick: 5 iterations and no component benches (about 40 s after the build, on a shared
# 2-core machine); default: 20 iterations (about 1 minute) and the component benches (the
# agent's sed row alone takes about a minute more). The first release build takes 10-20 min.
# --compare REF: first the same bench of the tree at git ref REF (exported with `git archive`
# into $BENCH_OUT/compare/, built there with a target directory of its own, its own
# scripts/bench.sh run), then this tree's, then one table of both: each row's median now and
# before and their ratio, with each run's own ratio to its baseline (the rows' baselines are
# measured in each run, so a loaded machine moves both alike). Written to compare.md.
set -eu
cd "$(dirname "$0")/.."

usage() {
    echo "usage: scripts/bench.sh [--quick] [--compare REF]" >&2
    exit 2
}
quick=
compare=
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) quick=1 ;;
    --compare)
        [ $# -ge 2 ] || usage
        compare=$2
        shift
        ;;
    *) usage ;;
    esac
    shift
done
out=${BENCH_OUT:-target/bench}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if [ -n "$compare" ]; then
    sha=$(git rev-parse --verify "$compare^{commit}") || {
        echo "scripts/bench.sh: $compare names no commit" >&2
        exit 2
    }
    short=$(git rev-parse --short "$sha")
    base=$out/compare/$short
    if [ ! -f "$base/src/scripts/bench.sh" ]; then
        rm -rf "$base/src"
        mkdir -p "$base/src"
        git archive "$sha" | tar -x -C "$base/src"
    fi
    echo "=== the bench of $compare ($short), in $base" >&2
    (
        cd "$base/src"
        CARGO_TARGET_DIR=$base/target BENCH_OUT=$base/out sh scripts/bench.sh ${quick:+--quick}
    ) >"$base/bench.txt"
    echo "=== the bench of this tree" >&2
fi

# One package set per command: a --bin would narrow all of them to that binary.
cargo build --release -p sandbox-libkrun -p plugin-bwrap >&2
cargo build --release -p image-store --features cli --bin image-bench >&2
cargo build --release -p e2e-tests --bin sandbox-bench >&2
SANDBOX_AGENT_PATH=$(sh agent/build-static.sh)
export SANDBOX_AGENT_PATH

runs=5
iterations=
if [ -n "$quick" ]; then
    runs=3
    iterations=--quick
fi
set -- --runs "$runs" --json "$out/image.json"
if [ -n "${SANDBOX_TEST_REGISTRY:-}" ]; then
    set -- "$@" --registry "$SANDBOX_TEST_REGISTRY"
fi
target/release/image-bench "$@" >"$out/image.txt"

target/release/sandbox-bench $iterations --out "$out" --merge "$out/image.json"

if [ -n "$compare" ]; then
    echo
    python3 scripts/bench-compare.py --before-name "$compare ($short)" \
        "$base/out/bench.json" "$out/bench.json" | tee "$out/compare.md"
fi

if [ -z "$quick" ]; then
    echo
    echo "component benches (their own tables):"
    SANDBOX_AGENT_BIN=$SANDBOX_AGENT_PATH cargo bench -p sandbox-agent --bench exec_overhead --bench search 2>/dev/null
    cargo bench -p iii-test-engine --bench roundtrip 2>/dev/null
fi
