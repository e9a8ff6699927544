//! A worker VM's one way to the bus (libkrun): the guest has no network device and no TSI, so
//! the agent listens on the guest's loopback at the engine's port and carries each connection
//! over vsock to the host, where the adapter connects it to the engine and nowhere else.
//! `III_URL` (`ws://127.0.0.1:PORT`) then works unchanged inside the guest.
//!
//! Plain threads like the rest of the agent: two per connection (one each way), at most
//! [`MAX_CONNECTIONS`] connections at once, so a guest that opens sockets in a loop only
//! exhausts its own forwarder.

use std::fs::File;
use std::io::{self, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::log::log;
use crate::sys;

/// Connections carried at once; more are closed at once.
const MAX_CONNECTIONS: usize = 64;

/// `GUEST_PORT:VSOCK_PORT`, as `--bus-forward` takes it.
pub fn parse(spec: &str) -> Option<(u16, u32)> {
    let (tcp, vsock) = spec.split_once(':')?;
    let tcp: u16 = tcp.parse().ok().filter(|p| *p != 0)?;
    Some((tcp, vsock.parse().ok()?))
}

/// Brings the loopback up and binds `127.0.0.1:tcp_port`. Before `--confine` (raising an
/// interface takes CAP_NET_ADMIN, which the confined agent no longer has).
pub fn listen(tcp_port: u16) -> io::Result<TcpListener> {
    sys::loopback_up()?;
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, tcp_port))
}

/// Serves `listener` in a thread of its own, each connection carried to `vsock_port`.
pub fn start(listener: TcpListener, vsock_port: u32) -> io::Result<()> {
    std::thread::Builder::new()
        .name("bus-forward".into())
        .spawn(move || serve(listener, vsock_port))?;
    Ok(())
}

fn serve(listener: TcpListener, vsock_port: u32) {
    let live = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        let Ok(tcp) = conn else { continue };
        if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            let _ = tcp.shutdown(Shutdown::Both);
            continue;
        }
        let host = match sys::vsock_connect(vsock_port) {
            Ok(fd) => File::from(fd),
            Err(e) => {
                log!("bus forward: cannot reach the host over vsock port {vsock_port}: {e}");
                continue;
            }
        };
        live.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = carry(tcp, host, live.clone()) {
            live.fetch_sub(1, Ordering::Relaxed);
            log!("bus forward: cannot start a connection's threads: {e}");
        }
    }
}

/// Copies both ways; each direction passes its end of stream on as a half-close, and the
/// connection counts as live until both directions are done.
fn carry(tcp: TcpStream, host: File, live: Arc<AtomicUsize>) -> io::Result<()> {
    let tcp_back = tcp.try_clone()?;
    let host_back = host.try_clone()?;
    let directions_left = Arc::new(AtomicUsize::new(2));
    let done = {
        let directions_left = directions_left.clone();
        move || {
            if directions_left.fetch_sub(1, Ordering::AcqRel) == 1 {
                live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    };
    let done_up = done.clone();
    std::thread::Builder::new()
        .name("bus-up".into())
        .spawn(move || {
            let (mut tcp, mut host) = (tcp, host);
            let _ = io::copy(&mut tcp, &mut host);
            sys::shutdown_write(&host);
            done_up();
        })?;
    std::thread::Builder::new()
        .name("bus-down".into())
        .spawn(move || {
            let (mut host, mut tcp) = (host_back, tcp_back);
            let _ = io::copy(&mut host, &mut tcp);
            let _ = tcp.flush();
            let _ = tcp.shutdown(Shutdown::Write);
            done();
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn the_flag_takes_two_ports() {
        assert_eq!(parse("49134:1025"), Some((49134, 1025)));
        for bad in ["", "49134", "0:1025", "x:1", "1:x", "70000:1", "1:2:3"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
