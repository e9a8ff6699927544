//! TCP streams to servers on the sandbox's loopback, for the host's exposed ports (see
//! `agent_proto::tcp` for the wire). Each stream has two threads: one connects and then
//! reads the server (sending at most the host's window unacknowledged, so a server that
//! talks faster than the host's client reads is held by its own socket), one writes what
//! the host sends to the server and acknowledges it. The last of the two to end sends
//! `TcpClose` and forgets the stream.
//!
//! The socket is non-blocking and each thread waits in `poll` between its reads or writes,
//! never inside one: with libkrun's TSI (a microVM with network) every inet socket of the
//! guest is an AF_TSI socket whose read and write hold one lock for as long as they block, so
//! a read waiting for the server's answer would keep the writer from sending the request the
//! server waits for (an HTTP GET hung so).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use agent_proto::tcp::CONNECT_TIMEOUT;
use agent_proto::{
    flow_cost, ErrorCode, FlowAck, Message, RequestError, TcpConnect, CHUNK_SIZE,
    FLOW_CHUNK_OVERHEAD, MAX_TCP_STREAMS,
};

use crate::outbox::Outbox;

/// Stack of each stream thread: they only copy between a socket and the link, through
/// heap buffers.
const THREAD_STACK: usize = 128 * 1024;

/// The streams open now, by request id.
#[derive(Clone, Default)]
pub struct Streams {
    map: Arc<Mutex<HashMap<u32, Handle>>>,
}

/// What the reader loop keeps of one stream.
struct Handle {
    /// Bytes for the server; dropping it ends the writer thread.
    up: Sender<Up>,
    shared: Arc<Shared>,
}

enum Up {
    Data(Vec<u8>),
    End,
}

struct Shared {
    window: u64,
    flow: Mutex<Flow>,
    wake: Condvar,
    /// Threads of the stream still running; the last one out sends `TcpClose`.
    running: AtomicUsize,
}

#[derive(Default)]
struct Flow {
    /// Cost sent to the host and acknowledged by it.
    sent: u64,
    acked: u64,
    /// Cost the host sent that the writer has not written yet.
    up_pending: u64,
    /// A clone of the connection, once up, so an abort can shut it down under the threads.
    socket: Option<TcpStream>,
    aborted: bool,
}

impl Shared {
    fn flow(&self) -> MutexGuard<'_, Flow> {
        self.flow.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops both directions: blocked reads and writes return, the reader's wait ends.
    fn abort(&self) {
        let mut flow = self.flow();
        flow.aborted = true;
        if let Some(socket) = &flow.socket {
            let _ = socket.shutdown(Shutdown::Both);
        }
        self.wake.notify_all();
    }

