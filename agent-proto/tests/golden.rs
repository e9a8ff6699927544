//! Pins the encoding of every message: an incompatible change to frames or payloads
//! shows up as a diff against `golden/messages.txt`. If the change is intended, bump
//! PROTOCOL_VERSION and regenerate with `UPDATE_GOLDEN=1 cargo test -p agent-proto`.

use agent_proto::*;

fn samples() -> Vec<(&'static str, Message)> {
    let entry = FsEntry {
        name: "a.txt".into(),
        is_dir: false,
        is_symlink: false,
        size: 3,
        mode: 0o644,
        mtime: 1_700_000_000,
    };
    vec![
        ("hello", Message::Hello(Hello::new("test"))),
        (
            "exec_start",
            Message::ExecStart(ExecRequest {
                argv: vec!["sh".into(), "-c".into(), "echo hi".into()],
                env: vec![("K".into(), "V".into())],
                workdir: Some("/tmp".into()),
                stdin: true,
                timeout_ms: 1000,
                max_output_bytes: 1048576,
                flow_window: None,
                tty: None,
            }),
        ),
        (
            "stdin",
            Message::Stdin {
                data: b"in".to_vec(),
                end: true,
            },
        ),
        ("stdout", Message::Stdout(b"out".to_vec())),
        ("stderr", Message::Stderr(b"err".to_vec())),
        (
            "exec_exit",
            Message::ExecExit(ExecExit {
                exit_code: 137,
                signal: Some(9),
                timed_out: true,
                killed: false,
                stdout_truncated: true,
                stderr_truncated: false,
                stdout_total: 5,
                stderr_total: 0,
                duration_ms: 12,
            }),
        ),
        ("exec_kill", Message::ExecKill),
        ("fs_ls", fs(FsRequest::Ls { path: "/".into() }, false)),
        ("fs_stat", fs(FsRequest::Stat { path: "/a".into() }, false)),
        (
            "fs_mkdir",
            fs(
                FsRequest::Mkdir {
                    path: "/d".into(),
                    mode: 0o755,
                    parents: true,
                },
                false,
            ),
        ),
        (
            "fs_write",
            fs(
                FsRequest::Write {
                    path: "/a".into(),
                    mode: 0o644,
                    parents: false,
                    append: false,
                    data: b"ignored in json".to_vec(),
                },
                true,
            ),
        ),
        (
            "fs_read",
            fs(
                FsRequest::Read {
                    path: "/a".into(),
                    offset: 0,
                    max_bytes: 10,
                },
                false,
            ),
        ),
        (
            "fs_rm",
            fs(
                FsRequest::Rm {
                    path: "/a".into(),
                    recursive: true,
                },
                false,
            ),
        ),
        (
            "fs_chmod",
            fs(
                FsRequest::Chmod {
                    path: "/a".into(),
                    mode: 0o600,
                    uid: Some(1),
                    gid: None,
                    recursive: false,
                },
                false,
            ),
        ),
        (
            "fs_mv",
            fs(
                FsRequest::Mv {
                    src: "/a".into(),
                    dst: "/b".into(),
                    overwrite: false,
                },
                false,
            ),
        ),
        (
            "data",
            Message::Data {
                data: b"abc".to_vec(),
                end: true,
            },
        ),
        (
            "fs_entries",
            ok(FsResponse::Entries {
                entries: vec![entry.clone()],
            }),
        ),
        ("fs_entry", ok(FsResponse::Entry { entry })),
        ("fs_created", ok(FsResponse::Created { created: true })),
        (
            "fs_written",
            ok(FsResponse::Written {
                bytes_written: 3,
                path: "/a".into(),
            }),
        ),
        (
            "fs_read_ok",
            ok(FsResponse::Read {
                size: 3,
                mode: 0o644,
                mtime: 1,
                data: vec![],
            }),
        ),
        ("fs_removed", ok(FsResponse::Removed { removed: true })),
        ("fs_updated", ok(FsResponse::Updated { updated: 2 })),
        ("fs_moved", ok(FsResponse::Moved { moved: true })),
        (
            "fs_err",
            Message::FsReply(FsReply::Err(FsError::new(
                FsErrorCode::NotFound,
                "no such file",
            ))),
        ),
        (
            "error",
            Message::Error(RequestError::new(ErrorCode::BadWorkdir, "nope")),
        ),
        ("shutdown", Message::Shutdown),
        ("shutdown_ack", Message::ShutdownAck),
        // Additions since version 1, negotiated through Hello's features: every line above
        // is unchanged, so peers without them keep working.
        (
            "hello_features",
            Message::Hello(Hello::new("test").with_features(&[FEATURE_EXEC_FLOW])),
        ),
        (
            "exec_start_flow",
            Message::ExecStart(ExecRequest {
                argv: vec!["python3".into(), "-i".into()],
                env: vec![],
                workdir: None,
                stdin: true,
                timeout_ms: 0,
                max_output_bytes: u64::MAX,
                flow_window: Some(1048576),
                tty: None,
            }),
        ),
        ("output_ack", Message::OutputAck(FlowAck { bytes: 65600 })),
        ("stdin_ack", Message::StdinAck(FlowAck { bytes: 66 })),
        (
            "exec_start_tty",
            Message::ExecStart(ExecRequest {
                argv: vec!["bash".into(), "-i".into()],
                env: vec![],
                workdir: None,
                stdin: true,
                timeout_ms: 0,
                max_output_bytes: u64::MAX,
                flow_window: Some(1048576),
                tty: Some(TtySize { rows: 24, cols: 80 }),
            }),
        ),
        (
            "resize",
            Message::Resize(TtySize {
                rows: 50,
                cols: 132,
            }),
        ),
        (
            "tcp_connect",
            Message::TcpConnect(TcpConnect {
                port: 8000,
                window: 131072,
            }),
        ),
        ("tcp_connected", Message::TcpConnected),
        (
            "tcp_data",
            Message::TcpData {
                data: b"GET /".to_vec(),
                end: false,
            },
        ),
        (
            "tcp_data_end",
            Message::TcpData {
                data: Vec::new(),
                end: true,
            },
        ),
        ("tcp_ack", Message::TcpAck(FlowAck { bytes: 69 })),
        ("tcp_close", Message::TcpClose),
        (
            "error_connect_failed",
            Message::Error(RequestError::new(ErrorCode::ConnectFailed, "refused")),
        ),
        (
            "watch_start",
            Message::WatchStart(WatchRequest {
                path: "/work".into(),
                recursive: true,
                max_dirs: 8192,
            }),
        ),
        (
            "watch_events",
            Message::WatchEvents(WatchBatch {
                events: vec![
                    WatchEvent {
                        kind: WatchKind::Moved,
                        path: "src/b.rs".into(),
                        is_dir: false,
                        from: Some("src/a.rs".into()),
                    },
                    WatchEvent {
                        kind: WatchKind::Overflow,
                        path: String::new(),
                        is_dir: false,
                        from: None,
                    },
                ],
                watched: 3,
            }),
        ),
        ("watch_ack", Message::WatchAck(FlowAck { bytes: 1 })),
        ("watch_stop", Message::WatchStop),
        (
            "watch_end",
            Message::WatchEnd(WatchEnd {
                error: Some(FsError::new(FsErrorCode::NotFound, "/work: gone")),
            }),
        ),
        (
            "exec_signal",
            Message::ExecSignal(ExecSignal { signal: 15 }),
        ),
        (
            "proc_start",
            Message::ProcRequest(ProcRequest::Start {
                exec: ExecRequest {
                    argv: vec!["python3".into(), "-m".into(), "http.server".into()],
                    env: vec![],
                    workdir: None,
                    stdin: false,
                    timeout_ms: 0,
                    max_output_bytes: 0,
                    flow_window: None,
                    tty: None,
                },
            }),
        ),
        ("proc_list", Message::ProcRequest(ProcRequest::List)),
        (
            "proc_output",
            Message::ProcRequest(ProcRequest::Output {
                process_id: 1,
                since: 10,
                max_bytes: 524288,
            }),
        ),
        (
            "proc_kill",
            Message::ProcRequest(ProcRequest::Kill {
                process_id: 1,
                signal: 9,
            }),
        ),
        (
            "proc_started",
            Message::ProcReply(ProcReply::Started { info: proc_info() }),
        ),
        (
            "proc_listed",
            Message::ProcReply(ProcReply::List {
                processes: vec![proc_info()],
            }),
        ),
        (
            "proc_output_reply",
            Message::ProcReply(ProcReply::Output {
                info: proc_info(),
                start: 10,
                next: 12,
            }),
        ),
        (
            "proc_signalled",
            Message::ProcReply(ProcReply::Signalled { info: proc_info() }),
        ),
        (
            "proc_refused",
            Message::ProcReply(ProcReply::Refused {
                code: ProcErrorCode::TooMany,
                message: "32 run".into(),
            }),
        ),
    ]
}

