//! One exec: a thread that spawns the program, feeds its stdin, drains its output and
//! sends `ExecExit` last, only once both streams are closed (or abandoned at a deadline).

pub mod background;
mod launch;
mod pty;
mod pump;
mod spawn;

use std::io::Write;
use std::process::ChildStdin;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_proto::{flow_cost, ExecExit, ExecRequest, FlowAck, Message};

use crate::log::log;
use crate::outbox::Outbox;
use crate::procs::{ExecControl, ProcTable};
use pump::{Drained, PumpArgs};
use spawn::SpawnError;

/// What the reader thread keeps about a running exec.
pub struct ExecHandle {
    pub control: Arc<ExecControl>,
    /// Stdin chunks for the program; dropping it closes the program's stdin.
    pub stdin: Option<Sender<Vec<u8>>>,
    /// Where `Resize` frames go (moot for an exec without a terminal).
    pub terminal: Arc<pty::Terminal>,
}

/// Everything an exec thread needs from the agent.
#[derive(Clone)]
pub struct ExecContext {
    pub table: ProcTable,
    pub outbox: Outbox,
}

/// Starts exec `id` on its own thread. `on_done` runs after `ExecExit` (or `Error`) is sent.
pub fn start(
    id: u32,
    req: ExecRequest,
    ctx: ExecContext,
    on_done: impl FnOnce() + Send + 'static,
) -> std::io::Result<ExecHandle> {
    let control = ExecControl::new()?;
    let (stdin_tx, stdin_rx) = mpsc::channel();
    let thread_control = control.clone();
    let terminal = Arc::new(pty::Terminal::default());
    let thread_terminal = terminal.clone();
    std::thread::Builder::new()
        .name(format!("exec-{id}"))
        .spawn(move || {
            run(id, req, &thread_control, &ctx, stdin_rx, &thread_terminal);
            thread_terminal.detach();
            on_done();
        })?;
    Ok(ExecHandle {
        control,
        stdin: Some(stdin_tx),
        terminal,
    })
}

fn run(
    id: u32,
    req: ExecRequest,
    control: &Arc<ExecControl>,
    ctx: &ExecContext,
    stdin_rx: Receiver<Vec<u8>>,
    terminal: &pty::Terminal,
) {
    let started = Instant::now();
    let spawned = match spawn::spawn(&req, control, &ctx.table) {
        Ok(spawned) => spawned,
        Err(SpawnError::AsExit { code, message }) => {
            // On a terminal everything the program's side says is terminal output.
            let on_tty = req.tty.is_some();
            let shown = message.len().min(req.max_output_bytes as usize);
            if shown > 0 {
                let chunk = message.as_bytes()[..shown].to_vec();
                let msg = match on_tty {
                    true => Message::Stdout(chunk),
                    false => Message::Stderr(chunk),
                };
                ctx.outbox.send(id, msg);
            }
            let (total, cut) = (message.len() as u64, shown < message.len());
            let exit = ExecExit {
                exit_code: code,
                signal: None,
                timed_out: false,
                killed: false,
                stdout_truncated: on_tty && cut,
                stderr_truncated: !on_tty && cut,
                stdout_total: if on_tty { total } else { 0 },
                stderr_total: if on_tty { 0 } else { total },
                duration_ms: elapsed_ms(started),
            };
            ctx.outbox.send(id, Message::ExecExit(exit));
            return;
        }
        Err(SpawnError::Request(e)) => {
            ctx.outbox.send(id, Message::Error(e));
            return;
        }
    };
    if let Some(master) = spawned.terminal {
        terminal.attach(id, master);
    }
    if let Some(stdin) = spawned.stdin {
        // With a flow window the host waits for acks before it sends more stdin.
        let acks = req.flow_window.map(|_| ctx.outbox.clone());
        feed_stdin(id, stdin, stdin_rx, acks);
    }
    // A deadline too far to represent is no deadline (never a panic on input).
    let deadline = (req.timeout_ms > 0)
        .then(|| started.checked_add(Duration::from_millis(req.timeout_ms)))
        .flatten();
    let args = PumpArgs {
        id,
        pgid: spawned.pid,
        control,
        outbox: &ctx.outbox,
        deadline,
        cap: req.max_output_bytes,
        window: req.flow_window,
    };
    let drained = pump::drain(args, spawned.stdout, spawned.stderr);
    ctx.table.forget(spawned.pid);
    let exit = exit_message(&drained, elapsed_ms(started));
    ctx.outbox.send(id, Message::ExecExit(exit));
}

/// Writes stdin chunks on a thread of their own, so a program that never reads its
/// stdin blocks only that thread. Ends (closing stdin) when the host sends the last chunk.
/// With `acks` (a flow-controlled exec) each chunk written is acknowledged with `StdinAck`.
fn feed_stdin(id: u32, mut stdin: ChildStdin, chunks: Receiver<Vec<u8>>, acks: Option<Outbox>) {
    let spawned = std::thread::Builder::new()
        .name(format!("stdin-{id}"))
        .spawn(move || {
            for chunk in chunks {
                if stdin.write_all(&chunk).is_err() {
                    return; // program closed its stdin or died
                }
                if let Some(outbox) = acks.as_ref().filter(|_| !chunk.is_empty()) {
                    let ack = FlowAck {
                        bytes: flow_cost(chunk.len()),
                    };
                    outbox.send(id, Message::StdinAck(ack));
                }
            }
        });
    if let Err(e) = spawned {
        log!("exec {id}: no thread for stdin ({e}); stdin closed");
    }
}

fn exit_message(d: &Drained, duration_ms: u64) -> ExecExit {
    let (exit_code, signal) = match d.status {
        Some(s) if libc::WIFEXITED(s) => (libc::WEXITSTATUS(s), None),
        Some(s) if libc::WIFSIGNALED(s) => (128 + libc::WTERMSIG(s), Some(libc::WTERMSIG(s))),
        // Not reaped within the kill grace (stuck in the kernel): report SIGKILL.
        _ => (128 + libc::SIGKILL, Some(libc::SIGKILL)),
    };
    ExecExit {
        exit_code,
        signal,
        timed_out: d.timed_out,
        killed: d.killed,
        stdout_truncated: d.out.truncated,
        stderr_truncated: d.err.truncated,
        stdout_total: d.out.total,
        stderr_total: d.err.total,
        duration_ms,
    }
}

fn elapsed_ms(since: Instant) -> u64 {
    since.elapsed().as_millis().min(u64::MAX as u128) as u64
}
