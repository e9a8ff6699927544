#!/bin/bash
# Measures the lab's costs and prints a table: a lab round trip (QEMU TCG boot, run `true`,
# power off) and, inside the lab, one libkrun microVM from runner start to exit, against a
# baseline run in the same script (the same busybox `true` started with chroot in the lab).
#   tests/vm-lab/measure.sh [N]     (N runs of each, default 5)
set -euo pipefail
N=${1:-5}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"
cargo build -p vm-runner --bins -q
runner=${CARGO_TARGET_DIR:-$repo/target}/debug/sandbox-libkrun-vm

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp "$runner" "$scratch/"
cat > "$scratch/inner.sh" <<'INNER'
set -eu
N=$1; cd /tmp
mkdir -p root/bin root/dev root/proc root/sys root/tmp
cp "$(command -v busybox)" root/bin/busybox
for a in true sh echo; do ln -s busybox root/bin/$a; done
now() { date +%s%N; }
for i in $(seq "$N"); do
  t=$(now); chroot root /bin/true; echo "baseline $(( ($(now) - t) / 1000000 ))"
  echo "{\"vcpus\":1,\"memory_mib\":256,\"root\":\"/tmp/root\",\"workload\":\"/bin/true\"}" > spec.json
  t=$(now); /tmp/vm-lab/sandbox-libkrun-vm --spec spec.json; echo "microvm $(( ($(now) - t) / 1000000 ))"
done > /tmp/vm-lab/times
INNER

: > "$scratch/lab-times"
for _ in $(seq "$N"); do
  t=$(date +%s%N); "$here/lab.sh" true 2>/dev/null
  echo "lab $(( ($(date +%s%N) - t) / 1000000 ))" >> "$scratch/lab-times"
done
LAB_SCRATCH_DIR=$scratch "$here/lab.sh" -- sh /tmp/vm-lab/inner.sh "$N" 2>/dev/null

stats() { # key -> "median min max" in ms
  cat "$scratch/lab-times" "$scratch/times" | awk -v k="$1" '$1 == k {print $2}' | sort -n \
    | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)], a[1], a[NR]}'
}
read -r base _ _ < <(stats baseline)
printf '%-46s %8s %8s %8s %11s\n' "what (ms, N=$N)" median min max "x baseline"
for key in lab microvm baseline; do
  case $key in
    lab) label="lab round trip (boot L1, run true, exit)" ;;
    microvm) label="libkrun microVM in the lab (start to exit)" ;;
    baseline) label="baseline: chroot busybox true in the lab" ;;
  esac
  read -r med min max < <(stats "$key")
  printf '%-46s %8d %8d %8d %11.1f\n' "$label" "$med" "$min" "$max" "$(echo "$med / ($base + 0.001)" | bc -l)"
done
