//! The bus forward of a sandbox behind a gate: the engine (a bwrap worker VM's way to the bus)
//! or the sandbox's endpoint of the adapter's bus guard (a plain sandbox's, only through the
//! guard) listens on the host's loopback, which no packet from the sandbox's namespace can
//! reach (the gate never forwards loopback). A process of the host's network namespace, forked
//! before the sandbox's namespaces exist, takes over listening sockets bound at the sandbox's
//! own loopback on the engine's port and splices each connection to that one destination,
//! fixed here, whatever the sandbox sends.
//!
//! Hand-written rather than pasta's `--tcp-ns`: pasta serves the namespace it is attached to,
//! which is the gate's, not the sandbox's.

// Forking and taking over descriptors are what nix leaves unsafe.
#![allow(unsafe_code)]

use std::io::{IoSlice, IoSliceMut};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use nix::unistd::{fork, ForkResult, Pid};

use crate::netns::{become_helper, seqpacket_pair};

/// What the forwarder's process calls itself (`/proc/PID/comm`).
pub const FORWARDER_NAME: &str = "iii-bus-forward";
/// Connections served at once; more are closed as they come (a sandbox cannot make the
/// forwarder hold an unbounded number of host sockets and threads).
const MAX_CONNECTIONS: usize = 64;
/// How long a connection to the bus may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Listening sockets handed over at most (127.0.0.1 and ::1).
const MAX_LISTENERS: usize = 4;

/// The forwarder's process, waiting for its listening sockets. Dropped unused, it exits.
pub(crate) struct BusForwarder {
    socket: OwnedFd,
}

impl BusForwarder {
    /// Forks the forwarder while the caller is still in the host's network namespace. Call
    /// while single-threaded (it forks).
    pub(crate) fn fork(bus: SocketAddr) -> std::io::Result<BusForwarder> {
        let (ours, theirs) = seqpacket_pair()?;
        let parent = nix::unistd::getpid();
        // SAFETY: the starter is single-threaded; the child runs its own code from scratch
        // (threads of its own only after this point) and never returns into the starter's.
        match unsafe { fork() }? {
            ForkResult::Child => {
                drop(ours);
                let error = become_forwarder(theirs, parent, bus);
                eprintln!("{}: bus forward: {error}", crate::program());
                // SAFETY: _exit ends the forked child without the parent's destructors.
                unsafe { libc::_exit(1) }
            }
            ForkResult::Parent { .. } => Ok(BusForwarder { socket: ours }),
        }
    }

    /// Hands the forwarder its listening sockets (ours are closed on return: the sandbox never
    /// holds them).
    pub(crate) fn hand_over(self, listeners: &[TcpListener]) -> Result<(), String> {
        let fds: Vec<_> = listeners.iter().map(AsRawFd::as_raw_fd).collect();
        let count = [u8::try_from(fds.len()).unwrap_or(0)];
        sendmsg::<()>(
            self.socket.as_raw_fd(),
            &[IoSlice::new(&count)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| format!("cannot start the bus forward: {e}"))?;
        Ok(())
    }
}

/// The bus's port at the sandbox's loopback (127.0.0.1, and ::1 where the namespace has it),
/// bound before the sandbox exists so nothing of its own can take the port first.
pub(crate) fn listeners(port: u16) -> Result<Vec<TcpListener>, String> {
    let v4 = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
        .map_err(|e| format!("cannot listen for the bus at the sandbox's 127.0.0.1:{port}: {e}"))?;
    let mut out = vec![v4];
    out.extend(TcpListener::bind((std::net::Ipv6Addr::LOCALHOST, port)).ok());
    Ok(out)
}

/// The forwarder's side: tied to the starter's life, detached from the agent's channel, out of
/// reach of the sandbox's processes; waits for its listening sockets and serves. Returns only
/// on failure.
fn become_forwarder(socket: OwnedFd, parent: Pid, bus: SocketAddr) -> String {
    let socket = match become_helper(socket, parent, FORWARDER_NAME) {
        Ok(socket) => socket,
        Err(e) => return e,
    };
    // It only connects to one address of the host's loopback: no capability at all.
    if let Err(e) = crate::privilege::keep_only(&[]) {
        return format!("cannot give up privilege: {e}");
    }
    let mut count = [0u8; 1];
    let mut iov = [IoSliceMut::new(&mut count)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; MAX_LISTENERS]);
    let listeners: Vec<TcpListener> = match recvmsg::<()>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    ) {
        Ok(message) if message.bytes == 0 => {
            // The starter failed before the network was up, and said why.
            // SAFETY: _exit ends the forked child without the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        Ok(message) => message
            .cmsgs()
            .into_iter()
            .flatten()
            .filter_map(|cmsg| match cmsg {
                ControlMessageOwned::ScmRights(fds) => Some(fds),
                _ => None,
            })
            .flatten()
            // SAFETY: the kernel just gave us these descriptors; nothing else owns them.
            .map(|fd| TcpListener::from(unsafe { OwnedFd::from_raw_fd(fd) }))
            .collect(),
        Err(e) => return format!("no word from the launcher: {e}"),
    };
    drop(socket);
    if listeners.is_empty() {
        return "no listening socket in the hand-over".into();
    }
    let active = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for listener in listeners {
        let active = Arc::clone(&active);
        threads.push(std::thread::spawn(move || serve(listener, bus, active)));
    }
    for thread in threads {
        let _ = thread.join();
    }
    "every listening socket failed".into()
}

/// Accepts on `listener` for as long as it lives, one pair of copying threads a connection.
fn serve(listener: TcpListener, bus: SocketAddr, active: Arc<AtomicUsize>) {
    loop {
        let Ok((guest, _)) = listener.accept() else {
            // EMFILE and the like pass; a listener that is gone ends the loop.
            if listener.local_addr().is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let Some(slot) = Slot::take(&active) else {
            continue;
        };
        // A thread that could not start drops its closure, the slot with it.
        let _ = std::thread::Builder::new()
            .stack_size(64 * 1024)
            .spawn(move || {
                if let Ok(host) = TcpStream::connect_timeout(&bus, CONNECT_TIMEOUT) {
                    splice_both_ways(guest, host);
                }
                drop(slot);
            });
    }
}

/// One of the [`MAX_CONNECTIONS`] served at once, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(active: &Arc<AtomicUsize>) -> Option<Slot> {
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(Arc::clone(active)))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Copies each direction until its end closes, passing the close on.
fn splice_both_ways(guest: TcpStream, host: TcpStream) {
    let (Ok(guest_reader), Ok(host_writer)) = (guest.try_clone(), host.try_clone()) else {
        return;
    };
    let upstream = std::thread::Builder::new()
        .stack_size(64 * 1024)
        .spawn(move || copy_then_close(guest_reader, host_writer));
    copy_then_close(host, guest);
    if let Ok(upstream) = upstream {
        let _ = upstream.join();
    }
}

fn copy_then_close(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
