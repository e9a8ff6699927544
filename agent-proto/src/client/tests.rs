//! The client against a scripted fake agent over an in-memory pipe: the client's own
//! guarantees, whatever the agent does.

use tokio::io::{duplex, split, DuplexStream, ReadHalf, WriteHalf};

use super::io::{read_frame, write_frame};
use super::*;
use crate::{ExecExit, Frame, FsReply, Kind};

struct FakeAgent {
    reader: ReadHalf<DuplexStream>,
    writer: WriteHalf<DuplexStream>,
}

impl FakeAgent {
    async fn send(&mut self, id: u32, msg: Message) {
        let frame = msg.into_frame(id).expect("encodes");
        write_frame(&mut self.writer, &frame).await.expect("write");
    }
    async fn recv(&mut self) -> Frame {
        read_frame(&mut self.reader).await.expect("frame")
    }
}

async fn pair() -> (AgentClient, FakeAgent) {
    pair_with(&[]).await
}

async fn pair_with(features: &[&str]) -> (AgentClient, FakeAgent) {
    let (host_end, agent_end) = duplex(4 * 1024 * 1024);
    let (hr, hw) = split(host_end);
    let (ar, aw) = split(agent_end);
    let mut fake = FakeAgent {
        reader: ar,
        writer: aw,
    };
    let hello = Hello::new("fake").with_features(features);
    fake.send(0, Message::Hello(hello)).await;
    let client = AgentClient::connect(hr, hw).await.expect("connects");
    assert_eq!(fake.recv().await.kind, Kind::Hello);
    (client, fake)
}

fn spec(cap: usize) -> ExecSpec {
    ExecSpec {
        argv: vec!["x".into()],
        timeout_ms: 5_000,
        max_output_bytes: cap,
        ..ExecSpec::default()
    }
}

fn exit() -> ExecExit {
    ExecExit {
        exit_code: 0,
        signal: None,
        timed_out: false,
        killed: false,
        stdout_truncated: false,
        stderr_truncated: false,
        stdout_total: 0,
        stderr_total: 0,
        duration_ms: 1,
    }
}

#[test]
fn client_is_clone_send_sync() {
    fn check<T: Clone + Send + Sync + 'static>() {}
    check::<AgentClient>();
}

#[tokio::test]
async fn the_client_caps_output_even_if_the_agent_does_not() {
    let (client, mut fake) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec(spec(10)).await }
    });
    let start = fake.recv().await;
    assert_eq!(start.kind, Kind::ExecStart);
    fake.send(start.id, Message::Stdout(vec![b'a'; 8])).await;
    fake.send(start.id, Message::Stdout(vec![b'b'; 8])).await;
    fake.send(start.id, Message::ExecExit(exit())).await;
    let out = call.await.expect("task").expect("outcome");
    assert_eq!(out.stdout, b"aaaaaaaabb");
    assert!(out.stdout_truncated);
}

#[tokio::test]
async fn a_malformed_message_fails_pending_calls_and_closes() {
    let (client, mut fake) = pair().await;
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec(spec(10)).await }
    });
    let start = fake.recv().await;
    let garbage = Frame::new(start.id, Kind::ExecExit, b"{oops".to_vec());
    write_frame(&mut fake.writer, &garbage)
        .await
        .expect("write");
    let result = call.await.expect("task");
    assert!(
        matches!(result, Err(AgentError::ConnectionLost(_))),
        "{result:?}"
    );
    assert!(client.is_closed());
}

#[tokio::test]
async fn a_version_mismatch_is_refused_at_connect() {
    let (host_end, agent_end) = duplex(64 * 1024);
    let (hr, hw) = split(host_end);
    let (_ar, mut aw) = split(agent_end);
    let mut hello = Hello::new("old agent");
    hello.version = PROTOCOL_VERSION + 1;
    let frame = Message::Hello(hello).into_frame(0).expect("encodes");
    write_frame(&mut aw, &frame).await.expect("write");
    match AgentClient::connect(hr, hw).await {
        Err(AgentError::VersionMismatch { ours, theirs }) => {
            assert_eq!((ours, theirs), (PROTOCOL_VERSION, PROTOCOL_VERSION + 1))
        }
        Err(e) => panic!("expected a version mismatch, got {e}"),
        Ok(_) => panic!("expected a version mismatch, got a client"),
    }
}

