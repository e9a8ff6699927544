//! pasta's filter, installed by its starter just before the exec: pasta parses every frame a
//! guest sends, in the host's network namespace, so it runs from its first instruction under
//! an allowlist of the system calls it makes, with no_new_privs. pasta installs its own,
//! tighter filter once it has set itself up (the kernel runs both: the stricter verdict
//! wins); this one also covers that set-up, and stays whatever pasta's own build allows.
//!
//! How the list was made: the `#syscalls` annotations of passt's sources (its own filter, for
//! what it does once running: the tap, the host's sockets, spliced connections of forwarded
//! ports, ICMP echo through ping sockets), and `strace -f` of every pasta started by the
//! network, boundary and host-address end-to-end suites (downloads, DNS, refusals, worker
//! VMs' networks) for its set-up: the exec and the loader, joining the sandbox's user and
//! network namespaces, configuring the namespace's link over netlink, and its own isolation
//! (a mount namespace of its own, pivoted into an empty tmpfs, capabilities dropped).
//!
//! Anything else fails with EPERM rather than killing pasta: a system call pasta makes on a
//! path the measurement missed fails that one operation, not every connection of the
//! sandbox. Left out: `ptrace`, `bpf`, `io_uring`, `process_vm_*`, module and keyring calls,
//! every other way to start a program (`execveat`, `fork` and `vfork`; `clone` is what pasta
//! joins a namespace with, and makes no namespace), a new user or network namespace
//! (`unshare` of a mount, UTS and IPC namespace only; `setns` into a user or network
//! namespace only), and sockets of any kind but those it opens: inet stream and datagram
//! (ICMP echo is an inet datagram socket), netlink, and unix datagram (the system log):
//! never raw IP nor packet sockets.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpOp, SeccompFilter, SeccompRule, TargetArch,
};

use crate::{arg, arg0, Error, SOCK_TYPE_MASK};

/// Every system call pasta may make without conditions.
pub fn allowed_syscalls() -> Vec<libc::c_long> {
    let list = vec![
        // The exec itself, the loader and libc's start.
        libc::SYS_execve,
        libc::SYS_brk,
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_set_tid_address,
        libc::SYS_set_robust_list,
        libc::SYS_rseq,
        libc::SYS_prlimit64,
        libc::SYS_getrandom,
        libc::SYS_openat,
        libc::SYS_newfstatat,
        libc::SYS_pread64,
        libc::SYS_read,
        libc::SYS_close,
        // Its set-up: the sandbox's namespaces joined (`setns`, below), its own isolation
        // (`unshare`, below), its ids and capabilities.
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chdir,
        libc::SYS_capget,
        libc::SYS_capset,
        libc::SYS_prctl,
        libc::SYS_setuid,
        libc::SYS_setgid,
        libc::SYS_setgroups,
        libc::SYS_getuid,
        libc::SYS_getgid,
        libc::SYS_geteuid,
        libc::SYS_getegid,
        libc::SYS_getpid,
        // Joining the namespace for a moment: a child sharing its memory (`clone`, below),
        // waited for.
        libc::SYS_waitid,
        libc::SYS_wait4,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_restart_syscall,
        // Its event loop, timers and the namespace's resolv.conf watch.
        libc::SYS_epoll_create1,
        libc::SYS_epoll_ctl,
        libc::SYS_epoll_wait,
        libc::SYS_epoll_pwait,
        libc::SYS_timerfd_create,
        libc::SYS_timerfd_settime,
        libc::SYS_timerfd_gettime,
        libc::SYS_clock_gettime,
        libc::SYS_inotify_init1,
        libc::SYS_inotify_add_watch,
        // The tap and the host's sockets.
        libc::SYS_ioctl,
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_lseek,
        libc::SYS_ftruncate,
        libc::SYS_fcntl,
        libc::SYS_dup2,
        libc::SYS_bind,
        libc::SYS_connect,
        libc::SYS_listen,
        libc::SYS_accept,
        libc::SYS_accept4,
        libc::SYS_shutdown,
        libc::SYS_getsockname,
        libc::SYS_getsockopt,
        libc::SYS_setsockopt,
        libc::SYS_sendto,
        libc::SYS_sendmsg,
        libc::SYS_sendmmsg,
        libc::SYS_recvfrom,
        libc::SYS_recvmsg,
        libc::SYS_recvmmsg,
        // Spliced connections of forwarded ports.
        libc::SYS_pipe2,
        libc::SYS_splice,
    ];
    // The older x86_64 entries glibc still uses there.
    #[cfg(target_arch = "x86_64")]
    let list = [
        list,
        vec![
            libc::SYS_arch_prctl,
            libc::SYS_access,
            libc::SYS_readlink,
            libc::SYS_poll,
            libc::SYS_pipe,
        ],
    ]
    .concat();
    list
}

