//! Starting a program without copying the agent: `clone(CLONE_VM | CLONE_VFORK)` and a
//! child that only makes system calls before `execve`.
//!
//! Why by hand: std's `Command` starts a program with `posix_spawn` (no copy of the parent)
//! only when no `pre_exec` hook is set; with one it falls back to `fork`, which copies the
//! agent's page tables on every exec. Every exec needs three things `posix_spawn` cannot do:
//! die with the agent (`PR_SET_PDEATHSIG`), be the OOM killer's first choice ahead of the
//! agent (`oom_score_adj`), and an empty signal mask. Measured with `cargo bench -p
//! sandbox-agent`: the fork costs about +0.3 ms per exec of `/bin/true`, roughly half of
//! what the agent adds over a host spawn. This does what glibc's `posix_spawn` does (a
//! vfork-style child on its own stack, every handled signal reset before anything can be
//! delivered), with those three steps added.

use std::ffi::{c_int, c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;

/// What to run, prepared in the agent so the child allocates nothing.
pub struct Program {
    /// Paths to try in order (`execvp`'s search, done with the program's own PATH).
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
    workdir: Option<CString>,
}

/// A started program: its pid (also its process group) and, unless it runs on a
/// terminal, the agent's pipe ends.
pub struct Launched {
    pub pid: libc::pid_t,
    pub pipes: Option<Pipes>,
}

pub struct Pipes {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Where the child gave up, with the errno it got.
#[derive(Debug)]
pub enum LaunchError {
    /// The working directory could not be entered.
    Workdir(io::Error),
    /// Nothing ran: the system refused (pipes, clone) or no candidate could be executed.
    Spawn(io::Error),
}

impl Program {
    /// `path` is the PATH the program will see: a name without `/` is looked up there the
    /// way `execvp` does (an empty entry is the working directory). Strings holding a NUL
    /// are refused with `InvalidInput`.
    pub fn new(
        argv: &[String],
        env: &[(String, String)],
        path: &str,
        workdir: Option<&str>,
    ) -> io::Result<Program> {
        let program = argv.first().ok_or_else(|| invalid("argv is empty"))?;
        let candidates = if program.contains('/') {
            vec![c_string(program)?]
        } else {
            path.split(':')
                .map(|dir| match dir {
                    "" => c_string(program),
                    dir => c_string(&format!("{}/{program}", dir.trim_end_matches('/'))),
                })
                .collect::<io::Result<_>>()?
        };
        Ok(Program {
            candidates,
            argv: argv
                .iter()
                .map(|a| c_string(a))
                .collect::<io::Result<_>>()?,
            envp: env
                .iter()
                .map(|(k, v)| c_string(&format!("{k}={v}")))
                .collect::<io::Result<_>>()?,
            workdir: workdir.map(c_string).transpose()?,
        })
    }
}

fn c_string(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| invalid("a string holds a NUL byte"))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// Everything the child reads, and the one thing it writes back.
struct ChildArgs {
    candidates: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    workdir: *const libc::c_char,
    /// The child's ends for its stdin, stdout and stderr, all above 2.
    fds: [c_int; 3],
    /// The three are one terminal's slave: the child starts a session and makes it its
    /// controlling terminal (instead of only a process group of its own).
    terminal: bool,
    /// Written by the child when it gives up: the stage and errno.
    failed_stage: c_int,
    failed_errno: c_int,
}

const STAGE_WORKDIR: c_int = 1;
const STAGE_SETUP: c_int = 2;
const STAGE_EXEC: c_int = 3;

/// The child's stack: the child only makes system calls through libc, so a small one does.
const STACK_SIZE: usize = 64 * 1024;

/// Starts `program` with fresh pipes on its stdin, stdout and stderr, in a process group of
/// its own, dying with the calling thread's process, preferred by the OOM killer, with
/// every signal unblocked and SIGPIPE at its default.
///
/// With `terminal` (a pseudo-terminal's slave, above 2) the program gets it on 0, 1 and 2
/// instead, in a session of its own (its pid is then the session's, and the process
/// group's) with the terminal as its controlling one. The caller closes its copy of the
/// slave once this returns, so the master reads end of file (EIO) when the program's side
/// is closed.
pub fn launch(program: &Program, terminal: Option<&OwnedFd>) -> Result<Launched, LaunchError> {
    let spawn = LaunchError::Spawn;
    let (pipes, fds) = match terminal {
        Some(slave) => (None, [slave.as_raw_fd(); 3]),
        None => {
            let (stdin_read, stdin_write) = pipe().map_err(spawn)?;
            let (stdout_read, stdout_write) = pipe().map_err(spawn)?;
            let (stderr_read, stderr_write) = pipe().map_err(spawn)?;
            let fds = [
                stdin_read.as_raw_fd(),
                stdout_write.as_raw_fd(),
                stderr_write.as_raw_fd(),
            ];
            let ends = Pipes {
                stdin: stdin_write,
                stdout: stdout_read,
                stderr: stderr_read,
            };
            // The child's ends stay open until after the clone (dropped with this tuple).
            (Some((ends, [stdin_read, stdout_write, stderr_write])), fds)
        }
    };
    let mut args = ChildArgs {
        candidates: null_terminated(&program.candidates),
        argv: null_terminated(&program.argv),
        envp: null_terminated(&program.envp),
        workdir: program.workdir.as_ref().map_or(ptr::null(), |w| w.as_ptr()),
        fds,
        terminal: terminal.is_some(),
        failed_stage: 0,
        failed_errno: 0,
    };
    let stack = Stack::new().map_err(spawn)?;
    let pid = {
        // No signal may reach the child before it has reset the agent's handlers (it shares
        // the agent's memory until it execs): block all of them around the clone.
        let _blocked = SignalsBlocked::new().map_err(spawn)?;
        // SAFETY: `child_main` only makes async-signal-safe calls on its own stack and
        // reads `args`, which outlives it: with CLONE_VFORK this thread is suspended until
        // the child has exec'd or exited, so neither `args` nor `stack` can be dropped or
        // touched meanwhile. SIGCHLD as exit signal lets the agent's reaper collect it.
        unsafe {
            libc::clone(
                child_main,
                stack.top(),
                libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
                (&mut args as *mut ChildArgs).cast(),
            )
        }
    };
    if pid < 0 {
        return Err(spawn(io::Error::last_os_error()));
    }
    if args.failed_stage != 0 {
        // The child has exited (CLONE_VFORK returned): collect it now, unless the reaper
        // already did (ECHILD then).
        // SAFETY: a plain waitpid on our own child with no status pointer.
        unsafe { libc::waitpid(pid, ptr::null_mut(), 0) };
        let err = io::Error::from_raw_os_error(args.failed_errno);
        return Err(match args.failed_stage {
            STAGE_WORKDIR => LaunchError::Workdir(err),
            _ => LaunchError::Spawn(err),
        });
    }
    Ok(Launched {
        pid,
        pipes: pipes.map(|(ends, _child_ends)| ends),
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

/// A close-on-exec pipe whose ends are above the standard descriptors, so the child's
/// `dup2` onto 0, 1 and 2 never overwrites one end with another.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: `fds` is a valid out array of two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours alone.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(read)?, above_stdio(write)?))
}

/// `fd`, or a close-on-exec copy of it above 2 (the copy replaces it).
pub(super) fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an open descriptor returns a new one or -1.
    let moved = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `moved` was just returned by fcntl and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(moved) })
}

/// The child's stack, with a guard page below it.
struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    fn new() -> io::Result<Stack> {
        let len = STACK_SIZE + page_size();
        // SAFETY: an anonymous private mapping at an address of the kernel's choice.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page lies inside the mapping just made.
        if unsafe { libc::mprotect(base, page_size(), libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The stack grows down: the child starts at the top, 16-byte aligned.
    fn top(&self) -> *mut c_void {
        let end = self.base as usize + self.len;
        (end & !15) as *mut c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping made in `new`, unused by now.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

/// Blocks every signal in the calling thread until dropped.
struct SignalsBlocked {
    old: libc::sigset_t,
}

impl SignalsBlocked {
    fn new() -> io::Result<SignalsBlocked> {
        // SAFETY: sigset_t is plain data, initialised by sigfillset / pthread_sigmask.
        let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: both sets are valid and exclusively borrowed.
        let rc = unsafe {
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old)
        };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(SignalsBlocked { old })
    }
}

impl Drop for SignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: `old` was filled by pthread_sigmask in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, ptr::null_mut()) };
    }
}

