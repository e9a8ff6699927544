# The escape suite's attacks, run inside a sandbox (python3 of the python fixture image) by
# tests/e2e/tests/escape.rs. Each attack prints one line: "<name> blocked <why>" when the
# kernel refused it, "<name> ESCAPED <what>" when it worked. The test asserts every attack
# was blocked and that the host's canaries did not change.
#
# argv[1]: a host path (the canary) that the attacks try to reach or get the host to write;
# argv[2]: the host pid of the adapter, a process outside the sandbox;
# argv[3] (microVMs only): the host's boot id. A guest with a kernel of its own (another boot
# id) has every id of its kernel: its root is not the host's, which is what the uid_map
# attack asks. In a namespace sandbox the boot id is the host's and the map decides.
import ctypes
import errno
import os
import platform
import sys

canary, adapter_pid = sys.argv[1], int(sys.argv[2])
host_boot_id = sys.argv[3] if len(sys.argv) > 3 else None
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
results = []
# The name of the setuid files the last section leaves for a host user to find.
PLANT = ".escape-plant-suid"


def report(name, escaped, detail):
    results.append(name)
    print(f"{name} {'ESCAPED' if escaped else 'blocked'} {detail}", flush=True)


def write_file(name, path, data):
    try:
        with open(path, "w") as f:
            f.write(data)
        report(name, True, f"wrote {path}")
    except OSError as e:
        report(name, False, f"{path}: {errno.errorcode.get(e.errno, e.errno)}")


def syscall(name, number, *args):
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) for a in args])
    err = ctypes.get_errno()
    if rc == -1 and err in (errno.EPERM, errno.EACCES, errno.ENOSYS):
        report(name, False, errno.errorcode[err])
    else:
        report(name, True, f"rc={rc} errno={err}")


# 1. Host root through the id mapping: the sandbox's uid 0 must not be host uid 0.
with open("/proc/self/uid_map") as f:
    first = f.read().split()
with open("/proc/sys/kernel/random/boot_id") as f:
    own_kernel = host_boot_id is not None and f.read().strip() != host_boot_id
if own_kernel:
    report("uid_map", False, "a kernel of its own (another boot id): its uid 0 is not the host's")
elif first[2] != "4294967295":
    # A namespace nested in the starter's maps its ids to the parent's, not the host's: the
    # map says nothing of host root from in here (the host side checks the host ids).
    report("uid_map", False, "uid 0 is the parent namespace's " + first[1] + " (nested)")
else:
    report("uid_map", first[1] == "0", "uid 0 is host uid " + first[1])

# 2. core_pattern: the classic container escape (the host kernel runs the pipe as root).
write_file("core_pattern", "/proc/sys/kernel/core_pattern", f"|/bin/sh -c 'echo pwned > {canary}'")
pid = os.fork()
if pid == 0:
    os.abort()
os.waitpid(pid, 0)

# 3. Other kernel knobs, namespaced or not: all read-only.
for path in [
    "/proc/sys/kernel/hostname",
    "/proc/sys/kernel/modprobe",
    "/proc/sys/vm/drop_caches",
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/fs/binfmt_misc/register",
    "/proc/sysrq-trigger",
    "/sys/kernel/uevent_helper",
    "/sys/fs/cgroup/cgroup.procs",
]:
    write_file("knob:" + path, path, "1")

# 4. Remount every read-only mount read-write, and make new mounts.
MS_REMOUNT, MS_BIND, MS_RDONLY = 32, 4096, 1
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
read_only = []
with open("/proc/self/mountinfo") as f:
    for line in f:
        fields = line.split()
        if "ro" in fields[5].split(","):
            read_only.append(fields[4].replace("\\040", " "))
for point in read_only:
    for flags in (MS_REMOUNT, MS_REMOUNT | MS_BIND):
        ctypes.set_errno(0)
        rc = libc.mount(None, point.encode(), None, flags, None)
        err = ctypes.get_errno()
        report(f"remount-rw:{point}:{flags}", rc == 0, errno.errorcode.get(err, str(err)))
for fstype, source in [(b"tmpfs", b"none"), (b"proc", b"proc"), (b"sysfs", b"sysfs")]:
    os.makedirs("/tmp/m", exist_ok=True)
    ctypes.set_errno(0)
    rc = libc.mount(source, b"/tmp/m", fstype, 0, None)
    err = ctypes.get_errno()
    report(f"mount:{fstype.decode()}", rc == 0, errno.errorcode.get(err, str(err)))

# 5. A new user namespace (with a map onto host root) and the kernel interfaces that a
#    sandbox never needs.
if platform.machine() == "x86_64":
    CLONE_NEWUSER = 0x10000000
    syscall("unshare-user", 272, CLONE_NEWUSER)
    syscall("kexec_load", 246, 0, 0, 0, 0)
    syscall("init_module", 175, 0, 0, 0)
    syscall("finit_module", 313, 0, 0, 0)
    syscall("bpf", 321, 0, 0, 0)
    syscall("keyctl", 250, 0, 0, 0, 0, 0)
    syscall("add_key", 248, 0, 0, 0, 0, 0)
    syscall("perf_event_open", 298, 0, 0, 0, 0, 0)
    syscall("userfaultfd", 323, 0)
    syscall("open_by_handle_at", 304, 0, 0, 0)
    syscall("setns", 308, 0, 0)
    syscall("reboot", 169, 0xFEE1DEAD, 672274793, 0x01234567, 0)