#[tokio::test]
async fn an_agent_that_never_answers_is_reported_and_killed() {
    let (client, mut fake) = pair().await;
    let mut s = spec(10);
    s.timeout_ms = 1; // the client waits this plus EXEC_GRACE
    tokio::time::pause();
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec(s).await }
    });
    let start = fake.recv().await;
    let result = call.await.expect("task");
    assert!(
        matches!(result, Err(AgentError::Unresponsive { .. })),
        "{result:?}"
    );
    let kill = fake.recv().await;
    assert_eq!((kill.kind, kill.id), (Kind::ExecKill, start.id));
}

#[tokio::test]
async fn an_fs_call_the_agent_never_answers_ends_and_a_late_answer_is_dropped() {
    let (client, mut fake) = pair().await;
    tokio::time::pause();
    let call = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .fs(FsRequest::Stat {
                    path: "/fifo".into(),
                })
                .await
        }
    });
    let request = fake.recv().await;
    assert_eq!(request.kind, Kind::FsRequest);
    let result = call.await.expect("task");
    assert!(
        matches!(result, Err(AgentError::Unresponsive { id }) if id == request.id),
        "{result:?}"
    );
    // The answer that comes after all is dropped, and the link still serves.
    let late = FsReply::Ok(FsResponse::Removed { removed: true });
    fake.send(request.id, Message::FsReply(late)).await;
    let next = tokio::spawn({
        let client = client.clone();
        async move { client.fs(FsRequest::Stat { path: "/".into() }).await }
    });
    let second = fake.recv().await;
    let answer = FsReply::Ok(FsResponse::Created { created: true });
    fake.send(second.id, Message::FsReply(answer)).await;
    assert_eq!(
        next.await.expect("task").expect("answered"),
        FsResponse::Created { created: true }
    );
}

#[tokio::test]
async fn a_streaming_exec_hands_on_every_chunk_in_order_even_through_a_full_sink() {
    let (client, mut fake) = pair().await;
    // Room for one chunk: the rest wait in the read loop, none is lost or reordered.
    let (sink, mut chunks) = mpsc::channel(1);
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec_streaming(spec(usize::MAX), sink).await }
    });
    let start = fake.recv().await;
    assert_eq!(start.kind, Kind::ExecStart);
    let mut sent = Vec::new();
    for i in 0..6u8 {
        let msg = if i % 3 == 2 {
            Message::Stderr(vec![b'e', i])
        } else {
            Message::Stdout(vec![b'o', i])
        };
        sent.push(match &msg {
            Message::Stdout(d) => OutputChunk::Stdout(d.clone()),
            Message::Stderr(d) => OutputChunk::Stderr(d.clone()),
            _ => unreachable!(),
        });
        fake.send(start.id, msg).await;
    }
    let mut end = exit();
    end.exit_code = 3;
    end.stdout_total = 8;
    fake.send(start.id, Message::ExecExit(end.clone())).await;
    let mut received = Vec::new();
    while let Some(chunk) = chunks.recv().await {
        received.push(chunk);
    }
    assert_eq!(received, sent);
    assert_eq!(call.await.expect("task").expect("exit"), end);
}

#[tokio::test]
async fn a_streaming_exec_whose_receiver_is_gone_still_ends_and_other_calls_go_on() {
    let (client, mut fake) = pair().await;
    let (sink, chunks) = mpsc::channel(1);
    drop(chunks);
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec_streaming(spec(usize::MAX), sink).await }
    });
    let start = fake.recv().await;
    for _ in 0..4 {
        fake.send(start.id, Message::Stdout(vec![b'x'; 100])).await;
    }
    fake.send(start.id, Message::ExecExit(exit())).await;
    assert_eq!(call.await.expect("task").expect("exit"), exit());
    let other = tokio::spawn({
        let client = client.clone();
        async move { client.exec(spec(10)).await }
    });
    let start = fake.recv().await;
    fake.send(start.id, Message::Stdout(b"ok".to_vec())).await;
    fake.send(start.id, Message::ExecExit(exit())).await;
    assert_eq!(other.await.expect("task").expect("outcome").stdout, b"ok");
}

#[tokio::test]
async fn a_streaming_exec_fails_when_the_connection_is_lost() {
    let (client, mut fake) = pair().await;
    let (sink, mut chunks) = mpsc::channel(4);
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec_streaming(spec(usize::MAX), sink).await }
    });
    let start = fake.recv().await;
    fake.send(start.id, Message::Stdout(b"partial".to_vec()))
        .await;
    drop(fake);
    let result = call.await.expect("task");
    assert!(
        matches!(result, Err(AgentError::ConnectionLost(_))),
        "{result:?}"
    );
    assert_eq!(
        chunks.recv().await,
        Some(OutputChunk::Stdout(b"partial".to_vec()))
    );
    assert_eq!(
        chunks.recv().await,
        None,
        "the sink ends with the connection"
    );
}

