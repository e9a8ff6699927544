//! Draining an exec's output until both pipes close, the deadline passes, or a kill is
//! requested; forwarding at most the cap per stream, counting the rest.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{ChildStderr, ChildStdout};
use std::time::{Duration, Instant};

use agent_proto::{Message, CHUNK_SIZE};

use crate::outbox::Outbox;
use crate::procs::ExecControl;
use crate::sys;

/// After SIGKILL, how long to keep draining before abandoning pipes that a process
/// outside the group (e.g. one that called setsid) still holds.
const KILL_GRACE: Duration = Duration::from_secs(2);

/// Pipe buffer asked of the kernel, and bytes read per wake-up (a frame each, well
/// under `MAX_PAYLOAD`).
const PIPE_SIZE: usize = 1024 * 1024;
const READ_SIZE: usize = 4 * CHUNK_SIZE;

/// How the pump ended.
pub struct Drained {
    pub status: Option<libc::c_int>,
    pub timed_out: bool,
    pub killed: bool,
    pub out: StreamTally,
    pub err: StreamTally,
}

#[derive(Default, Clone, Copy)]
pub struct StreamTally {
    pub total: u64,
    pub sent: u64,
    pub truncated: bool,
}

struct Stream<R> {
    pipe: Option<R>,
    tally: StreamTally,
    stdout: bool,
}

impl<R: Read + AsRawFd> Stream<R> {
    /// Reads what is there; forwards it within the cap. Closes the stream on EOF/error.
    fn pump(&mut self, buf: &mut [u8], cap: u64, id: u32, outbox: &Outbox) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        match pipe.read(buf) {
            Ok(0) => self.pipe = None,
            Ok(n) => {
                self.tally.total += n as u64;
                let room = cap.saturating_sub(self.tally.sent) as usize;
                let send = n.min(room);
                if send < n {
                    self.tally.truncated = true;
                }
                if send > 0 {
                    self.tally.sent += send as u64;
                    let chunk = buf[..send].to_vec();
                    let msg = if self.stdout {
                        Message::Stdout(chunk)
                    } else {
                        Message::Stderr(chunk)
                    };
                    outbox.send(id, msg);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => self.pipe = None,
        }
    }
}

pub struct PumpArgs<'a> {
    pub id: u32,
    pub pgid: libc::pid_t,
    pub control: &'a ExecControl,
    pub outbox: &'a Outbox,
    pub deadline: Option<Instant>,
    pub cap: u64,
}

pub fn drain(args: PumpArgs<'_>, stdout: ChildStdout, stderr: ChildStderr) -> Drained {
    let mut out = Stream {
        pipe: Some(stdout),
        tally: StreamTally::default(),
        stdout: true,
    };
    let mut err = Stream {
        pipe: Some(stderr),
        tally: StreamTally::default(),
        stdout: false,
    };
    for fd in [
        out.pipe.as_ref().map(|p| p.as_raw_fd()),
        err.pipe.as_ref().map(|p| p.as_raw_fd()),
    ]
    .into_iter()
    .flatten()
    {
        sys::grow_pipe(fd, PIPE_SIZE);
    }
    let mut buf = vec![0u8; READ_SIZE];
    let mut status = None;
    let (mut timed_out, mut killed) = (false, false);
    let mut give_up_at: Option<Instant> = None;
    loop {
        status = status.or_else(|| args.control.status());
        if out.pipe.is_none() && err.pipe.is_none() && status.is_some() {
            break;
        }
        let now = Instant::now();
        if give_up_at.is_none() {
            if args.control.kill_requested() {
                killed = true;
            } else if args.deadline.is_some_and(|d| now >= d) {
                timed_out = true;
            }
            if killed || timed_out {
                sys::kill_group(args.pgid, libc::SIGKILL);
                give_up_at = Some(now + KILL_GRACE);
            }
        }
        if give_up_at.is_some_and(|g| now >= g) {
            break;
        }
        let wait_until = give_up_at.or(args.deadline);
        let timeout_ms = wait_until.map_or(-1, |t| {
            let left = t.saturating_duration_since(now).as_millis();
            (left.min(i32::MAX as u128) as i32).max(1)
        });
        let fds: Vec<_> = [
            out.pipe.as_ref().map(|p| p.as_raw_fd()),
            err.pipe.as_ref().map(|p| p.as_raw_fd()),
            Some(args.control.wake_fd()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let Ok(ready) = sys::poll_readable(&fds, timeout_ms) else {
            break;
        };
        for (fd, is_ready) in fds.iter().zip(ready) {
            if !is_ready {
                continue;
            }
            if out.pipe.as_ref().is_some_and(|p| p.as_raw_fd() == *fd) {
                out.pump(&mut buf, args.cap, args.id, args.outbox);
            } else if err.pipe.as_ref().is_some_and(|p| p.as_raw_fd() == *fd) {
                err.pump(&mut buf, args.cap, args.id, args.outbox);
            } else {
                args.control.clear_wake();
            }
        }
    }
    Drained {
        status: status.or_else(|| args.control.status()),
        timed_out,
        killed,
        out: out.tally,
        err: err.tally,
    }
}
