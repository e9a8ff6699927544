//! Background processes: programs started by `ProcRequest::Start` that outlive the request.
//! Each has a thread that spawns it (so it dies with that thread, see `launch`), reads its
//! stdout and stderr into one ring, and records its exit.
//!
//! Memory: a ring keeps the last [`RING_BYTES`] a process wrote, and all rings together at
//! most [`RINGS_TOTAL_BYTES`] (output that finds the total spent makes room by dropping the
//! oldest bytes of the fullest ring). A flood costs reading it, never memory.
//! At most [`MAX_LIVE_PROCESSES`] run at once, and [`MAX_ENDED_PROCESSES`] ended ones are
//! remembered (the oldest forgotten first).

use std::collections::{BTreeMap, VecDeque};
use std::io::Read;
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use agent_proto::process::{
    ALLOWED_SIGNALS, MAX_ENDED_PROCESSES, MAX_LIVE_PROCESSES, MAX_OUTPUT_PAGE, RINGS_TOTAL_BYTES,
    RING_BYTES, SIGNAL_GRACE,
};
use agent_proto::{
    ExecRequest, Message, ProcErrorCode, ProcInfo, ProcReply, ProcRequest, CHUNK_SIZE,
};

use super::spawn::{self, SpawnError};
use super::ExecContext;
use crate::log::log;
use crate::procs::ExecControl;
use crate::sys;

/// The agent's background processes.
#[derive(Clone, Default)]
pub struct Background {
    table: Arc<Mutex<Table>>,
}

/// Every process and its ring under one lock, so the total bound can take bytes from any
/// ring (the fullest) without lock-order questions.
#[derive(Default)]
struct Table {
    next_id: u32,
    procs: BTreeMap<u32, Proc>,
    /// Bytes held by every ring together.
    used: usize,
}

struct Proc {
    /// 0 until spawned.
    pid: libc::pid_t,
    control: Arc<ExecControl>,
    ring: VecDeque<u8>,
    /// Bytes written in all: the ring holds `total - ring.len() .. total`.
    total: u64,
    exit_code: Option<i32>,
}

impl Proc {
    fn info(&self, process_id: u32) -> ProcInfo {
        ProcInfo {
            process_id,
            pid: self.pid,
            running: self.exit_code.is_none(),
            exit_code: self.exit_code,
            total_bytes: self.total,
        }
    }
}

impl Table {
    fn info(&self, process_id: u32) -> Option<ProcInfo> {
        self.procs.get(&process_id).map(|p| p.info(process_id))
    }

    /// Adds output to a ring within both bounds (see the module's docs).
    fn append(&mut self, process_id: u32, data: &[u8]) {
        let Some(proc) = self.procs.get_mut(&process_id) else {
            return;
        };
        proc.total += data.len() as u64;
        let data = &data[data.len().saturating_sub(RING_BYTES)..];
        let over = (proc.ring.len() + data.len()).saturating_sub(RING_BYTES);
        proc.ring.drain(..over);
        self.used -= over;
        // Within the total: bytes from the fullest rings first (this one included).
        while self.used + data.len() > RINGS_TOTAL_BYTES {
            let need = self.used + data.len() - RINGS_TOTAL_BYTES;
            let Some(fullest) = self
                .procs
                .values_mut()
                .max_by_key(|p| p.ring.len())
                .filter(|p| !p.ring.is_empty())
            else {
                break;
            };
            let take = need.min(fullest.ring.len());
            fullest.ring.drain(..take);
            self.used -= take;
        }
        if let Some(proc) = self.procs.get_mut(&process_id) {
            proc.ring.extend(data);
            self.used += data.len();
        }
    }

    /// Forgets the oldest ended processes so that one more fits [`MAX_ENDED_PROCESSES`],
    /// returning their rings' bytes to the total.
    fn forget_ended(&mut self) {
        let ended: Vec<u32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.exit_code.is_some())
            .map(|(id, _)| *id)
            .collect();
        let excess = (ended.len() + 1).saturating_sub(MAX_ENDED_PROCESSES);
        for id in ended.into_iter().take(excess) {
            if let Some(proc) = self.procs.remove(&id) {
                self.used -= proc.ring.len();
            }
        }
    }
}

