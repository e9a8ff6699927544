//! The VM runner's filter: an allowlist of the system calls libkrun makes once the VM runs
//! (its vCPU threads, its virtio-fs, vsock/TSI, block, console and balloon devices, and the
//! Rust and glibc runtime under them). Anything else kills the runner: a VMM that makes a
//! system call libkrun never makes is not libkrun any more (Firecracker's default action
//! too), and the kernel logs the number (`audit: type=1326 ... syscall=N`), which is how a
//! missing entry shows.
//!
//! How the list was made: from libkrun 1.19.7's sources (every `libc::` call of its Linux
//! devices, vmm and utils crates, and the nix socket calls of its vsock and TSI code), then
//! run under the VM lab's whole libkrun suite (sandboxes with and without network, worker
//! VMs with their disks and mounts, the escape test) with this filter in force.
//!
//! Left out on purpose: `execve` and every way to start a process (`clone` only makes
//! threads, `clone3` fails with ENOSYS so glibc uses `clone`), `mount` and the other
//! namespace and mount calls (the runner has its root before: `own_root.rs`), `ptrace`,
//! `bpf`, `io_uring`, raw and packet sockets (TSI opens inet stream and datagram sockets for
//! the guest, vsock bridges unix ones).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpOp, SeccompFilter, SeccompRule, TargetArch,
};

use crate::{arg, arg0, clone3_filter, Error, SOCK_TYPE_MASK};

/// Every system call the runner may make without conditions once the VM runs.
pub fn allowed_syscalls() -> Vec<libc::c_long> {
    let list = vec![
        // Memory: guest memory, thread stacks, the allocator.
        libc::SYS_mmap,
        libc::SYS_munmap,
        libc::SYS_mprotect,
        libc::SYS_madvise,
        libc::SYS_mremap,
        libc::SYS_brk,
        libc::SYS_memfd_create,
        libc::SYS_mincore,
        // Threads, their synchronisation and signals (vCPUs are kicked with a signal).
        libc::SYS_futex,
        libc::SYS_set_robust_list,
        libc::SYS_rseq,
        libc::SYS_sched_yield,
        libc::SYS_sched_getaffinity,
        libc::SYS_sched_setaffinity,
        libc::SYS_gettid,
        libc::SYS_getpid,
        libc::SYS_tgkill,
        libc::SYS_tkill,
        libc::SYS_rt_sigaction,
        libc::SYS_rt_sigprocmask,
        libc::SYS_rt_sigreturn,
        libc::SYS_sigaltstack,
        libc::SYS_exit,
        libc::SYS_exit_group,
        libc::SYS_restart_syscall,
        libc::SYS_prctl,
        libc::SYS_getrandom,
        libc::SYS_membarrier,
        // Time.
        libc::SYS_nanosleep,
        libc::SYS_clock_nanosleep,
        libc::SYS_clock_gettime,
        libc::SYS_clock_getres,
        libc::SYS_gettimeofday,
        // Event loops: epoll, eventfds, timers, pipes.
        libc::SYS_epoll_create1,
        libc::SYS_epoll_ctl,
        libc::SYS_epoll_pwait,
        libc::SYS_eventfd2,
        libc::SYS_timerfd_create,
        libc::SYS_timerfd_settime,
        libc::SYS_timerfd_gettime,
        libc::SYS_pipe2,
        libc::SYS_ppoll,
        // Descriptors and I/O (virtio-fs, block, console, sockets).
        libc::SYS_read,
        libc::SYS_write,
        libc::SYS_readv,
        libc::SYS_writev,
        libc::SYS_pread64,
        libc::SYS_pwrite64,
        libc::SYS_preadv,
        libc::SYS_pwritev,
        libc::SYS_preadv2,
        libc::SYS_pwritev2,
        libc::SYS_close,
        libc::SYS_dup,
        libc::SYS_dup3,
        libc::SYS_fcntl,
        libc::SYS_ioctl,
        libc::SYS_lseek,
        libc::SYS_copy_file_range,
        libc::SYS_sendfile,
        libc::SYS_fallocate,
        libc::SYS_ftruncate,
        libc::SYS_fsync,
        libc::SYS_fdatasync,
        // virtio-fs: the guest's file operations on its shares.
        libc::SYS_openat,
        libc::SYS_fstat,
        libc::SYS_newfstatat,
        libc::SYS_statx,
        libc::SYS_fstatfs,
        libc::SYS_statfs,
        libc::SYS_getdents64,
        libc::SYS_mkdirat,
        libc::SYS_mknodat,
        libc::SYS_unlinkat,
        libc::SYS_renameat2,
        libc::SYS_linkat,
        libc::SYS_symlinkat,
        libc::SYS_readlinkat,
        libc::SYS_faccessat,
        libc::SYS_faccessat2,
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_utimensat,
        libc::SYS_fgetxattr,
        libc::SYS_fsetxattr,
        libc::SYS_flistxattr,
        libc::SYS_fremovexattr,
        libc::SYS_getxattr,
        libc::SYS_setxattr,
        libc::SYS_listxattr,
        libc::SYS_removexattr,
        libc::SYS_lgetxattr,
        libc::SYS_lsetxattr,
        libc::SYS_llistxattr,
        libc::SYS_lremovexattr,
        libc::SYS_umask,
        // virtio-fs makes a file as the guest's caller (per thread), then returns.
        libc::SYS_setresuid,
        libc::SYS_setresgid,
        libc::SYS_getuid,
        libc::SYS_geteuid,
        libc::SYS_getgid,
        libc::SYS_getegid,
        libc::SYS_capget,
        libc::SYS_capset,
        // TSI and the vsock bridges (which socket: see [`socket_rules`]).
        libc::SYS_bind,
        libc::SYS_connect,
        libc::SYS_listen,
        libc::SYS_accept,
        libc::SYS_accept4,
        libc::SYS_sendmsg,
        libc::SYS_recvmsg,
        libc::SYS_sendto,
        libc::SYS_recvfrom,
        libc::SYS_shutdown,
        libc::SYS_getsockname,
        libc::SYS_getpeername,
        libc::SYS_setsockopt,
        libc::SYS_getsockopt,
        libc::SYS_getrlimit,
        libc::SYS_prlimit64,
        libc::SYS_uname,
    ];
    // The older x86_64 entries glibc and Rust's std still use there.
    #[cfg(target_arch = "x86_64")]
    let list = [
        list,
        vec![
            libc::SYS_arch_prctl,
            libc::SYS_open,
            libc::SYS_stat,
            libc::SYS_lstat,
            libc::SYS_poll,
            libc::SYS_epoll_wait,
            libc::SYS_readlink,
            libc::SYS_unlink,
            libc::SYS_rmdir,
            libc::SYS_mkdir,
            libc::SYS_rename,
            libc::SYS_renameat,
            libc::SYS_symlink,
            libc::SYS_link,
            libc::SYS_chmod,
            libc::SYS_access,
            libc::SYS_getdents,
            libc::SYS_dup2,
            libc::SYS_pipe,
            libc::SYS_eventfd,
            libc::SYS_time,
        ],
    ]
    .concat();
    list
}