    /// Waits until the host's window has room; the payload bytes it has, or `None` once
    /// the stream is aborted.
    fn room(&self) -> Option<usize> {
        let mut flow = self.flow();
        loop {
            if flow.aborted {
                return None;
            }
            let in_flight = flow.sent.saturating_sub(flow.acked);
            let room = self
                .window
                .saturating_sub(in_flight)
                .saturating_sub(FLOW_CHUNK_OVERHEAD);
            if room > 0 {
                return Some(room.min(CHUNK_SIZE as u64) as usize);
            }
            flow = self.wake.wait(flow).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Streams {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Handle>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `TcpConnect`: connects on a thread of its own and answers there.
    pub fn connect(&self, id: u32, request: TcpConnect, outbox: &Outbox) {
        let refuse = |code, message: String| {
            outbox.send(id, Message::Error(RequestError::new(code, message)));
        };
        let mut map = self.lock();
        if map.contains_key(&id) {
            return refuse(ErrorCode::DuplicateId, format!("stream {id} is open"));
        }
        if map.len() >= MAX_TCP_STREAMS {
            return refuse(
                ErrorCode::Busy,
                format!("{MAX_TCP_STREAMS} streams are open, the agent's limit"),
            );
        }
        let (up, up_rx) = mpsc::channel();
        let shared = Arc::new(Shared {
            window: request.window,
            flow: Mutex::new(Flow::default()),
            wake: Condvar::new(),
            running: AtomicUsize::new(1),
        });
        let (streams, thread_shared, thread_outbox) =
            (self.clone(), shared.clone(), outbox.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("tcp-{id}"))
            .stack_size(THREAD_STACK)
            .spawn(move || {
                let port = request.port;
                if run(id, port, &thread_shared, up_rx, &streams, &thread_outbox) {
                    streams.finished(id, &thread_shared, &thread_outbox);
                }
            });
        match spawned {
            Ok(_) => {
                map.insert(id, Handle { up, shared });
            }
            Err(e) => refuse(ErrorCode::Busy, format!("no thread for the stream: {e}")),
        }
    }

    /// `TcpData` from the host. Past the window the host promised is a broken host: the
    /// stream ends rather than the agent buffering without bound.
    pub fn data(&self, id: u32, data: Vec<u8>, end: bool) {
        let mut map = self.lock();
        let Some(handle) = map.get(&id) else {
            return; // a stream that has just ended
        };
        if !data.is_empty() {
            let mut flow = handle.shared.flow();
            flow.up_pending = flow.up_pending.saturating_add(flow_cost(data.len()));
            let over = flow.up_pending > handle.shared.window;
            drop(flow);
            if over {
                let handle = map.remove(&id);
                drop(map);
                if let Some(handle) = handle {
                    handle.shared.abort();
                }
                return;
            }
            let _ = handle.up.send(Up::Data(data));
        }
        if end {
            let _ = handle.up.send(Up::End);
        }
    }

    /// `TcpAck` from the host: room in the window for the server's bytes.
    pub fn ack(&self, id: u32, bytes: u64) {
        if let Some(handle) = self.lock().get(&id) {
            let mut flow = handle.shared.flow();
            flow.acked = flow.acked.saturating_add(bytes).min(flow.sent);
            handle.shared.wake.notify_all();
        }
    }

    /// `TcpClose` from the host (or the agent shutting down): the stream ends at once.
    pub fn close(&self, id: u32) {
        let handle = self.lock().remove(&id);
        if let Some(handle) = handle {
            handle.shared.abort();
        }
    }

    pub fn close_all(&self) {
        let handles: Vec<Handle> = self.lock().drain().map(|(_, h)| h).collect();
        for handle in handles {
            handle.shared.abort();
        }
    }

    /// One thread of stream `id` is done; the last one says so to the host.
    fn finished(&self, id: u32, shared: &Shared, outbox: &Outbox) {
        if shared.running.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        // Forget it only if the map still holds this stream (not a later one of that id).
        let mut map = self.lock();
        if map
            .get(&id)
            .is_some_and(|h| std::ptr::eq(Arc::as_ptr(&h.shared), shared))
        {
            map.remove(&id);
        }
        drop(map);
        outbox.send(id, Message::TcpClose);
    }
}

/// The first thread of a stream: connect, answer, start the writer, then read the server.
/// False when the connect failed: the host got an `Error` instead of a stream, and no
/// `TcpClose` follows it.
fn run(
    id: u32,
    port: u16,
    shared: &Arc<Shared>,
    up_rx: Receiver<Up>,
    streams: &Streams,
    outbox: &Outbox,
) -> bool {
    let connected = connect(port).and_then(|socket| {
        socket.set_nonblocking(true)?;
        Ok(socket)
    });
    let mut socket = match connected {
        Ok(socket) => socket,
        Err(e) => {
            let why = format!("nothing answers on port {port} of the sandbox's loopback: {e}");
            streams.lock().remove(&id);
            let err = RequestError::new(ErrorCode::ConnectFailed, why);
            outbox.send(id, Message::Error(err));
            return false;
        }
    };
    {
        let mut flow = shared.flow();
        if flow.aborted {
            return true;
        }
        match socket.try_clone() {
            Ok(clone) => flow.socket = Some(clone),
            Err(_) => return true,
        }
    }
    let _ = socket.set_nodelay(true);
    let writer = match socket.try_clone() {
        Ok(writer) => writer,
        Err(_) => return true,
    };
    outbox.send(id, Message::TcpConnected);
    shared.running.fetch_add(1, Ordering::SeqCst);
    let (writer_shared, writer_streams, writer_outbox) =
        (shared.clone(), streams.clone(), outbox.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("tcp-up-{id}"))
        .stack_size(THREAD_STACK)
        .spawn(move || {
            write_up(id, writer, &writer_shared, up_rx, &writer_outbox);
            writer_streams.finished(id, &writer_shared, &writer_outbox);
        });
    if spawned.is_err() {
        shared.running.fetch_sub(1, Ordering::SeqCst);
        shared.abort();
        return true;
    }
    read_down(id, &mut socket, shared, outbox);
    true
}

/// 127.0.0.1 first, then ::1 for a server that listens on IPv6's loopback only.
fn connect(port: u16) -> std::io::Result<TcpStream> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match TcpStream::connect_timeout(&v4, CONNECT_TIMEOUT) {
        Ok(socket) => Ok(socket),
        Err(e) => {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            TcpStream::connect_timeout(&v6, CONNECT_TIMEOUT).map_err(|_| e)
        }
    }
}

/// Waits until `socket` is ready for `events` (`POLLIN`, `POLLOUT`); whether it reported a
/// hang-up or an error. No timeout, so an idle stream costs the guest nothing: an abort shuts
/// the socket down, which ends the wait.
fn wait_ready(socket: &TcpStream, events: libc::c_short) -> std::io::Result<bool> {
    let mut fd = libc::pollfd {
        fd: socket.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `fd` is one valid pollfd that outlives the call; the descriptor is `socket`'s.
    let rc = unsafe { libc::poll(&mut fd, 1, -1) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0)
}

/// The server's bytes to the host within the window; its end of file as an empty `end`.
fn read_down(id: u32, socket: &mut TcpStream, shared: &Shared, outbox: &Outbox) {
    let mut buf = vec![0u8; CHUNK_SIZE];
    // A hang-up `poll` reported, after which a read that would block means a broken socket.
    let mut hung_up = false;
    loop {
        let Some(room) = shared.room() else {
            return;
        };
        match socket.read(&mut buf[..room]) {
            Ok(0) => {
                if !shared.flow().aborted {
                    let end = Message::TcpData {
                        data: Vec::new(),
                        end: true,
                    };
                    outbox.send(id, end);
                }
                return;
            }
            Ok(n) => {
                let mut flow = shared.flow();
                if flow.aborted {
                    return;
                }
                flow.sent = flow.sent.saturating_add(flow_cost(n));
                drop(flow);
                let data = buf[..n].to_vec();
                outbox.send(id, Message::TcpData { data, end: false });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if hung_up || shared.flow().aborted {
                    return shared.abort();
                }
                match wait_ready(socket, libc::POLLIN) {
                    Ok(hangup) => hung_up = hangup,
                    Err(_) => return shared.abort(),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return shared.abort(),
        }
    }
}

/// All of `data` to the non-blocking `socket`, waiting in `poll` while it is full; an error
/// once the stream is aborted or the socket broken.
fn write_ready(socket: &mut TcpStream, mut data: &[u8], shared: &Shared) -> std::io::Result<()> {
    let mut hung_up = false;
    while !data.is_empty() {
        match socket.write(data) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if hung_up || shared.flow().aborted {
                    return Err(std::io::ErrorKind::ConnectionAborted.into());
                }
                hung_up = wait_ready(socket, libc::POLLOUT)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The host's bytes to the server, each chunk acknowledged once written; the host's end as
/// a shutdown of the socket's sending side.
fn write_up(id: u32, mut socket: TcpStream, shared: &Shared, up: Receiver<Up>, outbox: &Outbox) {
    for msg in up {
        match msg {
            Up::Data(data) => {
                if write_ready(&mut socket, &data, shared).is_err() {
                    return shared.abort();
                }
                let cost = flow_cost(data.len());
                let mut flow = shared.flow();
                flow.up_pending = flow.up_pending.saturating_sub(cost);
                if flow.aborted {
                    return;
                }
                drop(flow);
                outbox.send(id, Message::TcpAck(FlowAck { bytes: cost }));
            }
            Up::End => {
                let _ = socket.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}
