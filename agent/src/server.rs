//! The reader loop: handshake, then every frame from the host dispatched by kind and
//! request id. Work runs on other threads; this loop only routes.

use std::collections::HashMap;
use std::io::Read;
use std::sync::{Arc, Mutex};

use agent_proto::{
    ErrorCode, Frame, FrameError, FsRequest, Hello, Message, RequestError, FEATURE_EXEC_FLOW,
    FEATURE_EXEC_SIGNAL, FEATURE_EXEC_TTY, FEATURE_PROCESSES, FEATURE_TCP_STREAM, PROTOCOL_VERSION,
};

use crate::exec::background::Background;
use crate::exec::{self, ExecContext, ExecHandle};
use crate::fs;
use crate::log::log;
use crate::tcp::Streams;
use crate::watch::Watches;

/// Largest fs write body the agent buffers; larger files are written in appended parts.
const MAX_WRITE_BODY: usize = 64 * 1024 * 1024;

/// Why serving stopped.
#[derive(Debug, thiserror::Error)]
pub enum Ending {
    #[error("host asked for shutdown")]
    Shutdown,
    #[error("host closed the stream")]
    StreamClosed,
    #[error("stream broken: {0}")]
    StreamBroken(FrameError),
    #[error("handshake failed: {0}")]
    Handshake(String),
}

type Execs = Arc<Mutex<HashMap<u32, ExecHandle>>>;

struct Server {
    ctx: ExecContext,
    execs: Execs,
    /// fs requests whose body is still arriving.
    bodies: HashMap<u32, (FsRequest, Vec<u8>)>,
    /// TCP streams to the sandbox's loopback (the host's exposed ports).
    streams: Streams,
    /// File watches (`WatchStart`).
    watches: Watches,
    /// Background processes (`ProcRequest`).
    background: Background,
}

pub fn serve(reader: &mut dyn Read, ctx: ExecContext) -> Ending {
    let software = concat!("sandbox-agent ", env!("CARGO_PKG_VERSION"));
    let hello = Hello::new(software).with_features(&[
        FEATURE_EXEC_FLOW,
        FEATURE_EXEC_TTY,
        FEATURE_TCP_STREAM,
        agent_proto::FEATURE_FS_WATCH,
        FEATURE_EXEC_SIGNAL,
        FEATURE_PROCESSES,
    ]);
    ctx.outbox.send(0, Message::Hello(hello));
    if let Err(e) = handshake(reader, &ctx) {
        return e;
    }
    let mut server = Server {
        ctx,
        execs: Arc::default(),
        bodies: HashMap::new(),
        streams: Streams::default(),
        watches: Watches::default(),
        background: Background::default(),
    };
    loop {
        let frame = match Frame::read_from(reader) {
            Ok(frame) => frame,
            Err(FrameError::Closed) => return Ending::StreamClosed,
            Err(e) => return Ending::StreamBroken(e),
        };
        let id = frame.id;
        match Message::from_frame(frame) {
            Ok(Message::Shutdown) => {
                server.kill_all();
                sync_root();
                server.ctx.outbox.send(id, Message::ShutdownAck);
                return Ending::Shutdown;
            }
            Ok(msg) => server.dispatch(id, msg),
            Err(e) => server.refuse(id, ErrorCode::BadRequest, e.to_string()),
        }
    }
}

fn handshake(reader: &mut dyn Read, ctx: &ExecContext) -> Result<(), Ending> {
    let frame = Frame::read_from(reader).map_err(|e| Ending::Handshake(e.to_string()))?;
    match Message::from_frame(frame) {
        Ok(Message::Hello(h)) if h.version == PROTOCOL_VERSION => {
            log!("host connected ({}, protocol {})", h.software, h.version);
            Ok(())
        }
        Ok(Message::Hello(h)) => {
            let why = format!(
                "host speaks protocol {}, this agent speaks {PROTOCOL_VERSION}",
                h.version
            );
            let err = RequestError::new(ErrorCode::VersionMismatch, why.clone());
            ctx.outbox.send(0, Message::Error(err));
            Err(Ending::Handshake(why))
        }
        Ok(other) => Err(Ending::Handshake(format!("expected Hello, got {other:?}"))),
        Err(e) => Err(Ending::Handshake(e.to_string())),
    }
}