impl Background {
    /// Serves one request; the answer goes out as `ProcReply` on `id` (a start's once its
    /// program runs).
    pub fn handle(&self, id: u32, request: ProcRequest, ctx: &ExecContext) {
        let reply = |reply: ProcReply| ctx.outbox.send(id, Message::ProcReply(reply));
        match request {
            ProcRequest::Start { exec } => {
                if let Err(refused) = self.start(id, exec, ctx) {
                    reply(refused);
                }
            }
            ProcRequest::List => {
                let processes = {
                    let table = lock(&self.table);
                    table.procs.iter().map(|(pid, p)| p.info(*pid)).collect()
                };
                reply(ProcReply::List { processes });
            }
            ProcRequest::Output {
                process_id,
                since,
                max_bytes,
            } => self.output(id, process_id, since, max_bytes, ctx),
            ProcRequest::Kill { process_id, signal } => {
                if !ALLOWED_SIGNALS.contains(&signal) {
                    return reply(ProcReply::Refused {
                        code: ProcErrorCode::BadSignal,
                        message: format!("signal {signal} is not one of {ALLOWED_SIGNALS:?}"),
                    });
                }
                let table = lock(&self.table);
                let answer = match table.procs.get(&process_id) {
                    Some(proc) => {
                        if proc.exit_code.is_none() {
                            proc.control.request_signal(signal);
                        }
                        ProcReply::Signalled {
                            info: proc.info(process_id),
                        }
                    }
                    None => not_found(process_id),
                };
                drop(table);
                reply(answer);
            }
        }
    }

    /// Sends SIGKILL to every running process's group (the agent is shutting down).
    pub fn kill_all(&self) {
        for proc in lock(&self.table).procs.values() {
            if proc.exit_code.is_none() {
                sys::kill_group(proc.pid, libc::SIGKILL);
            }
        }
    }

