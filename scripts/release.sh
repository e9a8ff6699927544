#!/usr/bin/env bash
# Builds the release archive iii's installer expects for a binary worker:
#   OUT_DIR/sandbox-libkrun-<target>.tar.gz          one entry, `sandbox-libkrun` (mode 0755)
#   OUT_DIR/sandbox-libkrun-<target>.tar.gz.sha256   `sha256sum` format
#   OUT_DIR/sandbox-libkrun-<target>.sha256          the same line, under the name older
#                                                    installers fetch (`<name>-<target>.sha256`)
# The installer (iii-worker `binary_download.rs`) checks the archive's sha256, extracts only the
# entry whose file name is the worker's name and installs it as ~/.iii/workers/sandbox-libkrun.
# So that one file must be the whole adapter: the default plugins, the VM runner, the bwrap
# launcher and the static agent are built first, then embedded into the shell (its build.rs
# reads $SANDBOX_LIBKRUN_EMBED_DIR), which writes them on first use to
# ~/.iii/lib/sandbox-libkrun/<version>-<hash>/.
#
# usage: scripts/release.sh [--target TARGET] OUT_DIR
#        (honours CARGO_TARGET_DIR, CARGO_BUILD_JOBS; prints the archive's path)
#
# Targets:
#   x86_64-unknown-linux-gnu   the default on an x86_64 Linux host: the host's own toolchain.
#   aarch64-unknown-linux-gnu  the default on an aarch64 Linux host (the host's toolchain, as
#                              above: not run anywhere yet). From an x86_64 Linux host, as root:
#                              `--target aarch64-unknown-linux-gnu` fetches the crates on the
#                              host, makes or reuses the cross toolchain of
#                              scripts/cross-aarch64.sh (a trixie chroot with Debian's Rust
#                              1.96 and its aarch64 standard library, bookworm's cross gcc and
#                              glibc 2.36) and runs this script again inside it, where every
#                              cargo build takes --target, the artefacts come from
#                              target/aarch64-unknown-linux-gnu/release/ and aarch64-linux-gnu-gcc
#                              links them and compiles the static guest init. The static agent
#                              builds in a target directory of its own (its RUSTFLAGS differ,
#                              and would otherwise rebuild the parts' crates over and over).
#                              About 31 minutes cold (CARGO_BUILD_JOBS=2, nice 10, on a
#                              2-core machine another build shared), toolchain not counted.
#   aarch64-apple-darwin       would need: a macOS build machine (libkrun there runs on
#                              Hypervisor.framework, with libkrunfw built for macOS); no bwrap
#                              plugin (no bubblewrap on macOS) and the plugin named .dylib; the
#                              guest agent still a static aarch64 *Linux* binary (it runs inside
#                              the guest: the cross toolchain above, or aarch64-unknown-linux-musl);
#                              and signing: the VM runner `sandbox-libkrun-vm` must carry the
#                              com.apple.security.hypervisor entitlement (codesign
#                              --entitlements ... --options runtime) *before* it is embedded,
#                              since the signature lives inside the file and the shell refuses
#                              an extracted file whose bytes differ from the embedded ones; the
#                              shell itself signed with a Developer ID and notarised. See the
#                              README's hosts section for the Linux-only parts of the code.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=
if [ "${1:-}" = "--target" ]; then
  target=${2:?usage: scripts/release.sh [--target TARGET] OUT_DIR}
  shift 2
fi
out=${1:?usage: scripts/release.sh [--target TARGET] OUT_DIR}
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) host=x86_64-unknown-linux-gnu ;;
  Linux-aarch64) host=aarch64-unknown-linux-gnu ;;
  *) echo "release.sh: no release build for $(uname -s) $(uname -m) yet (see the comment in this script)" >&2
     exit 1 ;;
esac
target=${target:-$host}
target_dir=${CARGO_TARGET_DIR:-$root/target}
name=sandbox-libkrun
archive=$name-$target.tar.gz
cargo_target=()         # --target for every cargo build, on a cross build only
release_dir=$target_dir/release
strip="strip"