impl Server {
    fn dispatch(&mut self, id: u32, msg: Message) {
        match msg {
            Message::ExecStart(req) => self.start_exec(id, req),
            Message::Stdin { data, end } => {
                let mut execs = lock(&self.execs);
                if let Some(handle) = execs.get_mut(&id) {
                    if let Some(tx) = &handle.stdin {
                        // The program may be gone already; its stdin is then moot.
                        let _ = tx.send(data);
                    }
                    if end {
                        handle.stdin = None;
                    }
                }
            }
            Message::OutputAck(ack) => {
                // An ack for an exec that has just ended is moot, not an error.
                if let Some(handle) = lock(&self.execs).get(&id) {
                    handle.control.ack_output(ack.bytes);
                }
            }
            Message::Resize(size) => {
                // A size for an exec that has just ended, or has no terminal, is moot.
                if let Some(handle) = lock(&self.execs).get(&id) {
                    handle.terminal.resize(id, size);
                }
            }
            Message::ExecKill => {
                if let Some(handle) = lock(&self.execs).get(&id) {
                    handle.control.request_kill();
                }
            }
            Message::ExecSignal(signal) => {
                // Only the signals a host may ask for (another is ignored: refusing it on
                // the exec's id would end the host's wait while the program runs on); a
                // signal for an exec that has just ended is moot.
                if !agent_proto::process::ALLOWED_SIGNALS.contains(&signal.signal) {
                    log!(
                        "exec {id}: signal {} is not one a host may send",
                        signal.signal
                    );
                } else if let Some(handle) = lock(&self.execs).get(&id) {
                    handle.control.request_signal(signal.signal);
                }
            }
            Message::ProcRequest(request) => self.background.handle(id, request, &self.ctx),
            Message::FsRequest { request, has_body } => {
                if has_body {
                    self.bodies.insert(id, (request, Vec::new()));
                } else {
                    self.run_fs(id, request, Vec::new());
                }
            }
            Message::Data { data, end } => self.fs_body(id, data, end),
            Message::TcpConnect(request) => self.streams.connect(id, request, &self.ctx.outbox),
            Message::TcpData { data, end } => self.streams.data(id, data, end),
            Message::TcpAck(ack) => self.streams.ack(id, ack.bytes),
            Message::TcpClose => self.streams.close(id),
            Message::WatchStart(request) => self.watches.start(id, request, &self.ctx.outbox),
            Message::WatchAck(ack) => self.watches.ack(id, ack.bytes),
            Message::WatchStop => self.watches.stop(id),
            other => {
                let what = format!("{other:?}").chars().take(80).collect::<String>();
                self.refuse(
                    id,
                    ErrorCode::BadRequest,
                    format!("unexpected message {what}"),
                );
            }
        }
    }

    fn start_exec(&mut self, id: u32, req: agent_proto::ExecRequest) {
        let mut execs = lock(&self.execs);
        if execs.contains_key(&id) {
            drop(execs);
            return self.refuse(
                id,
                ErrorCode::DuplicateId,
                format!("request {id} is running"),
            );
        }
        let registry = self.execs.clone();
        match exec::start(id, req, self.ctx.clone(), move || {
            lock(&registry).remove(&id);
        }) {
            Ok(handle) => {
                execs.insert(id, handle);
            }
            Err(e) => {
                drop(execs);
                self.refuse(
                    id,
                    ErrorCode::SpawnFailed,
                    format!("no thread for exec: {e}"),
                );
            }
        }
    }

    fn fs_body(&mut self, id: u32, data: Vec<u8>, end: bool) {
        let Some((_, body)) = self.bodies.get_mut(&id) else {
            return self.refuse(id, ErrorCode::BadRequest, "data for no fs request".into());
        };
        if body.len() + data.len() > MAX_WRITE_BODY {
            self.bodies.remove(&id);
            let why = format!("write body over {MAX_WRITE_BODY} bytes: send it in appended parts");
            return self.refuse(id, ErrorCode::BadRequest, why);
        }
        body.extend_from_slice(&data);
        if end {
            if let Some((request, body)) = self.bodies.remove(&id) {
                self.run_fs(id, request, body);
            }
        }
    }

    /// fs calls run on threads of their own, each within its deadline (see `fs::start`).
    fn run_fs(&self, id: u32, request: FsRequest, body: Vec<u8>) {
        fs::start(id, request, body, &self.ctx.outbox);
    }

    fn refuse(&self, id: u32, code: ErrorCode, message: String) {
        log!("request {id} refused: {message}");
        self.ctx
            .outbox
            .send(id, Message::Error(RequestError::new(code, message)));
    }

    fn kill_all(&self) {
        self.streams.close_all();
        self.watches.stop_all();
        self.background.kill_all();
        for handle in lock(&self.execs).values() {
            handle.control.request_kill();
        }
        self.ctx.table.signal_all(libc::SIGKILL);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes what the root's filesystem holds in memory to its disk before the host ends the
/// sandbox: a VM whose layer is its own virtio-blk disk (an ordinary user's worker VM) would
/// lose the writes of its last seconds, which sit in the guest's page cache until the next
/// commit. `syncfs` of the root only (and the binds of the same filesystem, `/state`), not
/// `sync`, which on bwrap would flush the whole host.
fn sync_root() {
    if let Ok(root) = std::fs::File::open("/") {
        use std::os::fd::AsRawFd;
        // SAFETY: syncfs on a descriptor we own for the duration of the call.
        unsafe { libc::syncfs(root.as_raw_fd()) };
    }
}