/// The child, between clone and exec. It shares the agent's memory, so it only reads its
/// arguments, writes `failed_*`, and makes async-signal-safe calls; it never returns into
/// Rust code of the agent's and never unwinds.
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildArgs` the suspended parent passed to clone.
    let args = unsafe { &mut *(arg as *mut ChildArgs) };
    // SAFETY: only system calls on descriptors, strings and pointer arrays the parent
    // prepared (NUL-terminated, null-terminated), which stay alive while it is suspended.
    unsafe {
        reset_signal_handlers();
        for (target, &fd) in args.fds.iter().enumerate() {
            // dup2 onto 0..2 clears close-on-exec on the copy; the originals (above 2)
            // close at exec.
            if libc::dup2(fd, target as c_int) < 0 {
                return give_up(args, STAGE_SETUP);
            }
        }
        if args.terminal {
            // A session of its own (also a process group of its own, whose id is the
            // pid), then the slave as its controlling terminal: job control, ^C and
            // SIGWINCH reach the program's foreground group.
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return give_up(args, STAGE_SETUP);
            }
        } else if libc::setpgid(0, 0) != 0 {
            return give_up(args, STAGE_SETUP);
        }
        if !args.workdir.is_null() && libc::chdir(args.workdir) != 0 {
            return give_up(args, STAGE_WORKDIR);
        }
        // Dies with the agent; the program, not the agent, is what the OOM killer ends
        // (raising needs no privilege; best effort without /proc).
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
            return give_up(args, STAGE_SETUP);
        }
        prefer_as_oom_victim();
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        if libc::sigprocmask(libc::SIG_SETMASK, &none, ptr::null_mut()) != 0 {
            return give_up(args, STAGE_SETUP);
        }
        exec_first_runnable(args)
    }
}

/// Tries each candidate as `execvp` does: a missing one moves on, a refused one is
/// remembered (EACCES wins over ENOENT at the end), anything else stops the search.
///
/// # Safety
/// Only from `child_main`.
unsafe fn exec_first_runnable(args: &mut ChildArgs) -> c_int {
    // SAFETY: the pointer arrays are null-terminated and their strings NUL-terminated, prepared
    // by the suspended parent; execve and _exit are async-signal-safe.
    unsafe {
        let mut refused = false;
        let mut last = libc::ENOENT;
        for &path in args.candidates.iter().take_while(|p| !p.is_null()) {
            libc::execve(path, args.argv.as_ptr(), args.envp.as_ptr());
            last = errno();
            match last {
                libc::EACCES => refused = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => break,
            }
        }
        if refused && matches!(last, libc::ENOENT | libc::ENOTDIR) {
            last = libc::EACCES;
        }
        args.failed_stage = STAGE_EXEC;
        args.failed_errno = last;
        libc::_exit(127)
    }
}

/// # Safety
/// Only from `child_main`.
unsafe fn give_up(args: &mut ChildArgs, stage: c_int) -> c_int {
    // SAFETY: _exit is async-signal-safe and ends the child without running any Rust code.
    unsafe {
        args.failed_stage = stage;
        args.failed_errno = errno();
        libc::_exit(127)
    }
}

fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot (the suspended parent's,
    // which the child borrows until exec, as with vfork).
    unsafe { *libc::__errno_location() }
}

/// Resets every signal to its default: one the agent catches (a handler of the agent's must
/// never run in the child, which shares its memory), SIGPIPE, which Rust ignores, and any the
/// agent was started ignoring. An ignored signal survives exec, so without this a program in
/// the sandbox would inherit whatever the host's adapter was started with (a service or a
/// script's `cmd &` ignores SIGINT and SIGQUIT): ^C typed at its terminal would do nothing.
///
/// # Safety
/// Only from `child_main`.
unsafe fn reset_signal_handlers() {
    // SAFETY: sigaction structs are plain data; sigaction is async-signal-safe and changes only
    // the child's own handler table (no CLONE_SIGHAND).
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, ptr::null(), &mut current) != 0 {
                continue;
            }
            if current.sa_sigaction != libc::SIG_DFL {
                libc::sigaction(sig, &default, ptr::null_mut());
            }
        }
    }
}

/// # Safety
/// Only from `child_main`.
unsafe fn prefer_as_oom_victim() {
    // SAFETY: open, write and close are async-signal-safe; PATH is NUL-terminated and MOST is
    // valid for its length.
    unsafe {
        const PATH: &[u8] = b"/proc/self/oom_score_adj\0";
        const MOST: &[u8] = b"1000";
        let fd = libc::open(PATH.as_ptr().cast(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd >= 0 {
            libc::write(fd, MOST.as_ptr().cast(), MOST.len());
            libc::close(fd);
        }
    }
}