if [ "$target" != "$host" ]; then
  if [ "$target-$host" != aarch64-unknown-linux-gnu-x86_64-unknown-linux-gnu ]; then
    echo "release.sh: no cross build from $host to $target (see the comment in this script)" >&2
    exit 1
  fi
  if [ -z "${SANDBOX_CROSS_INSIDE:-}" ]; then
    # On the host: crates, toolchain, the archive's time, then this script in the chroot.
    cargo fetch --manifest-path "$root/Cargo.toml" >&2
    bash "$root/scripts/cross-aarch64.sh" setup >/dev/null
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    mtime=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
    CROSS_BIND=$out bash "$root/scripts/cross-aarch64.sh" run \
      env SANDBOX_CROSS_INSIDE=1 SOURCE_DATE_EPOCH="$mtime" CARGO_TARGET_DIR="$target_dir" \
      ${CARGO_BUILD_JOBS:+CARGO_BUILD_JOBS=$CARGO_BUILD_JOBS} \
      bash "$root/scripts/release.sh" --target "$target" "$out"
    exit
  fi
  # In the chroot: cargo and the cc crate read these; crates come from the host's registry.
  export CARGO_NET_OFFLINE=true
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
  export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
  cargo_target=(--target "$target")
  release_dir=$target_dir/$target/release
  strip=aarch64-linux-gnu-strip
fi

# 1. The parts, in release mode (the shell last: it embeds them).
cargo build --manifest-path "$root/Cargo.toml" --release "${cargo_target[@]}" \
  -p plugin-libkrun -p plugin-bwrap -p vm-runner >&2
if [ ${#cargo_target[@]} -eq 0 ]; then
  agent=$(sh "$root/agent/build-static.sh")
else
  agent=$(SANDBOX_AGENT_TARGET=$target CARGO_TARGET_DIR=$target_dir/static-agent \
    sh "$root/agent/build-static.sh")
fi

# 2. The files the shell embeds, staged under the names it extracts them as, with their debug
#    information stripped (symbols kept, so backtraces still name functions; the release
#    profile's line tables are most of each file: 284 MB of the parts' 326). Copied only when
#    changed: build.rs reruns on their mtimes, and an unchanged part should not relink the shell.
embed=$target_dir/sandbox-libkrun-embed${cargo_target:+-$target}
# Temporaries next to, not in, the directory: build.rs reruns on any change in it.
scratch=$embed.tmp
mkdir -p "$embed" "$scratch"
stage() {
  local new=$scratch/$2.$$
  "$strip" --strip-debug -o "$new" "$1"
  if cmp -s "$new" "$embed/$2"; then rm -f "$new"; else mv -f "$new" "$embed/$2"; fi
}
parts="libplugin_libkrun.so libplugin_bwrap.so sandbox-libkrun-vm sandbox-bwrap-launch"
for f in $parts; do
  stage "$release_dir/$f" "$f"
done
stage "$agent" sandbox-agent
# Anything else in the directory would be embedded too.
for f in "$embed"/*; do
  case " $parts sandbox-agent " in
    *" $(basename "$f") "*) ;;
    *) rm -rf "$f" ;;
  esac
done

# 3. The shell with them inside. The plugins find their helpers through these variables,
#    which the shell points at the extracted files unless the operator set them.
SANDBOX_LIBKRUN_EMBED_DIR=$embed \
SANDBOX_LIBKRUN_EMBED_ENV="SANDBOX_AGENT_PATH=sandbox-agent,SANDBOX_LIBKRUN_VM=sandbox-libkrun-vm,SANDBOX_BWRAP_LAUNCH=sandbox-bwrap-launch" \
  cargo build --manifest-path "$root/Cargo.toml" --release "${cargo_target[@]}" -p sandbox-libkrun >&2

# 4. The archive: one regular file named after the worker, at the top, owned by root,
#    reproducible (fixed mtime, no gzip timestamp).
mkdir -p "$out"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d "$out/.release.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
"$strip" --strip-debug -o "$tmp/$name" "$release_dir/$name"
chmod 0755 "$tmp/$name"
mtime=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
tar --format=gnu --owner=0 --group=0 --numeric-owner --mtime="@$mtime" \
  -C "$tmp" -cf - "$name" | gzip -n > "$tmp/$archive"
mv -f "$tmp/$archive" "$out/$archive"
(cd "$out" && sha256sum "$archive" > "$archive.sha256.tmp" &&
  cp "$archive.sha256.tmp" "$name-$target.sha256" && mv -f "$archive.sha256.tmp" "$archive.sha256")
echo "$out/$archive"
