//! Every system call the agent makes through libc, with its safety argument.
//! Everything else in the crate is safe code, but for the lock-down of `--confine`
//! (confine.rs), which keeps its mount, prctl and capset calls next to their reasons.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The signals the agent handles itself (in one thread, with `sigwait`).
const HANDLED: [libc::c_int; 3] = [libc::SIGCHLD, libc::SIGTERM, libc::SIGINT];

fn handled_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, exclusively borrowed sigset_t.
    unsafe { libc::sigemptyset(&mut set) };
    for sig in HANDLED {
        // SAFETY: as above; `sig` is a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    set
}

/// Blocks the handled signals in the calling thread; threads spawned later inherit the
/// mask. Children get an empty mask back from std's spawn.
pub fn block_handled_signals() -> io::Result<()> {
    let set = handled_set();
    // SAFETY: `set` is initialised; a null old-set pointer is allowed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for one of the handled signals, at most `limit` when given: `None` when it passed
/// without one.
pub fn wait_signal(limit: Option<std::time::Duration>) -> io::Result<Option<libc::c_int>> {
    let set = handled_set();
    let Some(limit) = limit else {
        let mut sig: libc::c_int = 0;
        // SAFETY: `set` is initialised and `sig` is a valid out pointer.
        let rc = unsafe { libc::sigwait(&set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        return Ok(Some(sig));
    };
    let timeout = libc::timespec {
        tv_sec: limit.as_secs().try_into().unwrap_or(libc::time_t::MAX),
        tv_nsec: limit.subsec_nanos().into(),
    };
    // SAFETY: `set` and `timeout` are initialised; a null siginfo pointer is allowed.
    let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &timeout) };
    if sig < 0 {
        let error = io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(error),
        };
    }
    Ok(Some(sig))
}

/// Reaps one exited child without blocking: `Some((pid, raw status))`, or `None` when no
/// child has exited (or there are no children).
pub fn reap_any() -> Option<(libc::pid_t, libc::c_int)> {
    let mut status: libc::c_int = 0;
    // SAFETY: `status` is a valid out pointer; WNOHANG never blocks.
    let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    (pid > 0).then_some((pid, status))
}

/// Sends `sig` to every process of group `pgid`. Errors (group gone) are ignored.
pub fn kill_group(pgid: libc::pid_t, sig: libc::c_int) {
    if pgid > 1 {
        // SAFETY: kill has no memory effects; pgid > 1 never targets "every process".
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// Makes orphaned descendants reparent to us, so we reap them even when not PID 1.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes one integer argument.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Tries to take the agent out of the OOM killer's choices (`oom_score_adj` -1000): works
/// where the agent holds CAP_SYS_RESOURCE (a VM's PID 1), not in a user namespace.
pub fn avoid_oom_killer() -> io::Result<()> {
    std::fs::write("/proc/self/oom_score_adj", "-1000")
}

/// Makes the agent non-dumpable: no process of the sandbox (none holds CAP_SYS_PTRACE) may
/// then open its `/proc/1/fd/*`, `/proc/1/mem` or `/proc/1/environ`, nor ptrace it. Its
/// children are dumpable again once they exec.
pub fn make_non_dumpable() -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes one integer argument and has no memory effects.
    let rc = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Points descriptor `target` (0, 1) at `file`, closing what it was.
pub fn redirect(target: RawFd, file: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: dup2 only changes the descriptor table; both descriptors are valid for the call.
    let rc = unsafe { libc::dup2(file.as_raw_fd(), target) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A close-on-exec, non-blocking pipe: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Writes one byte, ignoring a full pipe (a wake-up is already pending then).
pub fn write_byte(fd: &OwnedFd) {
    let byte = 1u8;
    // SAFETY: the buffer is one valid byte; the fd is open for the borrow's duration.
    unsafe { libc::write(fd.as_raw_fd(), (&byte as *const u8).cast(), 1) };
}

/// Reads and discards everything pending on a non-blocking fd.
pub fn drain(fd: &OwnedFd) {
    let mut buf = [0u8; 64];
    loop {
        // SAFETY: `buf` is valid for its length; the fd is open for the borrow's duration.
        let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return;
        }
    }
}

/// Polls `fds` for readability (or hang-up). Returns, per fd, whether it is ready.
/// `timeout_ms` < 0 waits forever. EINTR counts as "nothing ready".
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structs.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(err);
    }
    Ok(pfds.iter().map(|p| p.revents != 0).collect())
}

/// Connects a stream socket to the host over vsock (CID 2).
pub fn vsock_connect(port: u32) -> io::Result<OwnedFd> {
    const HOST_CID: u32 = 2;
    // SAFETY: plain socket creation; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: socket succeeded, so `fd` is open and ours alone.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_vm is plain data; all-zero is a valid starting value.
    let mut addr: libc::sockaddr_vm = unsafe { std::mem::zeroed() };
    addr.svm_family = libc::AF_VSOCK as libc::sa_family_t;
    addr.svm_cid = HOST_CID;
    addr.svm_port = port;
    // SAFETY: `addr` is a valid sockaddr_vm and the length passed is its size.
    let rc = unsafe {
        libc::connect(
            owned.as_raw_fd(),
            (&addr as *const libc::sockaddr_vm).cast(),
            std::mem::size_of::<libc::sockaddr_vm>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// Asks for a larger pipe buffer (fewer wake-ups when a program prints a lot).
/// Best effort: the kernel may refuse above `/proc/sys/fs/pipe-max-size`.
pub fn grow_pipe(fd: RawFd, bytes: usize) {
    let size = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_SETPIPE_SZ takes an int and has no memory effects; a bad fd only errors.
    unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, size) };
}

/// Makes sure the sandbox can open pseudo-terminals: mounts a devpts instance of its own at
/// `/dev/pts` (every user may open its `ptmx`; new terminals are the opener's, mode 0620)
/// when none is there, and points `/dev/ptmx` at it when `/dev` has no `ptmx`. For a
/// microVM, where the agent is the init's only workload; a bwrap sandbox has them from
/// `--dev`. Returns whether it mounted one.
pub fn ensure_devpts() -> io::Result<bool> {
    if std::path::Path::new("/dev/pts/ptmx").exists() {
        return Ok(false);
    }
    match std::fs::create_dir("/dev/pts") {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    const SOURCE: &[u8] = b"devpts\0";
    const TARGET: &[u8] = b"/dev/pts\0";
    const OPTIONS: &[u8] = b"newinstance,ptmxmode=0666,mode=0620\0";
    // SAFETY: NUL-terminated strings; mount has no memory effects on the caller.
    let rc = unsafe {
        libc::mount(
            SOURCE.as_ptr().cast(),
            TARGET.as_ptr().cast(),
            SOURCE.as_ptr().cast(),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            OPTIONS.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    if std::fs::symlink_metadata("/dev/ptmx").is_err() {
        std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx")?;
    }
    Ok(true)
}
