//! Draining an exec's output until both pipes close, the deadline passes, or a kill is
//! requested; forwarding at most the cap per stream, counting the rest.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::process::{ChildStderr, ChildStdout};
use std::time::{Duration, Instant};

use agent_proto::process::SIGNAL_GRACE;
use agent_proto::{flow_cost, Message, CHUNK_SIZE, FLOW_CHUNK_OVERHEAD};

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

/// What the pump may forward now.
struct Forward<'a> {
    /// Bytes per stream (the request's `max_output_bytes`).
    cap: u64,
    /// Flow window room left, when the exec has one (payload bytes, overhead taken off).
    flow_room: Option<usize>,
    /// Cost of everything forwarded under the flow window so far (both streams).
    sent_cost: &'a mut u64,
    id: u32,
    outbox: &'a Outbox,
}

impl<R: Read + AsRawFd> Stream<R> {
    /// Reads what is there; forwards it within the cap and the flow window, counting the
    /// rest as dropped. Closes the stream on EOF/error.
    fn pump(&mut self, buf: &mut [u8], fwd: &mut Forward<'_>) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        match pipe.read(buf) {
            Ok(0) => self.pipe = None,
            Ok(n) => {
                self.tally.total += n as u64;
                let room = fwd.cap.saturating_sub(self.tally.sent) as usize;
                let send = n.min(room).min(fwd.flow_room.unwrap_or(usize::MAX));
                if send < n {
                    self.tally.truncated = true;
                }
                if send > 0 {
                    self.tally.sent += send as u64;
                    if let Some(flow_room) = fwd.flow_room.as_mut() {
                        *flow_room -= send;
                        *fwd.sent_cost += flow_cost(send);
                    }
                    let chunk = buf[..send].to_vec();
                    let msg = if self.stdout {
                        Message::Stdout(chunk)
                    } else {
                        Message::Stderr(chunk)
                    };
                    fwd.outbox.send(fwd.id, msg);
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
    /// The request's flow window: output unacknowledged by the host stays under it.
    pub window: Option<u64>,
}

/// `stderr` is None for a program on a terminal, whose master (`stdout`) carries both
/// streams; its EIO once the program's side is closed ends it like end of file.
pub fn drain(args: PumpArgs<'_>, stdout: ChildStdout, stderr: Option<ChildStderr>) -> Drained {
    let mut out = Stream {
        pipe: Some(stdout),
        tally: StreamTally::default(),
        stdout: true,
    };
    let mut err = Stream {
        pipe: stderr,
        tally: StreamTally::default(),
        stdout: false,
    };
    // A terminal's master refuses F_SETPIPE_SZ, harmlessly.
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
    // SIGKILL due after a host's signal other than SIGKILL, unless the program ends first.
    let mut escalate_at: Option<Instant> = None;
    let mut signalled = false;
    let mut sent_cost = 0u64;
    loop {
        status = status.or_else(|| args.control.status());
        if out.pipe.is_none() && err.pipe.is_none() && status.is_some() {
            break;
        }
        let now = Instant::now();
        if give_up_at.is_none() {
            if let Some(signal) = args.control.take_signal() {
                signalled = true;
                sys::kill_group(args.pgid, signal);
                if signal != libc::SIGKILL {
                    escalate_at = escalate_at.or(Some(now + SIGNAL_GRACE));
                } else {
                    args.control.request_kill();
                }
            }
            if args.control.kill_requested() || escalate_at.is_some_and(|e| now >= e) {
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
        let wait_until = give_up_at.or(match (escalate_at, args.deadline) {
            (Some(e), Some(d)) => Some(e.min(d)),
            (e, d) => e.or(d),
        });
        let timeout_ms = wait_until.map_or(-1, |t| {
            let left = t.saturating_duration_since(now).as_millis();
            (left.min(i32::MAX as u128) as i32).max(1)
        });
        // Flow window: while the host has a window's worth unacknowledged the pipes are
        // not read, so the program blocks on them. Once killing, everything is read and
        // what does not fit is dropped, so the pipes close and the exec can end.
        let flow_room = args.window.map(|window| {
            let in_flight = sent_cost.saturating_sub(args.control.output_acked());
            window
                .saturating_sub(in_flight)
                .saturating_sub(FLOW_CHUNK_OVERHEAD) as usize
        });
        let killing = give_up_at.is_some();
        let pipes_polled = killing || flow_room != Some(0);
        let fds: Vec<_> = [
            out.pipe
                .as_ref()
                .map(|p| p.as_raw_fd())
                .filter(|_| pipes_polled),
            err.pipe
                .as_ref()
                .map(|p| p.as_raw_fd())
                .filter(|_| pipes_polled),
            Some(args.control.wake_fd()),
        ]
        .into_iter()
        .flatten()
        .collect();
        let Ok(ready) = sys::poll_readable(&fds, timeout_ms) else {
            break;
        };
        let mut fwd = Forward {
            cap: args.cap,
            flow_room,
            sent_cost: &mut sent_cost,
            id: args.id,
            outbox: args.outbox,
        };
        for (fd, is_ready) in fds.iter().zip(ready) {
            if !is_ready {
                continue;
            }
            // Read no more than the window has room for (the other stream may have used
            // some of it in this round).
            let len = match fwd.flow_room {
                Some(room) if !killing => room.min(READ_SIZE),
                _ => READ_SIZE,
            };
            if out.pipe.as_ref().is_some_and(|p| p.as_raw_fd() == *fd) {
                if len > 0 {
                    out.pump(&mut buf[..len], &mut fwd);
                }
            } else if err.pipe.as_ref().is_some_and(|p| p.as_raw_fd() == *fd) {
                if len > 0 {
                    err.pump(&mut buf[..len], &mut fwd);
                }
            } else {
                args.control.clear_wake();
            }
        }
    }
    Drained {
        status: status.or_else(|| args.control.status()),
        timed_out,
        killed: killed || signalled,
        out: out.tally,
        err: err.tally,
    }
}
