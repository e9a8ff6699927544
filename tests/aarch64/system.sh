#!/usr/bin/env bash
# print(6*7) through the engine on the aarch64 archive's bwrap plugin, in an aarch64 Linux
# guest under full-system emulation (qemu-system-aarch64 -M virt -cpu max, TCG): what
# user-mode emulation cannot do (tests/aarch64/smoke.sh: qemu-user's threads keep the launcher
# from making a user namespace).
#
#   tests/aarch64/system.sh ARCHIVE_DIR
#
# The guest: Debian bookworm's arm64 kernel (downloaded, extracted, never installed), an
# initramfs of the arm64 root's static busybox and the kernel's virtio, 9p, ext4 and overlay
# modules; its root is target/cross/bookworm-arm64-root (scripts/cross-aarch64.sh arm64-root:
# bubblewrap, passt, ...) over 9p, read-only, with an ext4 /tmp on a sparse disk image. The
# engine (iii-test-engine) and a registry holding an aarch64 python image run on this host;
# the guest reaches them at 10.0.2.2 (QEMU's user networking). In the guest the archive's one
# binary, as root, serves the engine with `--plugin bwrap`; `trigger` on the host calls
# `sandbox-libkrun::run` through the engine. Then the agent's exec tests run in the guest.
#
# Needs root, qemu-system-aarch64 (QEMU_SYSTEM_AARCH64 names it, else PATH), kmod, cpio,
# e2fsprogs, the host's Rust toolchain (engine, trigger), tests/fixtures/install.sh.
# SYSTEM_TIMEOUT (s, default 1500) bounds the guest. SYSTEM_KEEP=1 keeps the work directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(cd "${1:?usage: tests/aarch64/system.sh ARCHIVE_DIR}" && pwd)
target=aarch64-unknown-linux-gnu
name=sandbox-libkrun
cross=${CARGO_TARGET_DIR:-$root/target}/cross
qemu=${QEMU_SYSTEM_AARCH64:-$(command -v qemu-system-aarch64 || true)}
[ -n "$qemu" ] || { echo "system.sh: no qemu-system-aarch64 (QEMU_SYSTEM_AARCH64)" >&2; exit 97; }
t0=$(date +%s%N)
phase() {
  local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '[system %s +%d.%ds] %s\n' "$(date -u +%H:%M:%S)" $((ms / 1000)) $((ms % 1000 / 100)) "$*"
}
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/sandbox-aarch64-system.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "${SYSTEM_KEEP:-0}" = 1 ]; then echo "kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

phase "the arm64 root, the host's engine and trigger"
arm64_root=$(bash "$root/scripts/cross-aarch64.sh" arm64-root)
cargo build --manifest-path "$root/Cargo.toml" -q -p iii-test-engine --bin iii-test-engine \
  -p sandbox-examples --bin trigger
host_bin=${CARGO_TARGET_DIR:-$root/target}/debug