    fn start(&self, id: u32, exec: ExecRequest, ctx: &ExecContext) -> Result<(), ProcReply> {
        let spawn_failed = |e: std::io::Error| ProcReply::Refused {
            code: ProcErrorCode::Spawn,
            message: format!("no thread for the process: {e}"),
        };
        let control = ExecControl::new().map_err(spawn_failed)?;
        let process_id = {
            let mut table = lock(&self.table);
            let running = table
                .procs
                .values()
                .filter(|p| p.exit_code.is_none())
                .count();
            if running >= MAX_LIVE_PROCESSES {
                return Err(ProcReply::Refused {
                    code: ProcErrorCode::TooMany,
                    message: format!(
                        "{running} background processes run already, the most one sandbox may"
                    ),
                });
            }
            table.forget_ended();
            table.next_id = table.next_id.wrapping_add(1).max(1);
            let process_id = table.next_id;
            table.procs.insert(
                process_id,
                Proc {
                    pid: 0,
                    control: control.clone(),
                    ring: VecDeque::new(),
                    total: 0,
                    exit_code: None,
                },
            );
            process_id
        };
        let this = self.clone();
        let thread_ctx = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("process-{process_id}"))
            .spawn(move || this.run(id, process_id, &control, exec, &thread_ctx));
        if let Err(e) = spawned {
            lock(&self.table).procs.remove(&process_id);
            return Err(spawn_failed(e));
        }
        Ok(())
    }

    /// The process's thread: spawn, answer, read its output until it has ended.
    fn run(
        &self,
        id: u32,
        process_id: u32,
        control: &Arc<ExecControl>,
        mut exec: ExecRequest,
        ctx: &ExecContext,
    ) {
        exec.stdin = false;
        exec.tty = None;
        exec.flow_window = None;
        let started = |table: &Table| {
            let reply = match table.info(process_id) {
                Some(info) => ProcReply::Started { info },
                None => not_found(process_id),
            };
            ctx.outbox.send(id, Message::ProcReply(reply));
        };
        let spawned = match spawn::spawn(&exec, control, &ctx.table) {
            Ok(spawned) => spawned,
            Err(SpawnError::AsExit { code, message }) => {
                // Like an exec: a program that cannot run ends at once with 126/127.
                let mut table = lock(&self.table);
                table.append(process_id, message.as_bytes());
                if let Some(proc) = table.procs.get_mut(&process_id) {
                    proc.exit_code = Some(code);
                }
                return started(&table);
            }
            Err(SpawnError::Request(e)) => {
                let mut table = lock(&self.table);
                if let Some(proc) = table.procs.remove(&process_id) {
                    table.used -= proc.ring.len();
                }
                drop(table);
                let reply = ProcReply::Refused {
                    code: ProcErrorCode::Spawn,
                    message: e.message,
                };
                return ctx.outbox.send(id, Message::ProcReply(reply));
            }
        };
        let pid = spawned.pid;
        {
            let mut table = lock(&self.table);
            if let Some(proc) = table.procs.get_mut(&process_id) {
                proc.pid = pid;
            }
            started(&table);
        }
        let status = self.drain(process_id, control, pid, spawned.stdout, spawned.stderr);
        ctx.table.forget(pid);
        let code = match status {
            Some(s) if libc::WIFEXITED(s) => libc::WEXITSTATUS(s),
            Some(s) if libc::WIFSIGNALED(s) => 128 + libc::WTERMSIG(s),
            _ => 128 + libc::SIGKILL,
        };
        if let Some(proc) = lock(&self.table).procs.get_mut(&process_id) {
            proc.exit_code = Some(code);
        }
    }

    /// Reads both pipes into the ring until both close and the program's status is known.
    fn drain(
        &self,
        process_id: u32,
        control: &ExecControl,
        pgid: libc::pid_t,
        stdout: std::process::ChildStdout,
        stderr: Option<std::process::ChildStderr>,
    ) -> Option<libc::c_int> {
        let mut out: Option<Box<dyn ReadFd>> = Some(Box::new(stdout));
        let mut err: Option<Box<dyn ReadFd>> = stderr.map(|e| Box::new(e) as Box<dyn ReadFd>);
        let mut buf = vec![0u8; 4 * CHUNK_SIZE];
        let mut escalate_at: Option<Instant> = None;
        loop {
            let status = control.status();
            if out.is_none() && err.is_none() && status.is_some() {
                return status;
            }
            if let Some(signal) = control.take_signal() {
                sys::kill_group(pgid, signal);
                if signal != libc::SIGKILL {
                    escalate_at = escalate_at.or(Some(Instant::now() + SIGNAL_GRACE));
                }
            }
            let now = Instant::now();
            if escalate_at.is_some_and(|e| now >= e) {
                escalate_at = None;
                if status.is_none() {
                    sys::kill_group(pgid, libc::SIGKILL);
                }
            }
            let timeout_ms = escalate_at.map_or(-1, |e| {
                let left = e.saturating_duration_since(now).as_millis();
                (left.min(i32::MAX as u128) as i32).max(1)
            });
            let fds: Vec<_> = [
                out.as_ref().map(|p| p.fd()),
                err.as_ref().map(|p| p.fd()),
                Some(control.wake_fd()),
            ]
            .into_iter()
            .flatten()
            .collect();
            let Ok(ready) = sys::poll_readable(&fds, timeout_ms) else {
                return control.status();
            };
            for (fd, is_ready) in fds.iter().zip(ready) {
                if !is_ready {
                    continue;
                }
                for pipe in [&mut out, &mut err] {
                    if pipe.as_ref().is_some_and(|p| p.fd() == *fd) {
                        match pipe.as_mut().map(|p| p.read(&mut buf)) {
                            Some(Ok(0)) | Some(Err(_)) => *pipe = None,
                            Some(Ok(n)) => lock(&self.table).append(process_id, &buf[..n]),
                            None => {}
                        }
                    }
                }
                if *fd == control.wake_fd() {
                    control.clear_wake();
                }
            }
        }
    }

    /// Sends bytes from `since` (at most `max_bytes`, capped) as `Data` frames, then the
    /// `Output` answer. On a thread of its own: the reader loop never waits on the link.
    fn output(&self, id: u32, process_id: u32, since: u64, max_bytes: u32, ctx: &ExecContext) {
        let table = self.table.clone();
        let outbox = ctx.outbox.clone();
        let page = move || {
            let (chunk, reply) = {
                let table = lock(&table);
                let Some(proc) = table.procs.get(&process_id) else {
                    drop(table);
                    return outbox.send(id, Message::ProcReply(not_found(process_id)));
                };
                let first = proc.total - proc.ring.len() as u64;
                let start = since.clamp(first, proc.total);
                let len = (proc.total - start).min(u64::from(max_bytes.min(MAX_OUTPUT_PAGE)));
                let skip = (start - first) as usize;
                let bytes: Vec<u8> = proc
                    .ring
                    .range(skip..skip + len as usize)
                    .copied()
                    .collect();
                let reply = ProcReply::Output {
                    info: proc.info(process_id),
                    start,
                    next: start + len,
                };
                (bytes, reply)
            };
            for piece in chunk.chunks(CHUNK_SIZE) {
                let data = piece.to_vec();
                outbox.send(id, Message::Data { data, end: false });
            }
            outbox.send(id, Message::ProcReply(reply));
        };
        if let Err(e) = std::thread::Builder::new()
            .name(format!("output-{id}"))
            .spawn(page)
        {
            log!("process output {id}: no thread ({e})");
            let reply = ProcReply::Refused {
                code: ProcErrorCode::Spawn,
                message: format!("no thread to page the output: {e}"),
            };
            ctx.outbox.send(id, Message::ProcReply(reply));
        }
    }
}