#[tokio::test]
async fn an_oversized_request_is_refused_and_the_link_stays_whole() {
    let (client, mut fake) = pair().await;
    let mut big = spec(10);
    big.argv = vec!["x".repeat(2 * 1024 * 1024)];
    match client.exec(big).await {
        Err(AgentError::TooLarge { bytes, limit }) => {
            assert!(
                bytes > 2 * 1024 * 1024 && limit == MAX_PAYLOAD,
                "{bytes} {limit}"
            );
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let path = "/".repeat(MAX_PAYLOAD);
    let refused = client.fs(FsRequest::Stat { path }).await;
    assert!(
        matches!(refused, Err(AgentError::TooLarge { .. })),
        "{refused:?}"
    );
    assert!(
        !client.is_closed(),
        "nothing was written: the link is whole"
    );

    // The next request is the first frame the agent sees (no ExecKill for the refused one).
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec(spec(10)).await }
    });
    let start = fake.recv().await;
    assert_eq!(start.kind, Kind::ExecStart);
    fake.send(start.id, Message::ExecExit(exit())).await;
    let out = call.await.expect("task").expect("the next exec works");
    assert_eq!(out.exit_code, 0);
}

#[tokio::test]
async fn closed_says_why_once_the_agent_sends_what_cannot_be_decoded() {
    let (client, mut fake) = pair().await;
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.closed().await }
    });
    let call = tokio::spawn({
        let client = client.clone();
        async move { client.exec(spec(10)).await }
    });
    assert_eq!(fake.recv().await.kind, Kind::ExecStart);
    use tokio::io::AsyncWriteExt;
    fake.writer
        .write_all(b"garbage that is no frame header")
        .await
        .unwrap();
    let reason = waiting.await.expect("task");
    assert!(reason.contains("cannot decode"), "{reason}");
    assert!(client.is_closed());
    match call.await.expect("task") {
        Err(AgentError::ConnectionLost(why)) => assert_eq!(why, reason),
        other => panic!("the exec in flight fails with the cause: {other:?}"),
    }
    // Already closed: answers at once.
    assert_eq!(client.closed().await, reason);
}

#[tokio::test]
async fn a_flow_exec_needs_an_agent_that_offers_it() {
    let (client, _fake) = pair().await;
    assert!(!client.supports(crate::FEATURE_EXEC_FLOW));
    let refused = client.exec_flow(&spec(10), false, 1 << 20).await;
    assert!(matches!(refused, Err(AgentError::Unsupported(_))));
}

#[tokio::test]
async fn a_terminal_needs_an_agent_that_offers_it_and_resizes_travel_until_the_end() {
    let mut on_tty = spec(10);
    on_tty.tty = Some(crate::TtySize { rows: 24, cols: 80 });
    let (client, _fake) = pair_with(&[crate::FEATURE_EXEC_FLOW]).await;
    let refused = client.exec_flow(&on_tty, true, 1 << 20).await;
    assert!(matches!(refused, Err(AgentError::Unsupported(_))));

    let features = [crate::FEATURE_EXEC_FLOW, crate::FEATURE_EXEC_TTY];
    let (client, mut fake) = pair_with(&features).await;
    let flow = client.exec_flow(&on_tty, true, 1 << 20).await.unwrap();
    let start = fake.recv().await;
    match Message::from_frame(start.clone()).unwrap() {
        Message::ExecStart(r) => assert_eq!(r.tty, on_tty.tty),
        other => panic!("{other:?}"),
    }
    let size = crate::TtySize {
        rows: 50,
        cols: 132,
    };
    flow.handle.resize(size).await.unwrap();
    let resize = fake.recv().await;
    assert_eq!(resize.id, start.id);
    assert_eq!(Message::from_frame(resize).unwrap(), Message::Resize(size));
    fake.send(start.id, Message::ExecExit(exit())).await;
    let handle = flow.handle.clone();
    flow.exit.wait().await.unwrap();
    // After the end a resize is moot: nothing goes out, nothing fails.
    handle.resize(size).await.unwrap();
    let sent = tokio::time::timeout(Duration::from_millis(200), fake.recv()).await;
    assert!(sent.is_err(), "a resize went out after the end");
}

