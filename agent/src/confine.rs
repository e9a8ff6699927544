//! `--confine`: locks the sandbox down before the agent serves anything. The agent starts as
//! uid 0 of the sandbox's own user namespace with every capability of that namespace; this
//! lets the sandbox's groups open ICMP datagram sockets (`ping` without raw sockets), makes
//! the kernel knobs read-only, keeps Docker's default capabilities but CAP_NET_RAW, sets
//! no_new_privs and installs a seccomp filter that every exec inherits. Any failure is
//! fatal to the caller (a sandbox is never served half-confined), but the ping knob's: a
//! sandbox whose network namespace is not its own only loses `ping`.
//!
//! Order matters: the ping knob and the mounts need capabilities and a writable /proc/sys,
//! so they come before the knobs turn read-only and the capabilities go; the filter comes
//! last (it denies mount, so nothing after it could remount anything). Everything here runs
//! while the agent is still single-threaded.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("{what}: {source}")]
    Sys {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("/proc/sys/kernel/cap_last_cap holds {0:?}, not a capability number")]
    CapLastCap(String),
    #[error("/proc/self/gid_map holds {0:?}, no group range")]
    GidMap(String),
    #[error("the network namespace belongs to another user namespace, left alone")]
    ForeignNetns,
    #[error("{0}")]
    Seccomp(#[from] seccomp_policy::Error),
}

fn sys_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ConfineError {
    let what = what.into();
    move |source| ConfineError::Sys { what, source }
}

/// What was done, for the one log line.
pub struct Confined {
    /// The groups that may open ICMP datagram sockets, or why none may.
    ping: Result<(u32, u32), ConfineError>,
    proc_knobs: Vec<&'static str>,
    sys_mounts: usize,
    caps_dropped: u32,
    syscalls_denied: usize,
}

impl fmt::Display for Confined {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.ping {
            Ok((low, high)) => write!(f, "sandbox confined: ping for groups {low}-{high}; ")?,
            Err(e) => write!(f, "sandbox confined: no ping ({e}); ")?,
        }
        write!(
            f,
            "read-only {} and {} mounts at or under /sys; {} capabilities dropped (Docker's \
             default set but CAP_NET_RAW kept, none ambient or inheritable); no_new_privs; \
             seccomp denies {} syscalls, new user namespaces, clone3, and packet, raw and \
             vsock sockets",
            self.proc_knobs.join(" "),
            self.sys_mounts,
            self.caps_dropped,
            self.syscalls_denied,
        )
    }
}

/// Runs the steps in order; see the module comment.
pub fn confine() -> Result<Confined, ConfineError> {
    let last_cap = read_last_cap()?;
    let ping = open_ping_sockets();
    let proc_knobs = read_only_proc_knobs()?;
    let sys_mounts = read_only_sys()?;
    let caps_dropped = drop_capabilities(last_cap)?;
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(sys_err("prctl(PR_SET_NO_NEW_PRIVS)")(
            io::Error::last_os_error(),
        ));
    }
    let syscalls_denied = install_seccomp()?;
    Ok(Confined {
        ping,
        proc_knobs,
        sys_mounts,
        caps_dropped,
        syscalls_denied,
    })
}

// ---- 0. ping without raw sockets ----

const PING_GROUP_RANGE: &str = "/proc/sys/net/ipv4/ping_group_range";
/// The largest value the knob takes (the kernel's GID_T_MAX).
const PING_GID_MAX: u64 = 0x7fff_ffff;

/// Lets every group of the sandbox open ICMP datagram sockets in its network namespace:
/// `ping` falls back to them when a raw socket is refused with EPERM (busybox and iputils
/// do), and unlike raw sockets they carry only echo requests through netfilter. The knob is
/// per network namespace, and written only where the namespace belongs to the agent's
/// user namespace: a user namespace that maps host root may write the knobs of a network
/// namespace it merely shares (the host's, as in the agent's own tests).
fn open_ping_sockets() -> Result<(u32, u32), ConfineError> {
    if !network_namespace_is_ours()? {
        return Err(ConfineError::ForeignNetns);
    }
    let map = std::fs::read_to_string("/proc/self/gid_map")
        .map_err(sys_err("read /proc/self/gid_map"))?;
    let (low, high) = ping_range(&map).ok_or_else(|| ConfineError::GidMap(map.clone()))?;
    std::fs::write(PING_GROUP_RANGE, format!("{low} {high}"))
        .map_err(sys_err(format!("write {PING_GROUP_RANGE}")))?;
    Ok((low, high))
}