phase "kernel: bookworm's linux-image-arm64"
kdir=$cross/kernel-arm64
if [ ! -e "$kdir/.done" ]; then
  pkg=$(bash "$root/scripts/cross-aarch64.sh" run sh -c \
    'apt-cache depends linux-image-arm64/bookworm' | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$pkg" ] || fail "cannot resolve linux-image-arm64"
  rm -rf "$kdir" && mkdir -p "$kdir"
  CROSS_BIND=$kdir bash "$root/scripts/cross-aarch64.sh" run sh -c \
    "cd '$kdir' && apt-get download -q '${pkg%:arm64}:arm64/bookworm'" >/dev/null 2>&1
  dpkg-deb -x "$kdir"/linux-image-*.deb "$kdir/root"
  touch "$kdir/.done"
fi
kver=$(ls "$kdir/root/lib/modules" | head -1)
[ -e "$kdir/root/lib/modules/$kver/modules.dep" ] || depmod -b "$kdir/root" "$kver"

phase "initramfs"
modules="virtio_mmio virtio_pci virtio_blk virtio_net 9pnet_virtio 9p overlay loop ext4 crc32c_generic fuse tun veth"
ir=$work/initramfs
mkdir -p "$ir"/{bin,proc,sys,dev,tmp,scratch,mnt/root,lib/modules/"$kver"}
cp "$arm64_root/bin/busybox" "$ir/bin/busybox"
for a in sh mount mkdir modprobe ip switch_root poweroff sleep cat chmod sync echo seq; do
  ln -s busybox "$ir/bin/$a"
done
for m in $modules; do modprobe -d "$kdir/root" -S "$kver" --show-depends "$m"; done \
  | awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
    rel=${f#*/lib/modules/"$kver"/}
    mkdir -p "$ir/lib/modules/$kver/$(dirname "$rel")"; cp "$f" "$ir/lib/modules/$kver/$rel"
  done
cp "$kdir/root/lib/modules/$kver"/modules.{order,builtin,builtin.modinfo} "$ir/lib/modules/$kver/"
depmod -b "$ir" "$kver"
cat > "$ir/init" <<INIT
#!/bin/sh
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
for m in $modules; do modprobe "\$m" || echo "guest: modprobe \$m failed"; done
ip link set lo up
ip link set eth0 up && ip addr add 10.0.2.15/24 dev eth0 && ip route add default via 10.0.2.2
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 scratch /scratch
R=/mnt/root
mount -t 9p -o ro,trans=virtio,version=9p2000.L,msize=512000,cache=loose arm64root \$R
mount --rbind /dev \$R/dev; mount -t proc proc \$R/proc; mount -t sysfs sys \$R/sys
mount -t cgroup2 cgroup2 \$R/sys/fs/cgroup
for _ in \$(seq 1 100); do [ -b /dev/vda ] && break; sleep 0.1; done
mount -t ext4 /dev/vda \$R/tmp; chmod 1777 \$R/tmp; mkdir -p \$R/tmp/vm \$R/dev/shm \$R/dev/pts
mount -t tmpfs tmpfs \$R/run; mount --bind /scratch \$R/tmp/vm; mount -t tmpfs tmpfs \$R/dev/shm
mount -t devpts devpts \$R/dev/pts
[ -c /dev/net/tun ] && chmod 0666 /dev/net/tun
# switch_root, not chroot: a chrooted process may not create user namespaces (bwrap needs them).
exec switch_root \$R /bin/sh -c 'export PATH=/usr/sbin:/usr/bin:/sbin:/bin
  /bin/sh /tmp/vm/cmd.sh > /tmp/vm/guest.log 2>&1; echo \$? > /tmp/vm/rc
  sync; exec busybox poweroff -f'
INIT
chmod +x "$ir/init"
(cd "$ir" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$work/initrd.img"

phase "registry with an aarch64 python image, engine"
read -r reg_pid reg_addr < <(REGISTRY_PARENT_PID=$$ bash "$root/tests/fixtures/start-registry.sh" "$work/registry")
pids+=("$reg_pid")
CROSS_BIND="$work" bash "$root/scripts/cross-aarch64.sh" arm64-run \
  /usr/bin/python3 "$root/tests/fixtures/mkimage.py" --kind python --out "$work/python" \
  --push "$reg_addr/fixtures/python:latest" --push "$reg_addr/library/python:3.12-slim" >/dev/null
guest_reg=10.0.2.2:${reg_addr##*:}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export III_URL="ws://127.0.0.1:$port"
cat > "$work/config.json" <<JSON
{"registry_mirrors": {"docker.io": "$guest_reg"}, "insecure_registries": ["$guest_reg"],
 "image_cache_dir": "/tmp/cache", "state_dir": "/tmp/state"}
JSON
"$host_bin/iii-test-engine" --listen "127.0.0.1:$port" --config "$name=$work/config.json" \
  >"$work/engine.log" 2>&1 &
pids+=($!)

phase "the agent's exec tests, for the guest"
# The two that qemu-user cannot run (see tests/aarch64/smoke.sh) run here, with the static
# agent release.sh built; the timing tests of the other files are left out (TCG is slow).
scratch=$work/scratch
mkdir -p "$scratch"
exec_test=$(bash "$root/scripts/cross-aarch64.sh" run env CARGO_NET_OFFLINE=true \
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
  CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}" \
  cargo test --manifest-path "$root/Cargo.toml" --target $target -p sandbox-agent --test exec \
  --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    d=json.loads(l) if l.startswith("{") else {}
    if d.get("reason")=="compiler-artifact" and d.get("executable") and d["profile"]["test"]: print(d["executable"])')
[ -n "$exec_test" ] || fail "cannot build the agent's exec tests"
cp "$exec_test" "$scratch/agent-exec-tests"
cp "${CARGO_TARGET_DIR:-$root/target}/static-agent/$target/release/sandbox-agent" "$scratch/sandbox-agent"

phase "boot the guest; the archive's binary serves from it"
tar -xzf "$dir/$name-$target.tar.gz" -C "$scratch" "$name"
cat > "$scratch/cmd.sh" <<CMD
echo "guest: \$(uname -srm), \$(nproc) cpus"
mkdir -p /tmp/home
HOME=/tmp/home III_URL=ws://10.0.2.2:$port RUST_LOG=info /tmp/vm/$name --plugin bwrap --prefix $name \
  > /tmp/vm/adapter.log 2>&1 &
while [ ! -e /tmp/vm/stop ]; do sleep 1; done
kill \$!; wait
cd /tmp && SANDBOX_AGENT_BIN=/tmp/vm/sandbox-agent /tmp/vm/agent-exec-tests > /tmp/vm/exec-tests.log 2>&1
CMD
truncate -s 4096M "$work/tmp.img"
mkfs.ext4 -q -F -O ^has_journal "$work/tmp.img"
timeout -k 10 "${SYSTEM_TIMEOUT:-1500}" "$qemu" -M virt -cpu max -accel tcg,thread=multi \
  -smp 2 -m 2048 -nographic -nodefaults -no-reboot -serial stdio \
  -kernel "$kdir/root/boot/vmlinuz-$kver" -initrd "$work/initrd.img" \
  -append "console=ttyAMA0 panic=-1 quiet loglevel=3" \
  -virtfs local,path="$arm64_root",mount_tag=arm64root,security_model=none,readonly=on,multidevs=remap,id=arm64root \
  -virtfs local,path="$scratch",mount_tag=scratch,security_model=none,id=scratch \
  -drive file="$work/tmp.img",format=raw,if=virtio,cache=unsafe \
  -netdev user,id=net0 -device virtio-net-pci,netdev=net0 \
  </dev/null >"$work/console.log" 2>&1 &
qemu_pid=$!; pids+=("$qemu_pid")
boot=$(date +%s)
until "$host_bin/trigger" "$name::adapter::info" >"$work/info.json" 2>/dev/null; do
  kill -0 "$qemu_pid" 2>/dev/null || { cat "$work/console.log" "$scratch"/*.log 2>/dev/null | tail -40; fail "the guest stopped"; }
  sleep 2
done
phase "serving from the guest $(( $(date +%s) - boot )) s after the boot began"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("  adapter::info: target", d["target"], "backend", d["backend"]["name"], "ready", d["backend"]["ready"])' "$work/info.json"

phase "print(6*7) through the engine"
started=$(date +%s%N)
set +e
"$host_bin/trigger" "$name::run" '{"image":"python","code":"print(6*7)","lang":"python"}' \
  >"$work/run.json" 2>"$work/run.err"
rc=$?
set -e
echo "  $(( ($(date +%s%N) - started) / 1000000 )) ms, trigger exit $rc"
cat "$work/run.json" "$work/run.err"
touch "$scratch/stop"
phase "the agent's exec tests in the guest"
wait "$qemu_pid" 2>/dev/null || true
grep -E '^test result|FAILED|panicked' "$scratch/exec-tests.log" || fail "the exec tests did not run"
grep -q '^test result: ok' "$scratch/exec-tests.log" || fail "the agent's exec tests failed in the guest"
stdout=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stdout"], end="")' "$work/run.json" 2>/dev/null || true)
if [ "$stdout" != "42" ]; then
  sed -e 's/\x1b\[[0-9;]*m//g' "$scratch/adapter.log" | tail -30
  fail "print(6*7) did not print 42"
fi
phase "done: print(6*7) -> 42 on the bwrap plugin in an aarch64 guest"