else:
    print(f"syscalls DID NOT RUN: syscall numbers are written for x86_64, not {platform.machine()}")

# 6. ptrace of a process outside (the adapter): not even visible from a pid namespace of its
#    own, whatever pid number it has there.
if platform.machine() == "x86_64":
    PTRACE_ATTACH = 16
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(101), ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(adapter_pid), 0, 0)
    err = ctypes.get_errno()
    seen = os.path.exists(f"/proc/{adapter_pid}/cmdline") and b"sandbox-libkrun" in open(f"/proc/{adapter_pid}/cmdline", "rb").read()
    report("ptrace-adapter", rc == 0 or seen, f"rc={rc} errno={errno.errorcode.get(err, err)}")

# 7. A setuid-root binary gains nothing (no_new_privs): only where a second uid exists (an
# ordinary user's map is two lines: its own id as root, then its subordinate range).
with open("/proc/self/uid_map") as f:
    mapped = sum(int(line.split()[2]) for line in f if line.strip())
if mapped > 1:
    import shutil
    shutil.copy("/bin/busybox", "/tmp/suid-busybox")
    os.chmod("/tmp/suid-busybox", 0o4755)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.setgid(1000)
        os.setuid(1000)
        os.execv("/tmp/suid-busybox", ["id", "-u"])
    os.close(w)
    os.waitpid(pid, 0)
    euid = os.read(r, 100).decode().strip()
    report("setuid", euid == "0", "a setuid-root binary ran as uid " + euid)
else:
    print("setuid DID NOT RUN: only one id is mapped in this sandbox (an ordinary user without subordinate ids)")

# 8. Capabilities: none of the host's (CAP_SYS_ADMIN, bit 21, is gone even inside).
with open("/proc/self/status") as f:
    status = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
report("cap_sys_admin", int(status["CapEff"], 16) & (1 << 21) != 0, "CapEff " + status["CapEff"])
report("no_new_privs", status.get("NoNewPrivs") != "1", "NoNewPrivs " + status.get("NoNewPrivs", "?"))
report("seccomp", status.get("Seccomp") != "2", "Seccomp " + status.get("Seccomp", "?"))

# 9. Read-only paths stay read-only (a worker VM's /worker, the agent binary).
for path in ["/worker/escape.txt", "/.iii-agent"]:
    if os.path.exists(os.path.dirname(path)) and path != "/.iii-agent" or os.path.exists(path):
        write_file("write:" + path, path, "pwned")

# 10. The canary path itself: the host's filesystem is not there.
write_file("host-path", canary, "pwned")

# 11. Plants for another host user: a setuid copy of busybox in the root (its writable layer)
# and in /state (a worker's host directory), /state opened to all. The test then tries, as
# an ordinary host user, to reach them by their host paths (`assert_plants_out_of_reach`).
for plant in ["/" + PLANT, "/state/" + PLANT]:
    if not os.path.isdir(os.path.dirname(plant)):
        continue
    try:
        import shutil
        shutil.copy("/bin/busybox", plant)
        os.chmod(plant, 0o4755)
        if plant.startswith("/state/"):
            os.chmod("/state", 0o777)
        print(f"planted {plant}", flush=True)
    except OSError as e:
        print(f"plant {plant} refused {errno.errorcode.get(e.errno, e.errno)}", flush=True)

# 12. Sockets that go round the network policy or out of the sandbox's namespaces, and
# io_uring: the seccomp filter refuses them with EPERM whoever asks (root here). Packet
# frames and raw IP never cross the sandbox's netfilter rules; vsock ignores network
# namespaces (on a microVM it would reach the host side of the agent's own link).
AF_INET, AF_PACKET, AF_VSOCK = 2, 17, 40
SOCK_STREAM, SOCK_RAW, SOCK_PACKET = 1, 3, 10
ETH_P_ALL, IPPROTO_TCP = 0x0300, 6  # ETH_P_ALL in network byte order, as packet(7) wants


def refused_with_eperm(name, rc, err):
    report(name, rc >= 0 or err != errno.EPERM, f"rc={rc} {errno.errorcode.get(err, err)}")


for name, family, kind, proto in [
    ("socket:AF_PACKET-SOCK_RAW", AF_PACKET, SOCK_RAW, ETH_P_ALL),
    ("socket:AF_INET-SOCK_RAW-TCP", AF_INET, SOCK_RAW, IPPROTO_TCP),
    ("socket:AF_INET-SOCK_PACKET", AF_INET, SOCK_PACKET, ETH_P_ALL),
    ("socket:AF_VSOCK-SOCK_STREAM", AF_VSOCK, SOCK_STREAM, 0),
]:
    ctypes.set_errno(0)
    fd = libc.socket(family, kind, proto)
    err = ctypes.get_errno()
    if fd >= 0:
        os.close(fd)
    refused_with_eperm(name, fd, err)
# io_uring_setup is 425 on x86_64 and aarch64 alike (the generic syscall table's number).
params = ctypes.create_string_buffer(120)
ctypes.set_errno(0)
rc = libc.syscall(ctypes.c_long(425), ctypes.c_long(1), params)
err = ctypes.get_errno()
if rc >= 0:
    os.close(rc)
refused_with_eperm("io_uring_setup", rc, err)

print(f"done {len(results)} attacks", flush=True)