/// A pipe end the drain loop reads.
trait ReadFd: Read + Send {
    fn fd(&self) -> std::os::fd::RawFd;
}

impl<T: Read + AsRawFd + Send> ReadFd for T {
    fn fd(&self) -> std::os::fd::RawFd {
        self.as_raw_fd()
    }
}

fn not_found(process_id: u32) -> ProcReply {
    ProcReply::Refused {
        code: ProcErrorCode::NotFound,
        message: format!("no background process {process_id}"),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table_with(ids: std::ops::Range<u32>) -> Table {
        let mut table = Table::default();
        for id in ids {
            table.procs.insert(
                id,
                Proc {
                    pid: 0,
                    control: ExecControl::new().unwrap(),
                    ring: VecDeque::new(),
                    total: 0,
                    exit_code: None,
                },
            );
        }
        table
    }

    fn ring(table: &Table, id: u32) -> Vec<u8> {
        table.procs[&id].ring.iter().copied().collect()
    }

    #[test]
    fn a_ring_keeps_the_last_bytes_within_its_own_and_the_total_bound() {
        let mut table = table_with(1..8);
        table.append(1, b"hello ");
        table.append(1, b"world");
        assert_eq!(table.procs[&1].total, 11);
        assert_eq!(ring(&table, 1), b"hello world");
        // A flood keeps only the last RING_BYTES, contiguous up to `total`.
        let flood: Vec<u8> = (0..3 * RING_BYTES).map(|i| (i % 251) as u8).collect();
        table.append(1, &flood);
        assert_eq!(ring(&table, 1), &flood[flood.len() - RING_BYTES..]);
        assert_eq!(table.procs[&1].total, 11 + flood.len() as u64);
        // Six flooding processes share RINGS_TOTAL_BYTES; a quiet one still gets its line.
        for id in 2..7 {
            table.append(id, &flood);
        }
        table.append(7, b"line\n");
        let held: usize = table.procs.values().map(|p| p.ring.len()).sum();
        assert!(held <= RINGS_TOTAL_BYTES, "{held}");
        assert_eq!(table.used, held);
        assert_eq!(ring(&table, 7), b"line\n");
        // Whatever a ring keeps is the tail of what its process wrote.
        for id in 1..7 {
            let kept = ring(&table, id);
            assert_eq!(kept, &flood[flood.len() - kept.len()..], "{id}");
        }
    }

    #[test]
    fn ended_processes_past_the_bound_are_forgotten_oldest_first() {
        let count = MAX_ENDED_PROCESSES as u32 + 3;
        let mut table = table_with(1..count + 1);
        for id in 1..=count {
            table.append(id, b"x");
            table.procs.get_mut(&id).unwrap().exit_code = Some(0);
        }
        table.forget_ended();
        assert_eq!(table.procs.len(), MAX_ENDED_PROCESSES - 1);
        assert!(!table.procs.contains_key(&1) && table.procs.contains_key(&count));
        assert_eq!(table.used, table.procs.len());
    }
}