/// `socket` and `socketpair` for the families and types libkrun opens: inet stream and
/// datagram sockets for TSI (the guest's own; ICMP echo is an inet datagram socket), unix
/// ones for the vsock bridges. Never raw, packet, netlink or vsock.
fn socket_rules() -> Result<Vec<SeccompRule>, Error> {
    let mut rules = Vec::new();
    for family in [libc::AF_UNIX, libc::AF_INET, libc::AF_INET6] {
        for kind in [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_SEQPACKET] {
            rules.push(SeccompRule::new(vec![
                arg0(SeccompCmpOp::Eq, family as u64)?,
                arg(1, SeccompCmpOp::MaskedEq(SOCK_TYPE_MASK), kind as u64)?,
            ])?);
        }
    }
    Ok(rules)
}

/// `clone` that makes a thread (of this process, sharing its memory): never a new process.
fn thread_only() -> Result<Vec<SeccompRule>, Error> {
    let thread = (libc::CLONE_THREAD | libc::CLONE_VM) as u64;
    Ok(vec![SeccompRule::new(vec![arg0(
        SeccompCmpOp::MaskedEq(thread),
        thread,
    )?])?])
}

fn allowlist(arch: TargetArch) -> Result<BpfProgram, Error> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = allowed_syscalls()
        .into_iter()
        .map(|nr| (nr, Vec::new()))
        .collect();
    rules.insert(libc::SYS_clone, thread_only()?);
    // Allowed here only so that the ENOSYS of `clone3_filter` (stacked, and less severe than
    // a kill) is what glibc sees, and falls back to `clone`.
    rules.insert(libc::SYS_clone3, Vec::new());
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        rules.insert(nr, socket_rules()?);
    }
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch,
    )?;
    Ok(filter.try_into()?)
}

