//! What `/proc` says about one process, as numbers and raw text (`describe.rs` turns it into
//! a table's symbolic fields). Read from the host's pid and user namespaces, as root.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

/// The namespace kinds compared (`/proc/PID/ns/*`; the `*_for_children` ones are left out:
/// they matter only for a process's next child, which the table lists in its own right).
pub const NS_KINDS: [&str; 8] = ["cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts"];

/// The `/proc/PID/status` keys a process's posture is read from.
pub const STATUS_KEYS: [&str; 12] = [
    "Uid",
    "Gid",
    "Groups",
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
    "State",
];

#[derive(Debug, Clone)]
pub struct RawFd {
    pub num: i32,
    /// `readlink /proc/PID/fd/N`.
    pub link: String,
    /// `flags:` of `/proc/PID/fdinfo/N` (octal open flags).
    pub flags: u32,
    /// The file type of what it opens (`S_IFMT` bits), 0 if unknown.
    pub file_type: u32,
    /// Device and inode of what it opens, if this test may stat it.
    pub target: Option<(u64, u64)>,
    /// Other `fdinfo` lines that name something (a pidfd's `Pid:`).
    pub pid: Option<u32>,
    /// What a socket is (read through a copy of the descriptor).
    pub socket: Option<Socket>,
}

#[derive(Debug, Clone)]
pub struct Thread {
    pub tid: u32,
    pub comm: String,
    pub status: BTreeMap<String, String>,
    pub ns: BTreeMap<String, u64>,
}

/// One process as `/proc` shows it.
#[derive(Debug, Clone)]
pub struct RawProcess {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    /// `readlink /proc/PID/exe`, as the kernel names it in the process's own mount namespace.
    pub exe: String,
    pub status: BTreeMap<String, String>,
    pub ns: BTreeMap<String, u64>,
    /// The user namespace's parent (inode) and owner (host uid), by `ioctl(NS_GET_*)`.
    pub userns_parent: Option<u64>,
    pub userns_owner: Option<u32>,
    /// `/proc/PID/{uid,gid}_map`: inside, outside (a host id), count.
    pub uid_map: Vec<[u64; 3]>,
    pub gid_map: Vec<[u64; 3]>,
    pub fds: Vec<RawFd>,
    pub root: String,
    pub cwd: String,
    /// Device and inode of the working directory, if this test may stat it.
    pub cwd_target: Option<(u64, u64)>,
    /// `/proc/PID/limits`: short name -> "soft:hard".
    pub limits: BTreeMap<String, String>,
    /// Owner of `/proc/PID/environ` (uid, gid): the kernel gives it to "some root" when the
    /// process is not dumpable (`task_dump_owner`).
    pub environ_owner: (u32, u32),
    /// Every thread but the main one.
    pub threads: Vec<Thread>,
}

