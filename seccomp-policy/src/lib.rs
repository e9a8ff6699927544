//! The seccomp filters of a sandbox's processes, written once: the agent installs them on
//! itself before it serves (`--confine`), and the bwrap launcher hands them to the jails of
//! an ordinary-user worker's disk daemons (bwrap's `--add-seccomp-fd`). Every syscall on the
//! list fails with EPERM, new user namespaces and the sockets of [`socket_rules`] too; clone3
//! fails with ENOSYS (libc falls back to clone, whose flags a filter can read); x32 syscalls
//! fail with ENOSYS.

use std::collections::BTreeMap;

pub mod capabilities;
pub mod pasta;
pub mod vmm;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("seccomp filter: {0}")]
    Filter(#[from] seccompiler::Error),
    #[error("seccomp filter: {0}")]
    Rule(#[from] seccompiler::BackendError),
    #[error("no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
}

/// Kernel interfaces a container has no use for: module and kexec loading, bpf, perf,
/// the keyring (not namespaced), userfaultfd, file handles (escape a bind mount), every
/// mount API, swap, reboot, accounting, the kernel log, port I/O, quotas, joining other
/// namespaces, writing other processes' memory, and io_uring (a second way into the
/// kernel, with a long record of privilege escalations, that no seccomp filter can see
/// into: Docker's and podman's defaults refuse it too). They fail with EPERM.
pub fn denied_syscalls() -> Vec<libc::c_long> {
    let list = vec![
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_userfaultfd,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_reboot,
        libc::SYS_acct,
        libc::SYS_syslog,
        libc::SYS_quotactl,
        libc::SYS_lookup_dcookie,
        libc::SYS_setns,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_mount_setattr,
        libc::SYS_process_vm_writev,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
    ];
    // Port I/O exists on x86 only.
    #[cfg(target_arch = "x86_64")]
    let list = [list, vec![libc::SYS_iopl, libc::SYS_ioperm]].concat();
    list
}

pub(crate) fn arg(index: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, Error> {
    Ok(SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

pub(crate) fn arg0(op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, Error> {
    arg(0, op, value)
}

/// `socket` and `socketpair`'s type argument: the type in the low bits, SOCK_NONBLOCK and
/// SOCK_CLOEXEC above (the kernel's SOCK_TYPE_MASK).
pub(crate) const SOCK_TYPE_MASK: u64 = 0xf;
/// The obsolete packet interface of `socket(AF_INET, SOCK_PACKET, ...)`, which the kernel
/// turns into an AF_PACKET socket.
const SOCK_PACKET: u64 = 10;

/// The sockets no program in a sandbox may open (with `socket` or `socketpair`, whose
/// family and type are its first two arguments as well), each a rule of the EPERM filter:
/// - `AF_PACKET`, and `SOCK_PACKET` of any family: frames built by hand leave through the
///   interface without crossing netfilter, so the sandbox's egress rules never judge them;
/// - `SOCK_RAW` of any family but `AF_NETLINK` and `AF_UNIX`: raw IP is the same way round
///   the rules for any protocol the filter does not know. Netlink's sockets are "raw" by
///   name only (glibc's getaddrinfo and getifaddrs and `ip` open them), and a unix
///   socket's SOCK_RAW is SOCK_DGRAM;
/// - `AF_VSOCK`: vsock ignores network namespaces and reaches the host's vsock services or,
///   in a microVM, the host side of the agent's own link. The agent connects that link
///   before it installs the filter (see the agent's `main`), so nothing needs a new one.
///
/// `ping` still works: refused a raw socket with EPERM it opens an ICMP datagram socket
/// (the agent opens `net.ipv4.ping_group_range` to the sandbox's groups), which netfilter
/// sees.
pub fn socket_rules() -> Result<Vec<SeccompRule>, Error> {
    let family = |value: libc::c_int| arg0(SeccompCmpOp::Eq, value as u64);
    let not_family = |value: libc::c_int| arg0(SeccompCmpOp::Ne, value as u64);
    let sock_type = |value: u64| arg(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), value);
    Ok(vec![
        SeccompRule::new(vec![family(libc::AF_PACKET)?])?,
        SeccompRule::new(vec![family(libc::AF_VSOCK)?])?,
        SeccompRule::new(vec![sock_type(SOCK_PACKET)?])?,
        SeccompRule::new(vec![
            sock_type(libc::SOCK_RAW as u64)?,
            not_family(libc::AF_NETLINK)?,
            not_family(libc::AF_UNIX)?,
        ])?,
    ])
}

/// The EPERM filter: the list above, personality other than Linux / Linux32 / query
/// (other personalities change the address-space layout, e.g. READ_IMPLIES_EXEC), unshare
/// or clone asking for a new user namespace (which would hand a process a fresh full
/// capability set; clone's flags are arg0 on x86_64 and aarch64 alike), and the sockets of
/// [`socket_rules`].
fn eperm_filter(arch: TargetArch) -> Result<BpfProgram, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = denied_syscalls()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(vec![
            arg0(SeccompCmpOp::Ne, 0)?,
            arg0(SeccompCmpOp::Ne, 0x0008)?,
            arg0(SeccompCmpOp::Ne, 0xffff_ffff)?,
        ])?],
    );
    let newuser = libc::CLONE_NEWUSER as u64;
    for nr in [libc::SYS_unshare, libc::SYS_clone] {
        let rule = SeccompRule::new(vec![arg0(SeccompCmpOp::MaskedEq(newuser), newuser)?])?;
        rules.insert(nr, vec![rule]);
    }
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        rules.insert(nr, socket_rules()?);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// clone3 passes its flags in memory, where a filter cannot look; ENOSYS makes libc fall
/// back to clone, whose flags the EPERM filter checks (Docker does the same).
pub(crate) fn clone3_filter(arch: TargetArch) -> Result<BpfProgram, Error> {
    let rules = BTreeMap::from([(libc::SYS_clone3, Vec::new())]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// On x86_64, x32 syscalls carry the x86_64 audit arch with bit 30 set in the number, so
/// the exact-number filters above would not see `mount` called that way on a kernel with
/// x32 enabled: all of them fail with ENOSYS, as on a kernel without x32. (Other audit
/// arches, i386 included, are killed by seccompiler's arch check.)
#[cfg(target_arch = "x86_64")]
pub(crate) fn x32_filter() -> BpfProgram {
    use seccompiler::sock_filter;
    const X32_SYSCALL_BIT: u32 = 0x4000_0000;
    let op = |code: u32| code as u16;
    vec![
        // A = seccomp_data.nr
        sock_filter {
            code: op(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS),
            jt: 0,
            jf: 0,
            k: 0,
        },
        sock_filter {
            code: op(libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K),
            jt: 0,
            jf: 1,
            k: X32_SYSCALL_BIT,
        },
        sock_filter {
            code: op(libc::BPF_RET | libc::BPF_K),
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
        },
        sock_filter {
            code: op(libc::BPF_RET | libc::BPF_K),
            jt: 0,
            jf: 0,
            k: libc::SECCOMP_RET_ALLOW,
        },
    ]
}

/// The filters for this machine's architecture, in the order they are installed.
pub fn programs() -> Result<Vec<BpfProgram>, Error> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let programs = vec![eperm_filter(arch)?, clone3_filter(arch)?];
    #[cfg(target_arch = "x86_64")]
    let programs = [programs, vec![x32_filter()]].concat();
    Ok(programs)
}

/// Installs [`programs`] on the calling thread (call it while the process has one thread);
/// every thread and exec after inherits them. Set no_new_privs first. Returns how many
/// syscalls fail outright.
pub fn install() -> Result<usize, Error> {
    for program in &programs()? {
        seccompiler::apply_filter(program)?;
    }
    Ok(denied_syscalls().len())
}

/// A program as the kernel's `struct sock_filter` array, the bytes bwrap reads from a
/// `--add-seccomp-fd`.
pub fn to_bytes(program: &BpfProgram) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(program.len() * 8);
    for instruction in program {
        bytes.extend_from_slice(&instruction.code.to_ne_bytes());
        bytes.push(instruction.jt);
        bytes.push(instruction.jf);
        bytes.extend_from_slice(&instruction.k.to_ne_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_this_arch() {
        let programs = programs().expect("filters");
        assert!(programs.iter().all(|p| !p.is_empty()));
        let bytes = to_bytes(&programs[0]);
        assert_eq!(bytes.len(), programs[0].len() * 8);
    }

    /// What `call` got in a forked child, with the filters installed or not: `Ok` or the
    /// errno. The child only makes system calls (the programs are built before the fork).
    fn in_child(filtered: bool, call: &dyn Fn() -> libc::c_long) -> Result<(), i32> {
        let programs = programs().expect("filters");
        // SAFETY: the child makes system calls only (apply_filter allocates nothing) and
        // leaves with _exit, never returning into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            if filtered
                && programs
                    .iter()
                    .any(|p| seccompiler::apply_filter(p).is_err())
            {
                // SAFETY: ends the child at once.
                unsafe { libc::_exit(255) };
            }
            let code = if call() >= 0 { 0 } else { errno() };
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(code.min(254)) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child; `status` is a valid out pointer.
        let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(waited, pid);
        assert!(libc::WIFEXITED(status), "the child died: {status:#x}");
        match libc::WEXITSTATUS(status) {
            0 => Ok(()),
            255 => panic!("the child could not install the filters"),
            e => Err(e),
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    fn socket(family: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> libc::c_long {
        // SAFETY: plain integer arguments; the descriptor dies with the child.
        unsafe { libc::socket(family, kind, protocol) as libc::c_long }
    }

    fn socketpair(family: libc::c_int, kind: libc::c_int) -> libc::c_long {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a valid out array of two descriptors.
        unsafe { libc::socketpair(family, kind, 0, fds.as_mut_ptr()) as libc::c_long }
    }

    const SOCK_PACKET: libc::c_int = super::SOCK_PACKET as libc::c_int;
    const FLAGS: libc::c_int = libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;

    /// Each refused call fails with EPERM under the filters. Unfiltered, as root, the same
    /// calls work (or fail otherwise): the control shows the refusal is the filter's.
    #[test]
    fn packet_raw_and_vsock_sockets_fail_with_eperm() {
        use libc::{AF_INET, AF_INET6, AF_PACKET, AF_VSOCK, SOCK_DGRAM, SOCK_RAW, SOCK_STREAM};
        let calls: [(&str, &dyn Fn() -> libc::c_long); 11] = [
            ("AF_PACKET SOCK_RAW", &|| {
                socket(AF_PACKET, SOCK_RAW, 0x0300)
            }),
            ("AF_PACKET SOCK_DGRAM|flags", &|| {
                socket(AF_PACKET, SOCK_DGRAM | FLAGS, 0x0300)
            }),
            ("AF_INET SOCK_RAW TCP", &|| {
                socket(AF_INET, SOCK_RAW, libc::IPPROTO_TCP)
            }),
            ("AF_INET SOCK_RAW|flags ICMP", &|| {
                socket(AF_INET, SOCK_RAW | FLAGS, libc::IPPROTO_ICMP)
            }),
            ("AF_INET6 SOCK_RAW|SOCK_CLOEXEC", &|| {
                socket(AF_INET6, SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW)
            }),
            ("AF_INET SOCK_PACKET", &|| {
                socket(AF_INET, SOCK_PACKET, 0x0300)
            }),
            ("AF_VSOCK SOCK_STREAM", &|| socket(AF_VSOCK, SOCK_STREAM, 0)),
            ("AF_VSOCK SOCK_DGRAM|flags", &|| {
                socket(AF_VSOCK, SOCK_DGRAM | FLAGS, 0)
            }),
            ("socketpair AF_PACKET", &|| socketpair(AF_PACKET, SOCK_RAW)),
            ("socketpair AF_VSOCK", &|| socketpair(AF_VSOCK, SOCK_STREAM)),
            ("socketpair AF_INET SOCK_RAW", &|| {
                socketpair(AF_INET, SOCK_RAW)
            }),
        ];
        let root = euid() == 0;
        for (name, call) in calls {
            assert_eq!(in_child(true, call), Err(libc::EPERM), "{name}");
            let control = in_child(false, call);
            println!("{name}: unfiltered {control:?}");
            if root && name.starts_with("AF_") && !name.starts_with("AF_VSOCK") {
                assert_eq!(control, Ok(()), "{name} works unfiltered as root");
            }
        }
    }

    /// The sockets ordinary programs need still open: TCP, UDP, unix pairs, netlink's
    /// "raw" sockets (getaddrinfo, getifaddrs, `ip`) and a unix SOCK_RAW (a datagram one).
    #[test]
    fn ordinary_sockets_still_open() {
        use libc::{AF_INET, AF_INET6, AF_NETLINK, AF_UNIX, SOCK_DGRAM, SOCK_RAW, SOCK_STREAM};
        let calls: [(&str, &dyn Fn() -> libc::c_long); 7] = [
            ("AF_INET SOCK_STREAM", &|| {
                socket(AF_INET, SOCK_STREAM | FLAGS, 0)
            }),
            ("AF_INET6 SOCK_DGRAM", &|| socket(AF_INET6, SOCK_DGRAM, 0)),
            ("AF_UNIX SOCK_STREAM", &|| socket(AF_UNIX, SOCK_STREAM, 0)),
            ("AF_UNIX SOCK_RAW", &|| socket(AF_UNIX, SOCK_RAW, 0)),
            ("AF_NETLINK SOCK_RAW|SOCK_CLOEXEC", &|| {
                socket(
                    AF_NETLINK,
                    SOCK_RAW | libc::SOCK_CLOEXEC,
                    libc::NETLINK_ROUTE,
                )
            }),
            ("AF_NETLINK SOCK_DGRAM", &|| {
                socket(AF_NETLINK, SOCK_DGRAM, libc::NETLINK_ROUTE)
            }),
            ("socketpair AF_UNIX", &|| socketpair(AF_UNIX, SOCK_STREAM)),
        ];
        for (name, call) in calls {
            assert_eq!(in_child(true, call), Ok(()), "{name}");
        }
        // An ICMP datagram socket (unprivileged ping) gets past the filter: whatever the
        // kernel answers (EACCES where ping_group_range excludes us), it is what it answers
        // unfiltered.
        let ping = || socket(AF_INET, SOCK_DGRAM, libc::IPPROTO_ICMP);
        assert_eq!(in_child(true, &ping), in_child(false, &ping));
    }

    #[test]
    fn io_uring_fails_with_eperm() {
        let mut params = [0u8; 120];
        let params = params.as_mut_ptr() as libc::c_long;
        // SAFETY: io_uring_setup writes at most its 120-byte params struct, valid here.
        let setup = move || unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params) };
        // SAFETY: bad descriptors and null pointers only: the kernel answers with an error.
        let enter = || unsafe { libc::syscall(libc::SYS_io_uring_enter, -1, 0, 0, 0, 0, 0) };
        // SAFETY: as above.
        let register = || unsafe { libc::syscall(libc::SYS_io_uring_register, -1, 0, 0, 0) };
        assert_eq!(in_child(true, &setup), Err(libc::EPERM), "io_uring_setup");
        assert_eq!(in_child(true, &enter), Err(libc::EPERM), "io_uring_enter");
        assert_eq!(
            in_child(true, &register),
            Err(libc::EPERM),
            "io_uring_register"
        );
        // The control: unfiltered, enter and register reach the kernel (EBADF).
        assert_eq!(in_child(false, &enter), Err(libc::EBADF));
        println!("io_uring_setup unfiltered: {:?}", in_child(false, &setup));
    }

    fn euid() -> libc::uid_t {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() }
    }
}
