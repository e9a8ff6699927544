#!/bin/sh
# Builds sandbox-agent as a static x86_64 (or aarch64) glibc binary and prints its path.
# Guest images may have another libc or none, so the agent must not link dynamically.
# Usage: agent/build-static.sh [--debug]   (honours CARGO_TARGET_DIR)
# SANDBOX_AGENT_TARGET names another target than this host's (a cross build: the linker and C
# compiler then come from CARGO_TARGET_<TARGET>_LINKER and CC_<target>, as cargo reads them).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
target=${SANDBOX_AGENT_TARGET:-$(uname -m)-unknown-linux-gnu}
profile=release
flag=--release
if [ "${1:-}" = "--debug" ]; then
    profile=debug
    flag=
fi
# With an explicit --target, RUSTFLAGS apply to target crates only (not build scripts).
# Debug info stripped (symbols kept): the binary is copied into every guest.
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C strip=debuginfo" \
    cargo build --manifest-path "$here/Cargo.toml" -p sandbox-agent $flag --target "$target" >&2
target_dir=${CARGO_TARGET_DIR:-$(cargo metadata --manifest-path "$here/Cargo.toml" --format-version 1 --no-deps |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')}
bin="$target_dir/$target/$profile/sandbox-agent"
# Refuse to hand out a binary that would need a dynamic loader in the guest.
if command -v file >/dev/null 2>&1; then
    file "$bin" | grep -Eq 'statically linked|static-pie linked' || {
        echo "build-static.sh: $bin is not static: $(file "$bin")" >&2
        exit 1
    }
fi
if command -v ldd >/dev/null 2>&1; then
    ldd "$bin" 2>&1 | grep -Eq 'statically linked|not a dynamic executable' || {
        echo "build-static.sh: ldd finds shared libraries for $bin" >&2
        exit 1
    }
fi
echo "$bin"