impl RawProcess {
    /// `None` if the process is gone (or a zombie) by the time it is read.
    pub fn read(pid: u32) -> Option<RawProcess> {
        let dir = format!("/proc/{pid}");
        let (comm, ppid, state) = stat(&dir)?;
        if state == "Z" {
            return None;
        }
        let main_status = status(&format!("{dir}/status"))?;
        let ns = namespaces(&dir);
        let (userns_parent, userns_owner) = userns_relatives(&format!("{dir}/ns/user"));
        let environ = std::fs::metadata(format!("{dir}/environ")).ok()?;
        let threads = std::fs::read_dir(format!("{dir}/task"))
            .map(|tasks| {
                let mut tids: Vec<u32> = tasks
                    .flatten()
                    .filter_map(|t| t.file_name().to_str()?.parse().ok())
                    .filter(|tid| *tid != pid)
                    .collect();
                tids.sort();
                tids.into_iter()
                    .filter_map(|tid| {
                        let task = format!("{dir}/task/{tid}");
                        Some(Thread {
                            tid,
                            comm: std::fs::read_to_string(format!("{task}/comm"))
                                .ok()?
                                .trim()
                                .to_string(),
                            status: status(&format!("{task}/status"))?,
                            ns: namespaces(&task),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(RawProcess {
            pid,
            ppid,
            comm,
            exe: link(&format!("{dir}/exe")),
            status: main_status,
            ns,
            userns_parent,
            userns_owner,
            uid_map: id_map(&format!("{dir}/uid_map")),
            gid_map: id_map(&format!("{dir}/gid_map")),
            fds: fds(&dir, pid),
            root: link(&format!("{dir}/root")),
            cwd: link(&format!("{dir}/cwd")),
            cwd_target: std::fs::metadata(format!("{dir}/cwd"))
                .ok()
                .map(|m| (m.dev(), m.ino())),
            limits: limits(&format!("{dir}/limits")),
            environ_owner: (environ.uid(), environ.gid()),
            threads,
        })
    }

    /// The four ids of a `Uid:`/`Gid:` line (real, effective, saved, fs).
    pub fn ids(&self, key: &str) -> [u32; 4] {
        let mut out = [u32::MAX; 4];
        let values = self.status.get(key).map(String::as_str).unwrap_or("");
        for (slot, value) in out.iter_mut().zip(values.split_whitespace()) {
            *slot = value.parse().unwrap_or(u32::MAX);
        }
        out
    }

    pub fn cap(&self, key: &str) -> u64 {
        self.status
            .get(key)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok())
            .unwrap_or(0)
    }
}

/// (comm, ppid, state) from `/proc/PID/stat`.
pub fn stat(dir: &str) -> Option<(String, u32, String)> {
    let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
    let (head, tail) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_string();
    let mut fields = tail.split_whitespace();
    let state = fields.next()?.to_string();
    let ppid = fields.next()?.parse().ok()?;
    Some((comm, ppid, state))
}

fn status(path: &str) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(':')?;
                STATUS_KEYS.contains(&key).then(|| {
                    (
                        key.to_string(),
                        value.split_whitespace().collect::<Vec<_>>().join(" "),
                    )
                })
            })
            .collect(),
    )
}

fn namespaces(dir: &str) -> BTreeMap<String, u64> {
    NS_KINDS
        .iter()
        .filter_map(|kind| {
            let inode = std::fs::metadata(format!("{dir}/ns/{kind}")).ok()?.ino();
            Some((kind.to_string(), inode))
        })
        .collect()
}

pub fn link(path: &str) -> String {
    std::fs::read_link(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|e| format!("(unreadable: {})", e.kind()))
}

fn id_map(path: &str) -> Vec<[u64; 3]> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let v: Vec<u64> = line
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v.len() == 3).then(|| [v[0], v[1], v[2]])
        })
        .collect()
}

fn fds(dir: &str, pid: u32) -> Vec<RawFd> {
    let pidfd = PidFd::open(pid);
    let Ok(entries) = std::fs::read_dir(format!("{dir}/fd")) else {
        return Vec::new();
    };
    let mut nums: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    nums.sort();
    nums.into_iter()
        .filter_map(|num| {
            let path = format!("{dir}/fd/{num}");
            let link = std::fs::read_link(&path).ok()?.display().to_string();
            let info = std::fs::read_to_string(format!("{dir}/fdinfo/{num}")).unwrap_or_default();
            let field = |key: &str| {
                info.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim().to_string())
            };
            let meta = std::fs::metadata(&path).ok();
            Some(RawFd {
                num,
                target: meta.as_ref().map(|m| (m.dev(), m.ino())),
                flags: field("flags:")
                    .and_then(|f| u32::from_str_radix(&f, 8).ok())
                    .unwrap_or(0),
                file_type: meta.as_ref().map_or(0, |m| m.mode() & 0o170000),
                pid: field("Pid:").and_then(|p| p.parse().ok()),
                socket: link
                    .starts_with("socket:")
                    .then(|| pidfd.as_ref()?.socket(num))
                    .flatten(),
                link,
            })
        })
        .collect()
}

fn limits(path: &str) -> BTreeMap<String, String> {
    const NAMES: [(&str, &str); 16] = [
        ("Max cpu time", "cpu"),
        ("Max file size", "fsize"),
        ("Max data size", "data"),
        ("Max stack size", "stack"),
        ("Max core file size", "core"),
        ("Max resident set", "rss"),
        ("Max processes", "nproc"),
        ("Max open files", "nofile"),
        ("Max locked memory", "memlock"),
        ("Max address space", "as"),
        ("Max file locks", "locks"),
        ("Max pending signals", "sigpending"),
        ("Max msgqueue size", "msgqueue"),
        ("Max nice priority", "nice"),
        ("Max realtime priority", "rtprio"),
        ("Max realtime timeout", "rttime"),
    ];
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (long, short) = NAMES.iter().find(|(long, _)| line.starts_with(long))?;
            let mut values = line[long.len()..].split_whitespace();
            let soft = values.next()?;
            let hard = values.next()?;
            Some((short.to_string(), format!("{soft}:{hard}")))
        })
        .collect()
}