/// Whether the user namespace owning our network namespace is our own (NS_GET_USERNS
/// answers EPERM for an owner outside our scope: an ancestor's).
fn network_namespace_is_ours() -> Result<bool, ConfineError> {
    let net =
        std::fs::File::open("/proc/self/ns/net").map_err(sys_err("open /proc/self/ns/net"))?;
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor or -1.
    let owner = unsafe { libc::ioctl(net.as_raw_fd(), libc::NS_GET_USERNS) };
    if owner < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Ok(false);
        }
        return Err(sys_err("ioctl(NS_GET_USERNS)")(e));
    }
    // SAFETY: the ioctl just returned this descriptor, owned by nothing else.
    let owner = unsafe { OwnedFd::from_raw_fd(owner) };
    let owner = std::fs::File::from(owner)
        .metadata()
        .map_err(sys_err("stat the network namespace's owner"))?;
    let ours =
        std::fs::metadata("/proc/self/ns/user").map_err(sys_err("stat /proc/self/ns/user"))?;
    Ok((owner.dev(), owner.ino()) == (ours.dev(), ours.ino()))
}

/// The range of the knob for a gid map: from the lowest to the highest group mapped (both
/// ends must be mapped in the writer's user namespace, or the kernel refuses the value),
/// at most GID_T_MAX; `0 2147483647` where every group is (a microVM's own kernel).
fn ping_range(gid_map: &str) -> Option<(u32, u32)> {
    let mut range: Option<(u64, u64)> = None;
    for line in gid_map.lines() {
        let mut fields = line.split_whitespace().map(str::parse::<u64>);
        let (Some(Ok(inside)), Some(Ok(_)), Some(Ok(count))) =
            (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        if count == 0 {
            return None;
        }
        let (first, last) = (inside, inside + count - 1);
        range = Some(match range {
            None => (first, last),
            Some((low, high)) => (low.min(first), high.max(last)),
        });
    }
    let (low, high) = range?;
    if low > PING_GID_MAX {
        return None;
    }
    Some((low as u32, high.min(PING_GID_MAX) as u32))
}

// ---- 1. read-only kernel knobs ----

/// The parts of a fresh /proc that reach outside the sandbox (sysctls, sysrq, irq
/// affinity, bus devices, fs tunables): what Docker and bwrap cover with read-only binds.
const PROC_KNOBS: [&str; 5] = [
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

const RO_FLAGS: libc::c_ulong = libc::MS_REMOUNT
    | libc::MS_BIND
    | libc::MS_RDONLY
    | libc::MS_NOSUID
    | libc::MS_NODEV
    | libc::MS_NOEXEC;

fn read_only_proc_knobs() -> Result<Vec<&'static str>, ConfineError> {
    let mut done = Vec::new();
    for path in PROC_KNOBS {
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(sys_err(format!("stat {path}"))(e)),
        }
        // A bind onto itself makes the path its own mount, which can then be made
        // read-only without touching the rest of /proc.
        mount(path, libc::MS_BIND).map_err(sys_err(format!("bind {path} onto itself")))?;
        mount(path, RO_FLAGS).map_err(sys_err(format!("remount {path} read-only")))?;
        done.push(path);
    }
    Ok(done)
}

/// /sys and every mount below it (cgroups, securityfs, debugfs...): a read-only /sys
/// alone would leave its submounts writable. Already read-only ones are left alone.
/// Returns how many were remounted.
fn read_only_sys() -> Result<usize, ConfineError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(sys_err("read /proc/self/mountinfo"))?;
    let mut done = 0;
    for path in writable_mounts_under_sys(&mountinfo) {
        match mount(&path, RO_FLAGS) {
            Ok(()) => done += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(sys_err(format!("remount {path} read-only"))(e)),
        }
    }
    Ok(done)
}