#[tokio::test]
async fn an_agent_past_its_flow_window_fails_the_exec_and_it_is_killed() {
    let (client, mut fake) = pair_with(&[crate::FEATURE_EXEC_FLOW]).await;
    let window = 1 << 20;
    let flow = client
        .exec_flow(&spec(usize::MAX), false, window)
        .await
        .unwrap();
    let start = fake.recv().await;
    let request = match Message::from_frame(start.clone()).unwrap() {
        Message::ExecStart(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(request.flow_window, Some(window));
    // Never acknowledged: the fifth 256 KiB chunk is past the window.
    for _ in 0..5 {
        fake.send(start.id, Message::Stdout(vec![b'a'; 256 * 1024]))
            .await;
    }
    let failed = flow.exit.wait().await;
    assert!(
        matches!(failed, Err(AgentError::Unexpected(_))),
        "{failed:?}"
    );
    let kill = fake.recv().await;
    assert_eq!((kill.kind, kill.id), (Kind::ExecKill, start.id));
    // What came within the window was handed on; the sink then ended.
    let mut output = flow.output;
    let mut got = 0;
    while let Some(OutputChunk::Stdout(d)) = output.recv().await {
        got += d.len();
    }
    assert_eq!(got, 3 * 256 * 1024);
}

#[tokio::test]
async fn stdin_acks_never_return_more_credit_than_was_sent() {
    let (client, mut fake) = pair_with(&[crate::FEATURE_EXEC_FLOW]).await;
    let window = 4 * crate::flow_cost(CHUNK_SIZE);
    let flow = client.exec_flow(&spec(10), true, window).await.unwrap();
    let start = fake.recv().await;
    // A huge ack before anything was sent grants nothing.
    fake.send(
        start.id,
        Message::StdinAck(crate::FlowAck { bytes: u64::MAX }),
    )
    .await;
    let handle = flow.handle.clone();
    let feeding = tokio::spawn(async move { handle.stdin(&vec![0; 8 * CHUNK_SIZE]).await });
    for _ in 0..4 {
        let chunk = tokio::time::timeout(Duration::from_secs(10), fake.recv()).await;
        assert_eq!(chunk.expect("a window's worth goes out").kind, Kind::Stdin);
    }
    let more = tokio::time::timeout(Duration::from_millis(200), fake.recv()).await;
    assert!(more.is_err(), "a fifth chunk went out without credit");
    // One chunk acknowledged: one more goes out.
    let ack = crate::FlowAck {
        bytes: crate::flow_cost(CHUNK_SIZE),
    };
    fake.send(start.id, Message::StdinAck(ack)).await;
    assert_eq!(fake.recv().await.kind, Kind::Stdin);
    fake.send(start.id, Message::ExecExit(exit())).await;
    assert!(!feeding.await.unwrap().unwrap(), "the exec ended first");
    flow.exit.wait().await.unwrap();
}

#[tokio::test]
async fn a_tcp_stream_needs_an_agent_that_offers_it() {
    let (client, _fake) = pair().await;
    let err = client
        .tcp_connect(80, 1 << 20)
        .await
        .err()
        .expect("refused");
    assert!(matches!(err, AgentError::Unsupported(_)), "{err}");
}

#[tokio::test]
async fn an_agent_past_its_tcp_window_loses_the_stream_and_is_told_to_close_it() {
    let (client, mut fake) = pair_with(&[crate::FEATURE_TCP_STREAM]).await;
    let connecting = tokio::spawn(async move {
        let stream = client.tcp_connect(8000, 0).await;
        (client, stream)
    });
    let open = fake.recv().await;
    assert_eq!(open.kind, Kind::TcpConnect);
    let window = match Message::from_frame(open.clone()).unwrap() {
        Message::TcpConnect(c) => c.window,
        other => panic!("{other:?}"),
    };
    assert_eq!(window, 2 * crate::flow_cost(CHUNK_SIZE), "clamped up");
    fake.send(open.id, Message::TcpConnected).await;
    let (client, stream) = connecting.await.unwrap();
    let (mut reader, _writer) = stream.expect("connected");
    // Two full chunks fit the window exactly; one more byte does not.
    for _ in 0..2 {
        let data = vec![1u8; CHUNK_SIZE];
        fake.send(open.id, Message::TcpData { data, end: false })
            .await;
    }
    let data = vec![1u8];
    fake.send(open.id, Message::TcpData { data, end: false })
        .await;
    let mut got = 0;
    while let Some(event) = reader.recv().await {
        match event {
            crate::client::TcpEvent::Data(d) => got += d.len(),
            crate::client::TcpEvent::End => panic!("no end was sent"),
        }
    }
    assert_eq!(
        got,
        2 * CHUNK_SIZE,
        "what fitted was handed on, then the end"
    );
    drop(reader);
    drop(_writer);
    let close = fake.recv().await;
    assert_eq!((close.id, close.kind), (open.id, Kind::TcpClose));
    // The link itself is whole.
    assert!(!client.is_closed());
}