fn proc_info() -> ProcInfo {
    ProcInfo {
        process_id: 1,
        pid: 42,
        running: false,
        exit_code: Some(143),
        total_bytes: 12,
    }
}

fn fs(request: FsRequest, has_body: bool) -> Message {
    Message::FsRequest { request, has_body }
}

fn ok(r: FsResponse) -> Message {
    Message::FsReply(FsReply::Ok(r))
}

fn render() -> String {
    let mut out = String::new();
    for (i, (name, msg)) in samples().into_iter().enumerate() {
        let frame = msg.into_frame(i as u32 + 1).expect("encodes");
        let bytes = frame.to_bytes().expect("fits");
        let head: String = bytes[..HEADER_LEN]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let payload = String::from_utf8_lossy(&bytes[HEADER_LEN..]);
        out.push_str(&format!("{name} {head} {payload}\n"));
    }
    out
}

#[test]
fn message_encoding_matches_golden_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/messages.txt");
    let actual = render();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, &actual).expect("write golden file");
    }
    let expected = std::fs::read_to_string(path).expect("golden file exists");
    assert_eq!(
        actual, expected,
        "wire encoding changed: bump PROTOCOL_VERSION and regenerate (see file header)"
    );
}

#[test]
fn every_sample_decodes_back_to_itself() {
    for (i, (name, msg)) in samples().into_iter().enumerate() {
        let frame = msg.clone().into_frame(i as u32 + 1).expect("encodes");
        let bytes = frame.to_bytes().expect("fits");
        let back = Frame::read_from(&mut bytes.as_slice()).expect("reads");
        let decoded = Message::from_frame(back).expect("decodes");
        // Bulk bytes of fs write/read travel as Data frames, not inside the JSON.
        let expected = match msg {
            Message::FsRequest {
                request:
                    FsRequest::Write {
                        path,
                        mode,
                        parents,
                        append,
                        ..
                    },
                has_body,
            } => Message::FsRequest {
                request: FsRequest::Write {
                    path,
                    mode,
                    parents,
                    append,
                    data: vec![],
                },
                has_body,
            },
            other => other,
        };
        assert_eq!(decoded, expected, "{name}");
    }
}

