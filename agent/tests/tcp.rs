//! TCP streams to a loopback port through the real agent binary and the real client: bytes
//! both ways unchanged, half-closes, refusals, the host's close, and a stream whose reader
//! stalls leaving the link free for execs.

mod common;

use std::time::{Duration, Instant};

use agent_proto::client::TcpEvent;
use agent_proto::{AgentError, ErrorCode};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const WINDOW: u64 = 128 * 1024;

async fn listener() -> (TcpListener, u16) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    (listener, port)
}

#[tokio::test]
async fn bytes_cross_both_ways_unchanged_and_half_closes_pass() {
    let agent = start_agent().await;
    let (listener, port) = listener().await;
    // An echo server that closes its side once the client has closed its own.
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 8192];
        loop {
            let n = socket.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            socket.write_all(&buf[..n]).await.unwrap();
        }
        socket.shutdown().await.unwrap();
    });
    let (mut reader, writer) = agent.client.tcp_connect(port, WINDOW).await.unwrap();
    let big: Vec<u8> = (0..3 * MIB + 17).map(|i| (i * 7 % 251) as u8).collect();
    let sent = big.clone();
    let send = tokio::spawn(async move {
        assert!(writer.send(&sent).await.unwrap());
        writer.finish().await.unwrap();
        writer
    });
    let mut got = Vec::new();
    let mut ended = false;
    while let Some(event) = tokio::time::timeout(Duration::from_secs(30), reader.recv())
        .await
        .expect("the echo keeps coming")
    {
        match event {
            TcpEvent::Data(data) => {
                assert!(!ended, "no bytes after the server's end");
                reader.consumed(data.len()).await.unwrap();
                got.extend_from_slice(&data);
            }
            TcpEvent::End => ended = true,
        }
    }
    let _writer = send.await.unwrap();
    server.await.unwrap();
    assert!(ended, "the server's shutdown arrives as End");
    assert_eq!(got.len(), big.len());
    assert!(got == big, "the echo comes back byte for byte");
}

#[tokio::test]
async fn a_port_nobody_listens_on_is_refused() {
    let agent = start_agent().await;
    let (listener, port) = listener().await;
    drop(listener);
    match agent.client.tcp_connect(port, WINDOW).await {
        Err(AgentError::Request(e)) => assert_eq!(e.code, ErrorCode::ConnectFailed, "{e}"),
        Err(other) => panic!("expected ConnectFailed, got {other}"),
        Ok(_) => panic!("a closed port connected"),
    }
    // The link is whole: an exec still runs.
    assert_eq!(
        text(&run(&agent, spec(&["echo", "ok"])).await.stdout),
        "ok\n"
    );
}

#[tokio::test]
async fn dropping_the_stream_closes_the_servers_connection() {
    let agent = start_agent().await;
    let (listener, port) = listener().await;
    let (reader, writer) = agent.client.tcp_connect(port, WINDOW).await.unwrap();
    let (mut socket, _) = listener.accept().await.unwrap();
    let started = Instant::now();
    drop((reader, writer));
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf))
        .await
        .expect("the server's connection ends")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
async fn a_stalled_reader_holds_its_server_not_the_link() {
    let agent = start_agent().await;
    let (listener, port) = listener().await;
    // A server that writes for ever, counting what the kernel took.
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let chunk = vec![7u8; 64 * 1024];
        let mut written = 0usize;
        while let Ok(Ok(())) =
            tokio::time::timeout(Duration::from_secs(2), socket.write_all(&chunk)).await
        {
            written += chunk.len();
        }
        written
    });
    let (reader, _writer) = agent.client.tcp_connect(port, WINDOW).await.unwrap();
    // Nothing is consumed: the agent stops at the window, the server blocks.
    let started = Instant::now();
    let out = run(&agent, spec(&["echo", "still here"])).await;
    assert_eq!(text(&out.stdout), "still here\n");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "an exec waited {:?} behind a stalled stream",
        started.elapsed()
    );
    let written = server.await.unwrap();
    // The window plus the kernel's socket buffers, far below an unbounded relay's gigabytes.
    assert!(written < 64 * MIB, "the server wrote {written} bytes");
    drop(reader);
}

#[tokio::test]
async fn streams_past_the_agents_limit_are_refused_as_busy() {
    let agent = start_agent().await;
    let (listener, port) = listener().await;
    // Accept everything and hold it, so every stream stays open.
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            sockets.push(socket);
        }
    });
    let mut streams = Vec::new();
    for _ in 0..agent_proto::MAX_TCP_STREAMS {
        streams.push(
            agent
                .client
                .tcp_connect(port, WINDOW)
                .await
                .expect("within the limit"),
        );
    }
    match agent.client.tcp_connect(port, WINDOW).await {
        Err(AgentError::Request(e)) => assert_eq!(e.code, ErrorCode::Busy, "{e}"),
        Err(other) => panic!("expected Busy, got {other}"),
        Ok(_) => panic!("one stream past the limit opened"),
    }
    // One closed makes room again (once the agent has let its threads go).
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match agent.client.tcp_connect(port, WINDOW).await {
            Ok(stream) => {
                streams.push(stream);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "no room after a close: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(streams);
    held.abort();
}
