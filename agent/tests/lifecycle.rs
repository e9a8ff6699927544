//! Connection and process lifecycle: loss, shutdown, cancellation, handshake, bad frames.

mod common;

use std::io::{Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_proto::{AgentError, ErrorCode, Frame, Hello, Kind, Message};
use common::*;

#[tokio::test]
async fn connection_loss_fails_every_pending_exec_promptly() {
    let mut agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut pending = Vec::new();
    for i in 0..3 {
        let client = agent.client.clone();
        let s = sh(&format!(
            "echo $$ > {}/{i}; exec sleep 60",
            dir.path().display()
        ));
        pending.push(tokio::spawn(async move { client.exec(s).await }));
    }
    // Wait until all three programs run, then kill the agent outright.
    let until = Instant::now() + Duration::from_secs(10);
    while std::fs::read_dir(dir.path()).expect("dir").count() < 3 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    agent.child.start_kill().expect("kill agent");
    for task in pending {
        let result = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("pending exec fails within 5 s, not at its timeout")
            .expect("task");
        assert!(
            matches!(result, Err(AgentError::ConnectionLost(_))),
            "{result:?}"
        );
    }
    assert!(agent.client.is_closed());
    let later = agent.client.exec(spec(&["true"])).await;
    assert!(
        matches!(later, Err(AgentError::ConnectionLost(_))),
        "{later:?}"
    );
    // The agent's direct children die with it (PR_SET_PDEATHSIG).
    for i in 0..3 {
        let pid: u32 = std::fs::read_to_string(dir.path().join(i.to_string()))
            .expect("pid file")
            .trim()
            .parse()
            .expect("pid");
        assert!(
            pid_gone(pid, Duration::from_secs(5)).await,
            "exec {pid} outlived the agent"
        );
    }
}

#[tokio::test]
async fn shutdown_kills_everything_and_the_agent_exits() {
    let mut agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let client = agent.client.clone();
    let s = sh(&format!("sleep 60 & echo $! > {}; wait", pidfile.display()));
    let pending = tokio::spawn(async move { client.exec(s).await });
    let until = Instant::now() + Duration::from_secs(10);
    while !pidfile.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let grandchild: u32 = std::fs::read_to_string(&pidfile)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    agent
        .client
        .shutdown()
        .await
        .expect("shutdown acknowledged");
    let status = tokio::time::timeout(Duration::from_secs(5), agent.child.wait())
        .await
        .expect("agent exits after shutdown")
        .expect("wait");
    assert!(status.success(), "clean exit, got {status:?}");
    assert!(
        pid_gone(grandchild, Duration::from_secs(5)).await,
        "grandchild survived shutdown"
    );
    // The pending exec ends either with its kill report or with the closed stream.
    let result = pending.await.expect("task");
    match result {
        Ok(out) => assert_ne!(out.exit_code, 0),
        Err(AgentError::ConnectionLost(_)) => {}
        Err(e) => panic!("unexpected {e}"),
    }
}

#[tokio::test]
async fn stream_close_makes_the_agent_kill_and_exit() {
    let Agent { client, mut child } = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let s = sh(&format!("sleep 60 & echo $! > {}; wait", pidfile.display()));
    let c2 = client.clone();
    let pending = tokio::spawn(async move { c2.exec(s).await });
    let until = Instant::now() + Duration::from_secs(10);
    while !pidfile.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    let grandchild: u32 = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    pending.abort();
    let _ = pending.await;
    drop(client); // last handle: the writer closes, the agent reads EOF
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("agent exits when the stream closes")
        .expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(
        pid_gone(grandchild, Duration::from_secs(5)).await,
        "grandchild survived"
    );
}

#[tokio::test]
async fn a_cancelled_exec_is_killed_in_the_agent() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("pid");
    let s = sh(&format!("echo $$ > {}; exec sleep 60", pidfile.display()));
    let cancelled = tokio::time::timeout(Duration::from_millis(500), agent.client.exec(s)).await;
    assert!(cancelled.is_err(), "the call was cut short by the caller");
    let pid: u32 = std::fs::read_to_string(&pidfile)
        .expect("pid")
        .trim()
        .parse()
        .expect("pid");
    assert!(
        pid_gone(pid, Duration::from_secs(5)).await,
        "cancelled exec kept running"
    );
    // The connection is still good.
    let out = run(&agent, spec(&["echo", "still here"])).await;
    assert_eq!(text(&out.stdout), "still here\n");
}

/// Raw frames over a blocking pipe, for what the client would never send.
struct Raw {
    child: std::process::Child,
}