/// Mount points at or under /sys whose mount options say `rw`, in mountinfo order
/// (parents before children), without duplicates.
fn writable_mounts_under_sys(mountinfo: &str) -> Vec<String> {
    let mut paths: Vec<String> = Vec::new();
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        let (Some(point), Some(options)) = (fields.nth(4), fields.next()) else {
            continue;
        };
        let point = unescape(point);
        let under_sys = point == "/sys" || point.starts_with("/sys/");
        let writable = options.split(',').any(|o| o == "rw");
        if under_sys && writable && !paths.contains(&point) {
            paths.push(point);
        }
    }
    paths
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|s| u8::from_str_radix(s, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `mount(path, path, NULL, flags, NULL)`: a bind of `path` onto itself, or a remount.
fn mount(path: &str, flags: libc::c_ulong) -> io::Result<()> {
    let c = CString::new(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call; a null fstype
    // and data are allowed for binds and remounts.
    let rc = unsafe {
        libc::mount(
            c.as_ptr(),
            c.as_ptr(),
            std::ptr::null(),
            flags,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// ---- 2. capabilities ----

/// Docker's default capability set (moby's `DefaultCapabilities`), by number, without
/// CAP_NET_RAW: raw and packet sockets go round the sandbox's egress rules (the seccomp
/// filter refuses them too), and `ping` has ICMP datagram sockets instead.
const KEEP: [u32; 13] = [
    0,  // CAP_CHOWN
    1,  // CAP_DAC_OVERRIDE
    3,  // CAP_FOWNER
    4,  // CAP_FSETID
    5,  // CAP_KILL
    6,  // CAP_SETGID
    7,  // CAP_SETUID
    8,  // CAP_SETPCAP
    10, // CAP_NET_BIND_SERVICE
    18, // CAP_SYS_CHROOT
    27, // CAP_MKNOD
    29, // CAP_AUDIT_WRITE
    31, // CAP_SETFCAP
];

fn read_last_cap() -> Result<u32, ConfineError> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .map_err(sys_err("read /proc/sys/kernel/cap_last_cap"))?;
    let n: u32 = text
        .trim()
        .parse()
        .map_err(|_| ConfineError::CapLastCap(text.clone()))?;
    // Capability sets are two 32-bit words; a larger number is not a kernel we know.
    if n > 63 {
        return Err(ConfineError::CapLastCap(text));
    }
    Ok(n)
}

/// Drops every capability outside KEEP from the bounding set (so no exec can regain it),
/// clears the ambient set and sets effective = permitted = KEEP, inheritable empty (see
/// `seccomp_policy::capabilities`). Returns how many capabilities were dropped.
fn drop_capabilities(last_cap: u32) -> Result<u32, ConfineError> {
    seccomp_policy::capabilities::keep_only(&KEEP, last_cap).map_err(|e| ConfineError::Sys {
        what: e.step,
        source: e.source,
    })
}

// ---- 4. seccomp ----

/// The filters are shared with the bwrap launcher's disk-daemon jails (`seccomp-policy`).
fn install_seccomp() -> Result<usize, ConfineError> {
    Ok(seccomp_policy::install()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_under_sys_that_are_writable() {
        let info = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 23 0:7 / /sys/kernel/security ro,nosuid - securityfs securityfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 27 0:29 / /sysroot rw - ext4 /dev/vda rw
33 23 0:30 / /sys/with\\040space rw - tmpfs tmpfs rw
34 23 0:31 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw
";
        assert_eq!(
            writable_mounts_under_sys(info),
            ["/sys", "/sys/fs/cgroup", "/sys/with space"]
        );
        assert!(writable_mounts_under_sys("").is_empty());
        assert!(writable_mounts_under_sys("short line\n").is_empty());
    }

    #[test]
    fn unescape_decodes_octal_and_keeps_the_rest() {
        assert_eq!(unescape(r"/a\040b\134c"), r"/a b\c");
        assert_eq!(unescape(r"/trailing\04"), r"/trailing\04");
        assert_eq!(unescape(r"/not\999octal"), r"/not\999octal");
    }

    #[test]
    fn the_kept_set_is_dockers_but_net_raw() {
        let keep = KEEP.iter().fold(0u32, |mask, cap| mask | (1 << cap));
        // Docker's 0xa80425fb without bit 13.
        assert_eq!(keep, 0xa804_05fb);
        assert!(!KEEP.contains(&21), "CAP_SYS_ADMIN is never kept");
        assert!(!KEEP.contains(&13), "CAP_NET_RAW is never kept");
    }

    #[test]
    fn the_ping_range_spans_the_mapped_groups() {
        // A root adapter's sandbox: its subordinate range.
        assert_eq!(ping_range("0 100000 65536\n"), Some((0, 65535)));
        // An ordinary user's: its own group as root, then its subordinate range.
        assert_eq!(ping_range("0 1000 1\n1 100000 65536\n"), Some((0, 65536)));
        // Only root mapped.
        assert_eq!(
            ping_range("         0       1000          1\n"),
            Some((0, 0))
        );
        // A microVM's own kernel: every group, up to the knob's largest value.
        assert_eq!(
            ping_range("         0          0 4294967295\n"),
            Some((0, 2147483647))
        );
        assert_eq!(ping_range(""), None);
        assert_eq!(ping_range("0 0\n"), None);
        assert_eq!(ping_range("0 0 0\n"), None);
        assert_eq!(ping_range("x 0 1\n"), None);
    }
}
