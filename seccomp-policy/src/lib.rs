//! The seccomp filters of a sandbox's processes, written once: the agent installs them on
//! itself before it serves (`--confine`), and the bwrap launcher hands them to the jails of
//! an ordinary-user worker's disk daemons (bwrap's `--add-seccomp-fd`). Every syscall on the
//! list fails with EPERM, new user namespaces too; clone3 fails with ENOSYS (libc falls back
//! to clone, whose flags a filter can read); x32 syscalls fail with ENOSYS.

use std::collections::BTreeMap;

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
}

/// Kernel interfaces a container has no use for: module and kexec loading, bpf, perf,
/// the keyring (not namespaced), userfaultfd, file handles (escape a bind mount), every
/// mount API, swap, reboot, accounting, the kernel log, port I/O, quotas, joining other
/// namespaces and writing other processes' memory. They fail with EPERM.
pub fn denied_syscalls() -> Vec<libc::c_long> {
    let mut list = vec![
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
    ];
    // Port I/O exists on x86 only.
    #[cfg(target_arch = "x86_64")]
    list.extend([libc::SYS_iopl, libc::SYS_ioperm]);
    list
}

fn arg0(op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, Error> {
    Ok(SeccompCondition::new(
        0,
        SeccompCmpArgLen::Dword,
        op,
        value,
    )?)
}

/// The EPERM filter: the list above, personality other than Linux / Linux32 / query
/// (other personalities change the address-space layout, e.g. READ_IMPLIES_EXEC), and
/// unshare or clone asking for a new user namespace (which would hand a process a fresh
/// full capability set; clone's flags are arg0 on x86_64 and aarch64 alike).
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
fn clone3_filter(arch: TargetArch) -> Result<BpfProgram, Error> {
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
fn x32_filter() -> BpfProgram {
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
    let mut programs = vec![eperm_filter(arch)?, clone3_filter(arch)?];
    #[cfg(target_arch = "x86_64")]
    programs.push(x32_filter());
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
}