impl Raw {
    fn start() -> Raw {
        let child = std::process::Command::new(agent_bin())
            .arg("--stdio")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("agent starts");
        Raw { child }
    }
    fn send(&mut self, frame: Frame) {
        self.write(&frame.to_bytes().expect("fits"));
    }
    fn write(&mut self, bytes: &[u8]) {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin.write_all(bytes).expect("write");
        stdin.flush().expect("flush");
    }
    fn recv(&mut self) -> Message {
        let stdout = self.child.stdout.as_mut().expect("stdout");
        Message::from_frame(Frame::read_from(stdout).expect("frame")).expect("message")
    }
    fn hello(&mut self, version: u32) -> Message {
        let mut hello = Hello::new("raw test");
        hello.version = version;
        self.send(Message::Hello(hello).into_frame(0).expect("encodes"));
        self.recv()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn version_mismatch_is_refused_clearly() {
    let mut raw = Raw::start();
    let theirs = raw.hello(99);
    assert!(matches!(theirs, Message::Hello(h) if h.version == agent_proto::PROTOCOL_VERSION));
    match raw.recv() {
        Message::Error(e) => {
            assert_eq!(e.code, ErrorCode::VersionMismatch);
            assert!(e.message.contains("99"), "{}", e.message);
        }
        other => panic!("expected an error, got {other:?}"),
    }
    let status = raw.child.wait().expect("agent exits");
    assert_eq!(status.code(), Some(1));
}

#[test]
fn malformed_requests_get_errors_and_the_agent_keeps_serving() {
    let mut raw = Raw::start();
    raw.hello(agent_proto::PROTOCOL_VERSION);
    let bad_payloads: [(Kind, &[u8]); 4] = [
        (Kind::ExecStart, b"{not json"),
        (Kind::ExecStart, br#"{"argv":[],"env":[],"workdir":null,"stdin":false,"timeout_ms":0,"max_output_bytes":0}"#),
        (Kind::FsRequest, br#"{"op":"format_disk"}"#),
        (Kind::ExecKill, b"unexpected payload"),
    ];
    for (i, (kind, payload)) in bad_payloads.iter().enumerate() {
        let id = 10 + i as u32;
        raw.send(Frame::new(id, *kind, payload.to_vec()));
        match raw.recv() {
            Message::Error(e) => assert_eq!(e.code, ErrorCode::BadRequest, "case {i}"),
            other => panic!("case {i}: expected an error, got {other:?}"),
        }
    }
    // A host-only message sent to the agent is refused too.
    raw.send(Message::ShutdownAck.into_frame(20).expect("encodes"));
    assert!(matches!(raw.recv(), Message::Error(_)));
    // Still serving.
    let req = agent_proto::ExecRequest {
        argv: vec!["echo".into(), "alive".into()],
        env: vec![],
        workdir: None,
        stdin: false,
        timeout_ms: 10_000,
        max_output_bytes: 100,
        flow_window: None,
        tty: None,
    };
    raw.send(Message::ExecStart(req).into_frame(30).expect("encodes"));
    let mut out = Vec::new();
    loop {
        match raw.recv() {
            Message::Stdout(data) => out.extend(data),
            Message::ExecExit(exit) => {
                assert_eq!(exit.exit_code, 0);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(out, b"alive\n");
}

#[test]
fn an_oversized_frame_ends_the_session_cleanly() {
    let mut raw = Raw::start();
    raw.hello(agent_proto::PROTOCOL_VERSION);
    let mut header = Frame::new(1, Kind::Stdin, vec![]).to_bytes().expect("fits");
    header[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    raw.write(&header);
    let status = raw.child.wait().expect("agent exits");
    assert_eq!(
        status.code(),
        Some(1),
        "a desynchronised stream is fatal, not a panic"
    );
    let mut rest = Vec::new();
    let _ = raw
        .child
        .stdout
        .as_mut()
        .expect("stdout")
        .read_to_end(&mut rest);
}

#[tokio::test]
async fn unix_socket_mode_connects_to_the_host() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("agent.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let mut child = tokio::process::Command::new(agent_bin())
        .arg("--unix")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts");
    let (stream, _) = tokio::time::timeout(Duration::from_secs(10), listener.accept())
        .await
        .expect("agent connects")
        .expect("accept");
    let (r, w) = stream.into_split();
    let client = agent_proto::AgentClient::connect(r, w)
        .await
        .expect("hello");
    let out = client
        .exec(spec(&["echo", "over unix"]))
        .await
        .expect("exec");
    assert_eq!(text(&out.stdout), "over unix\n");
    client.shutdown().await.expect("shutdown");
    let status = child.wait().await.expect("exit");
    assert!(status.success());
}

#[test]
fn bad_command_lines_exit_2_with_usage() {
    for args in [
        &[][..],
        &["--vsock-port", "nope"][..],
        &["--stdio", "extra"][..],
    ] {
        let out = std::process::Command::new(agent_bin())
            .args(args)
            .output()
            .expect("runs");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("usage"));
    }
}