/// `socket` for the families and types pasta opens.
fn socket_rules() -> Result<Vec<SeccompRule>, Error> {
    let mut rules = Vec::new();
    for (family, kinds) in [
        (libc::AF_INET, &[libc::SOCK_STREAM, libc::SOCK_DGRAM][..]),
        (libc::AF_INET6, &[libc::SOCK_STREAM, libc::SOCK_DGRAM]),
        (libc::AF_NETLINK, &[libc::SOCK_RAW, libc::SOCK_DGRAM]),
        (libc::AF_UNIX, &[libc::SOCK_DGRAM]),
    ] {
        for kind in kinds {
            rules.push(SeccompRule::new(vec![
                arg0(SeccompCmpOp::Eq, family as u64)?,
                arg(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), *kind as u64)?,
            ])?);
        }
    }
    Ok(rules)
}

/// Every namespace kind a `clone` or `unshare` flag makes.
const NEW_NAMESPACES: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// `clone` making no namespace (pasta's child that joins the sandbox's network namespace
/// shares its memory and makes none; clone's flags are arg0 on x86_64 and aarch64 alike).
fn clone_rules() -> Result<Vec<SeccompRule>, Error> {
    Ok(vec![SeccompRule::new(vec![arg0(
        SeccompCmpOp::MaskedEq(NEW_NAMESPACES),
        0,
    )?])?])
}

/// `unshare` of pasta's own isolation only: a mount, UTS and IPC namespace, never a user or
/// network namespace (a new user namespace would give it every capability again).
fn unshare_rules() -> Result<Vec<SeccompRule>, Error> {
    let allowed = (libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC) as u64;
    Ok(vec![SeccompRule::new(vec![arg0(
        SeccompCmpOp::MaskedEq(NEW_NAMESPACES & !allowed),
        0,
    )?])?])
}

/// `setns` into the sandbox's user and network namespaces, named by kind (never 0, "any").
fn setns_rules() -> Result<Vec<SeccompRule>, Error> {
    [libc::CLONE_NEWUSER, libc::CLONE_NEWNET]
        .into_iter()
        .map(|kind| {
            Ok(SeccompRule::new(vec![arg(
                1,
                SeccompCmpOp::Eq,
                kind as u64,
            )?])?)
        })
        .collect()
}

fn allowlist(arch: TargetArch) -> Result<BpfProgram, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_syscalls()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    rules.insert(libc::SYS_socket, socket_rules()?);
    rules.insert(libc::SYS_clone, clone_rules()?);
    rules.insert(libc::SYS_unshare, unshare_rules()?);
    rules.insert(libc::SYS_setns, setns_rules()?);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// pasta's filter for this machine's architecture.
pub fn pasta_program() -> Result<BpfProgram, Error> {
    allowlist(TargetArch::try_from(std::env::consts::ARCH)?)
}

