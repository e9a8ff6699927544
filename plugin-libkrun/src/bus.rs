//! A worker VM's one way to the bus, host side. The VM has no network (no TSI: it would map
//! the guest's `connect()` onto every socket of the host); the agent in the guest listens on
//! the guest's loopback at the engine's port and carries each connection over a vsock port,
//! which libkrun bridges to a unix socket in the VM's layer. Here each connection on that
//! socket is joined to the engine's address, and nothing else is ever dialled, whatever the
//! guest sends.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpStream, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// The guest's vsock port for the bus (the agent's own link is 1024).
pub const BUS_VSOCK_PORT: u32 = 1025;
/// Connections carried at once for one VM; more wait for a free slot.
const MAX_CONNECTIONS: usize = 64;

/// The forwarding task of one VM; ends when dropped (with the VM's process).
pub struct BusForward {
    task: JoinHandle<()>,
}

impl BusForward {
    /// Serves `listener` (the VM's bus socket), joining every connection to `engine`.
    pub fn start(listener: UnixListener, engine: SocketAddr) -> Self {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            loop {
                let Ok(slot) = slots.clone().acquire_owned().await else {
                    return;
                };
                let Ok((mut guest, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let _slot = slot;
                    match TcpStream::connect(engine).await {
                        Ok(mut bus) => {
                            let _ = tokio::io::copy_bidirectional(&mut guest, &mut bus).await;
                        }
                        Err(e) => {
                            tracing::warn!(%engine, "a worker VM's bus connection: cannot reach the engine: {e}")
                        }
                    }
                });
            }
        });
        Self { task }
    }
}

impl Drop for BusForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn each_connection_reaches_the_engine_and_ends_with_the_forward() {
        let dir = tempfile::tempdir().unwrap();
        let engine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let engine_addr = engine.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = engine.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 5];
                    conn.read_exact(&mut buf).await.unwrap();
                    conn.write_all(&buf.map(|b| b.to_ascii_uppercase()))
                        .await
                        .unwrap();
                });
            }
        });
        let path = dir.path().join("bus.sock");
        let forward = BusForward::start(UnixListener::bind(&path).unwrap(), engine_addr);
        for _ in 0..3 {
            let mut guest = tokio::net::UnixStream::connect(&path).await.unwrap();
            guest.write_all(b"hello").await.unwrap();
            let mut answer = [0u8; 5];
            guest.read_exact(&mut answer).await.unwrap();
            assert_eq!(&answer, b"HELLO");
        }
        drop(forward);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // The listener went with the task: nobody accepts any more.
        let late = tokio::net::UnixStream::connect(&path).await;
        assert!(
            late.is_err(),
            "the socket still accepts after the forward ended"
        );
    }
}