#[test]
fn every_kind_is_sampled() {
    let kinds: std::collections::HashSet<Kind> = samples()
        .into_iter()
        .map(|(_, m)| m.into_frame(1).expect("encodes").kind)
        .collect();
    for kind in Kind::ALL {
        assert!(kinds.contains(&kind), "{kind:?} has no golden sample");
    }
}

#[test]
fn version_1_peers_without_the_additions_still_decode() {
    // A Hello without features (every agent before exec_flow) lists none.
    let hello = Frame::new(
        0,
        Kind::Hello,
        br#"{"version":1,"software":"old"}"#.to_vec(),
    );
    match Message::from_frame(hello).expect("decodes") {
        Message::Hello(h) => assert!(h.features.is_empty() && h.version == PROTOCOL_VERSION),
        other => panic!("{other:?}"),
    }
    // An ExecStart without flow_window is the unflowed exec it always was.
    let start = br#"{"argv":["true"],"env":[],"workdir":null,"stdin":false,"timeout_ms":1,"max_output_bytes":1}"#;
    match Message::from_frame(Frame::new(1, Kind::ExecStart, start.to_vec())).expect("decodes") {
        Message::ExecStart(r) => assert_eq!((r.flow_window, r.tty), (None, None)),
        other => panic!("{other:?}"),
    }
}