/// `ioctl(NS_GET_PARENT)` and `ioctl(NS_GET_OWNER_UID)` on a user namespace file: its
/// parent's inode and its owner's uid (as the host sees them).
fn userns_relatives(path: &str) -> (Option<u64>, Option<u32>) {
    use nix::libc;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // _IO(0xb7, 2) and _IO(0xb7, 4) of linux/nsfs.h.
    const NS_GET_PARENT: libc::c_ulong = 0xb702;
    const NS_GET_OWNER_UID: libc::c_ulong = 0xb704;
    let Ok(file) = std::fs::File::open(path) else {
        return (None, None);
    };
    // SAFETY: NS_GET_PARENT takes no argument and returns a new descriptor or -1.
    let parent = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_PARENT as _) };
    let parent = (parent >= 0).then(|| {
        // SAFETY: the ioctl returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(parent) };
        std::fs::File::from(fd).metadata().map(|m| m.ino()).ok()
    });
    let mut owner: libc::uid_t = 0;
    // SAFETY: NS_GET_OWNER_UID writes one uid_t through the pointer, which points at `owner`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), NS_GET_OWNER_UID as _, &mut owner) };
    (parent.flatten(), (rc == 0).then_some(owner))
}

/// A socket as its holder sees it, read through a copy of the descriptor
/// (`pidfd_getfd`): family, type, protocol, whether it listens or is connected, its local
/// address, and its network namespace (`SIOCGSKNS`, as an inode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Socket {
    /// `unix-stream`, `tcp4`, `udp6`, `netlink-route`, `packet-raw`, ...
    pub kind: String,
    /// `listen`, `connected` or empty.
    pub state: String,
    /// The bound address (`127.0.0.1:53`, `[::1]:53`, a unix path, `@...`), or empty.
    pub local: String,
    pub ns: Option<u64>,
}

/// A process's `pidfd_open`, to copy its descriptors from.
pub struct PidFd(std::os::fd::OwnedFd);