/// The runner's filters for this machine's architecture, in the order they are installed:
/// the allowlist last, as it refuses `seccomp` itself.
pub fn runner_programs() -> Result<Vec<BpfProgram>, Error> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)?;
    let programs = vec![clone3_filter(arch)?, allowlist(arch)?];
    #[cfg(target_arch = "x86_64")]
    let programs = [vec![crate::x32_filter()], programs].concat();
    Ok(programs)
}

/// Installs [`runner_programs`] on every thread of the process (the runner installs them
/// before libkrun starts its own threads, which inherit them), after setting no_new_privs.
/// Returns how many system calls are allowed.
pub fn install_runner() -> Result<usize, Error> {
    let programs = runner_programs()?;
    for program in &programs {
        seccompiler::apply_filter_all_threads(program)?;
    }
    Ok(allowed_syscalls().len() + 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runner_filters_compile_and_allow_no_process_start() {
        let programs = runner_programs().expect("filters");
        assert!(programs.iter().all(|p| !p.is_empty()));
        let allowed = allowed_syscalls();
        for forbidden in [
            libc::SYS_execve,
            libc::SYS_execveat,
            libc::SYS_fork,
            libc::SYS_vfork,
            libc::SYS_mount,
            libc::SYS_unshare,
            libc::SYS_setns,
            libc::SYS_ptrace,
            libc::SYS_bpf,
            libc::SYS_io_uring_setup,
            libc::SYS_open_by_handle_at,
            libc::SYS_process_vm_writev,
        ] {
            assert!(!allowed.contains(&forbidden), "{forbidden} is allowed");
        }
    }

    /// How a forked child that installed the runner's filters ended after `call`: its exit
    /// status (0: the call was allowed) or the signal that killed it.
    fn in_filtered_child(call: &dyn Fn()) -> Result<i32, i32> {
        let programs = runner_programs().expect("filters");
        // SAFETY: the child makes system calls only (the programs are built before the
        // fork, apply_filter allocates nothing) and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: prctl with integer arguments on the child itself.
            unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            for program in &programs {
                if seccompiler::apply_filter(program).is_err() {
                    // SAFETY: ends the forked child.
                    unsafe { libc::_exit(90) };
                }
            }
            call();
            // SAFETY: ends the forked child.
            unsafe { libc::_exit(0) };
        }
        let mut status = 0;
        // SAFETY: waits for the child forked above.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if libc::WIFSIGNALED(status) {
            Err(libc::WTERMSIG(status))
        } else {
            Ok(libc::WEXITSTATUS(status))
        }
    }

    #[test]
    fn exec_a_new_process_or_a_packet_socket_kills_the_runner() {
        let exec = in_filtered_child(&|| {
            let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
            // SAFETY: a NUL-terminated argv of static strings.
            unsafe { libc::execv(c"/bin/true".as_ptr(), argv.as_ptr()) };
        });
        assert_eq!(exec, Err(libc::SIGSYS), "execve must kill");
        let fork = in_filtered_child(&|| {
            // SAFETY: the raw fork syscall; a child (if any) exits at once.
            let pid = unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0) };
            if pid == 0 {
                // SAFETY: ends the forked grandchild.
                unsafe { libc::_exit(0) };
            }
        });
        assert_eq!(fork, Err(libc::SIGSYS), "a process clone must kill");
        let raw = in_filtered_child(&|| {
            // SAFETY: socket takes integers.
            unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
        });
        assert_eq!(raw, Err(libc::SIGSYS), "a packet socket must kill");
        // Threads are proven where the filter is used: every microVM of the VM lab runs
        // under it (a thread made here, after a fork from the test harness, could block on
        // the allocator's lock).
        let inet = in_filtered_child(&|| {
            // SAFETY: socket takes integers.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            let kind = libc::SOCK_DGRAM | libc::SOCK_CLOEXEC;
            // SAFETY: as above.
            let unix = unsafe { libc::socket(libc::AF_UNIX, kind, 0) };
            if fd < 0 || unix < 0 {
                // SAFETY: ends the forked child.
                unsafe { libc::_exit(3) };
            }
        });
        assert_eq!(inet, Ok(0), "inet and unix sockets must open");
    }
}
