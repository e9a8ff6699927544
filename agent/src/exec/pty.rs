//! Pseudo-terminals for execs that ask for one (`ExecRequest::tty`): opening a pair,
//! setting its size, and the slot through which the host's `Resize` frames reach it.
//!
//! The slave is taken from the master with `TIOCGPTPEER` (Linux 4.13+), never by the name
//! `ptsname` gives: the agent opens no path under `/dev/pts`, which the sandbox's programs
//! share with it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Mutex;

use agent_proto::TtySize;

use super::launch::above_stdio;
use crate::log::log;

/// A terminal's two ends, both close-on-exec and above the standard descriptors (the
/// child's `dup2` onto 0, 1 and 2 never overwrites one with another).
pub struct Pair {
    /// The agent's end: the program's output is read from it, its input written to it.
    pub master: OwnedFd,
    /// The program's end: its controlling terminal, on its 0, 1 and 2.
    pub slave: OwnedFd,
}

/// Opens a new terminal of `size`.
pub fn open(size: TtySize) -> io::Result<Pair> {
    const PTMX: &[u8] = b"/dev/ptmx\0";
    // SAFETY: a NUL-terminated path; open returns a new descriptor or -1. O_NOCTTY: the
    // agent never takes the terminal as its own controlling one.
    let fd = unsafe {
        libc::open(
            PTMX.as_ptr().cast(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by open and nothing else owns it.
    let master = above_stdio(unsafe { OwnedFd::from_raw_fd(fd) })?;
    // grantpt is a no-op on devpts (the slave belongs to the opener); unlockpt is this.
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int from a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes open flags by value and returns a new descriptor or -1.
    let fd = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by the ioctl and nothing else owns it.
    let slave = above_stdio(unsafe { OwnedFd::from_raw_fd(fd) })?;
    set_size(&master, size)?;
    Ok(Pair { master, slave })
}

/// Sets the terminal's size; the kernel sends SIGWINCH to its foreground group when it
/// changes.
pub fn set_size(master: &OwnedFd, size: TtySize) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from a valid pointer.
    if unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Where `Resize` frames for one exec go. The reader thread holds it from `ExecStart` on;
/// the exec's thread attaches the master once the program runs and detaches it at the
/// end. A size that comes before the program runs is applied when it is attached; one
/// after the end, or for an exec without a terminal, is moot.
#[derive(Default)]
pub struct Terminal {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    master: Option<OwnedFd>,
    pending: Option<TtySize>,
}

impl Terminal {
    pub fn resize(&self, id: u32, size: TtySize) {
        let mut state = self.lock();
        match &state.master {
            Some(master) => {
                if let Err(e) = set_size(master, size) {
                    log!("exec {id}: cannot resize its terminal: {e}");
                }
            }
            None => state.pending = Some(size),
        }
    }

    pub fn attach(&self, id: u32, master: OwnedFd) {
        let mut state = self.lock();
        if let Some(size) = state.pending.take() {
            if let Err(e) = set_size(&master, size) {
                log!("exec {id}: cannot resize its terminal: {e}");
            }
        }
        state.master = Some(master);
    }

    pub fn detach(&self) {
        let mut state = self.lock();
        state.master = None;
        state.pending = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size_of(fd: &OwnedFd) -> (u16, u16) {
        // SAFETY: winsize is plain data; TIOCGWINSZ writes one into a valid pointer.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        (ws.ws_row, ws.ws_col)
    }

    #[test]
    fn a_pair_opens_at_its_size_and_resizes() {
        let pair = match open(TtySize {
            rows: 33,
            cols: 101,
        }) {
            Ok(pair) => pair,
            Err(e) => {
                println!("DID NOT RUN: no pseudo-terminal here ({e})");
                return;
            }
        };
        assert!(pair.master.as_raw_fd() > 2 && pair.slave.as_raw_fd() > 2);
        assert_eq!(size_of(&pair.slave), (33, 101));
        let terminal = Terminal::default();
        // Before the master is attached the size waits; attaching applies it.
        terminal.resize(1, TtySize { rows: 10, cols: 20 });
        terminal.attach(1, pair.master.try_clone().unwrap());
        assert_eq!(size_of(&pair.slave), (10, 20));
        terminal.resize(
            1,
            TtySize {
                rows: 50,
                cols: 132,
            },
        );
        assert_eq!(size_of(&pair.slave), (50, 132));
        // After the end a resize is moot, and harmless.
        terminal.detach();
        terminal.resize(1, TtySize { rows: 5, cols: 5 });
        assert_eq!(size_of(&pair.slave), (50, 132));
    }
}