/// Installs [`pasta_program`] on the calling thread (pasta's starter, single-threaded, just
/// before it execs pasta), after setting no_new_privs. Build the program first with
/// [`pasta_program`] where allocating after the install matters.
pub fn install_pasta(program: &BpfProgram) -> Result<(), Error> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(Error::NoNewPrivs(std::io::Error::last_os_error()));
    }
    seccompiler::apply_filter(program)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pastas_filter_compiles_and_leaves_out_what_pasta_never_needs() {
        assert!(!pasta_program().expect("the filter").is_empty());
        let allowed = allowed_syscalls();
        for forbidden in [
            libc::SYS_execveat,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_clone3,
            libc::SYS_ptrace,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
            libc::SYS_process_vm_writev,
            libc::SYS_open_by_handle_at,
            libc::SYS_init_module,
            libc::SYS_keyctl,
            libc::SYS_socketpair,
        ] {
            assert!(!allowed.contains(&forbidden), "{forbidden} is allowed");
        }
    }

    /// What `call` returned in a forked child under pasta's filter: its result, or the errno
    /// it failed with (as a negative number).
    fn in_filtered_child(call: fn() -> libc::c_long) -> libc::c_long {
        let program = pasta_program().expect("the filter");
        let mut pipe = [0; 2];
        // SAFETY: pipe writes two descriptors into the array it is given.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: the child makes system calls only (the program is built before the fork)
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let result = match install_pasta(&program) {
                Ok(()) => match call() {
                    -1 => -i64::from(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)),
                    other => other,
                },
                Err(_) => i64::MIN,
            };
            let bytes = result.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live array to the pipe, then ends the child.
            unsafe {
                libc::write(pipe[1], bytes.as_ptr().cast(), bytes.len());
                libc::_exit(0)
            }
        }
        let mut bytes = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a live array; closes our descriptors and reaps
        // the child.
        unsafe {
            libc::close(pipe[1]);
            libc::read(pipe[0], bytes.as_mut_ptr().cast(), bytes.len());
            libc::close(pipe[0]);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        i64::from_ne_bytes(bytes)
    }

    fn socket(family: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> libc::c_long {
        // SAFETY: socket takes integer arguments; a descriptor made is left to the child's
        // exit.
        unsafe { libc::socket(family, kind, protocol).into() }
    }

    #[test]
    fn pasta_gets_its_sockets_and_nothing_raw_or_outside_its_list() {
        let tcp = in_filtered_child(|| {
            socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0)
        });
        assert!(tcp >= 0, "{tcp}");
        let ping =
            in_filtered_child(|| socket(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP));
        // A ping socket may be refused by the host's ping_group_range, never by the filter.
        assert_ne!(ping, -i64::from(libc::EPERM), "{ping}");
        let netlink =
            in_filtered_child(|| socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0));
        assert!(netlink >= 0, "{netlink}");
        // Each of these succeeds for root without the filter.
        let raw = in_filtered_child(|| socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_TCP));
        assert_eq!(raw, -i64::from(libc::EPERM));
        let packet = in_filtered_child(|| socket(libc::AF_PACKET, libc::SOCK_DGRAM, 0));
        assert_eq!(packet, -i64::from(libc::EPERM));
        let ptrace = in_filtered_child(|| {
            // SAFETY: PTRACE_TRACEME takes no pointer.
            unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) }
        });
        assert_eq!(ptrace, -i64::from(libc::EPERM));
        // pasta's own isolation passes; a new user or network namespace does not.
        let own = in_filtered_child(|| {
            // SAFETY: unshare takes integer flags.
            unsafe {
                libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC).into()
            }
        });
        assert_eq!(own, 0);
        for flags in [
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWNS | libc::CLONE_NEWPID,
        ] {
            let call = match flags {
                libc::CLONE_NEWUSER => || {
                    // SAFETY: unshare takes integer flags.
                    unsafe { libc::unshare(libc::CLONE_NEWUSER).into() }
                },
                libc::CLONE_NEWNET => || {
                    // SAFETY: unshare takes integer flags.
                    unsafe { libc::unshare(libc::CLONE_NEWNET).into() }
                },
                _ => || {
                    // SAFETY: unshare takes integer flags.
                    unsafe { libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWPID).into() }
                },
            };
            assert_eq!(
                in_filtered_child(call),
                -i64::from(libc::EPERM),
                "{flags:#x}"
            );
        }
        // setns by kind: "any namespace" (0) is refused before the kernel looks at the fd.
        let any = in_filtered_child(|| {
            // SAFETY: setns on a descriptor that is not a namespace fails; integer arguments.
            unsafe { libc::setns(0, 0).into() }
        });
        assert_eq!(any, -i64::from(libc::EPERM));
        let net = in_filtered_child(|| {
            // SAFETY: as above; stdin is no namespace, so the kernel says EINVAL.
            unsafe { libc::setns(0, libc::CLONE_NEWNET).into() }
        });
        assert_eq!(net, -i64::from(libc::EINVAL));
    }
}