impl PidFd {
    pub fn open(pid: u32) -> Option<PidFd> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid as i32, 0) };
        // SAFETY: a non-negative result is a new descriptor nothing else owns.
        (fd >= 0).then(|| PidFd(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }))
    }

    /// The socket behind the process's descriptor `target`, if it is one.
    pub fn socket(&self, target: i32) -> Option<Socket> {
        use nix::libc;
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number and flags; it returns a new
        // descriptor (a copy, close-on-exec) or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.0.as_raw_fd(), target, 0) };
        if fd < 0 {
            return None;
        }
        // SAFETY: the copy is ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let raw = fd.as_raw_fd();
        let option = |name: libc::c_int| -> Option<libc::c_int> {
            let mut value: libc::c_int = 0;
            let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into `value`.
            let rc = unsafe {
                libc::getsockopt(
                    raw,
                    libc::SOL_SOCKET,
                    name,
                    (&mut value as *mut libc::c_int).cast(),
                    &mut len,
                )
            };
            (rc == 0).then_some(value)
        };
        let domain = option(libc::SO_DOMAIN)?;
        let kind = option(libc::SO_TYPE).unwrap_or(0);
        let protocol = option(libc::SO_PROTOCOL).unwrap_or(0);
        let listening = option(libc::SO_ACCEPTCONN) == Some(1);
        // SAFETY: sockaddr_storage is plain old data; zeroes are a valid value.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getsockname writes at most `len` bytes into `addr`.
        let named = unsafe {
            libc::getsockname(
                raw,
                (&mut addr as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        } == 0;
        let local = if named {
            sockaddr(&addr, len)
        } else {
            String::new()
        };
        // SAFETY: sockaddr_storage is plain old data; zeroes are a valid value.
        let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut peer_len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getpeername writes at most `peer_len` bytes into `peer`.
        let connected = unsafe {
            libc::getpeername(
                raw,
                (&mut peer as *mut libc::sockaddr_storage).cast(),
                &mut peer_len,
            )
        } == 0;
        // SIOCGSKNS (linux/sockios.h): a descriptor of the socket's network namespace.
        const SIOCGSKNS: libc::c_ulong = 0x894C;
        // SAFETY: SIOCGSKNS takes no argument and returns a new descriptor or -1.
        let ns_fd = unsafe { libc::ioctl(raw, SIOCGSKNS as _) };
        let ns = (ns_fd >= 0).then(|| {
            // SAFETY: a new descriptor nothing else owns.
            let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(ns_fd) });
            file.metadata().map(|m| m.ino()).ok()
        });
        let type_name = match kind {
            libc::SOCK_STREAM => "stream",
            libc::SOCK_DGRAM => "dgram",
            libc::SOCK_RAW => "raw",
            libc::SOCK_SEQPACKET => "seqpacket",
            _ => "other",
        };
        let kind = match (domain, kind) {
            (libc::AF_UNIX, _) => format!("unix-{type_name}"),
            (libc::AF_INET, libc::SOCK_STREAM) => "tcp4".into(),
            (libc::AF_INET6, libc::SOCK_STREAM) => "tcp6".into(),
            (libc::AF_INET, libc::SOCK_DGRAM) if protocol == libc::IPPROTO_ICMP => "icmp4".into(),
            (libc::AF_INET6, libc::SOCK_DGRAM) if protocol == libc::IPPROTO_ICMPV6 => {
                "icmp6".into()
            }
            (libc::AF_INET, libc::SOCK_DGRAM) => "udp4".into(),
            (libc::AF_INET6, libc::SOCK_DGRAM) => "udp6".into(),
            (libc::AF_INET, _) => format!("inet4-{type_name}"),
            (libc::AF_INET6, _) => format!("inet6-{type_name}"),
            (libc::AF_NETLINK, _) => format!("netlink-{}", netlink_proto(protocol)),
            (libc::AF_PACKET, _) => format!("packet-{type_name}"),
            (libc::AF_VSOCK, _) => format!("vsock-{type_name}"),
            (other, _) => format!("family{other}-{type_name}"),
        };
        let state = match (listening, connected) {
            (true, _) => "listen",
            (false, true) => "connected",
            _ => "",
        };
        Some(Socket {
            kind,
            state: state.into(),
            local,
            ns: ns.flatten(),
        })
    }
}

fn sockaddr(addr: &nix::libc::sockaddr_storage, len: nix::libc::socklen_t) -> String {
    use nix::libc;
    match i32::from(addr.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let v4 =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            format!("{ip}:{}", u16::from_be(v4.sin_port))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let v6 =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr);
            format!("[{ip}]:{}", u16::from_be(v6.sin6_port))
        }
        libc::AF_UNIX => {
            // SAFETY: the family says the storage holds a sockaddr_un.
            let un =
                unsafe { &*(addr as *const libc::sockaddr_storage).cast::<libc::sockaddr_un>() };
            let offset = std::mem::size_of::<libc::sa_family_t>();
            let n = (len as usize).saturating_sub(offset).min(un.sun_path.len());
            let bytes: Vec<u8> = un.sun_path[..n].iter().map(|c| *c as u8).collect();
            match bytes.first() {
                None => String::new(),
                Some(0) => "@abstract".into(),
                Some(_) => String::from_utf8_lossy(bytes.split(|b| *b == 0).next().unwrap_or(&[]))
                    .into_owned(),
            }
        }
        _ => String::new(),
    }
}

fn netlink_proto(p: i32) -> String {
    match p {
        0 => "route".into(),
        9 => "audit".into(),
        12 => "netfilter".into(),
        15 => "kobject".into(),
        16 => "generic".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_as_itself() {
        let me = RawProcess::read(std::process::id()).expect("our own /proc entry");
        assert_eq!(me.pid, std::process::id());
        assert!(me.status.contains_key("CapEff"), "{:?}", me.status);
        assert!(me.fds.iter().any(|fd| fd.num == 0));
        assert_eq!(me.ns.len(), NS_KINDS.len());
        assert!(me.limits.contains_key("nofile"), "{:?}", me.limits);
    }
}
