//! Execs on a pseudo-terminal (`ExecRequest::tty`) through the real agent binary and the
//! real client: the size asked, a terminal on 0/1/2 with stderr merged, `Resize` frames,
//! flow control on the master, and the ends a guest can make (a flood, a program that
//! never reads, stdin closed early, a resize after the end).

mod common;

use std::time::Duration;

use agent_proto::client::{FlowExec, OutputChunk};
use agent_proto::{flow_cost, TtySize, FEATURE_EXEC_TTY};
use common::*;

const WINDOW: u64 = MIB as u64;

fn on_tty(script: &str, rows: u16, cols: u16) -> agent_proto::ExecSpec {
    let mut s = sh(script);
    s.max_output_bytes = usize::MAX;
    s.tty = Some(TtySize { rows, cols });
    s
}

/// Reads stdout until `want` shows up (or the output ends), acknowledging everything.
/// Terminal output only: a stderr chunk fails the test.
async fn read_until(flow: &mut FlowExec, got: &mut String, want: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !got.contains(want) {
        let chunk = tokio::time::timeout_at(deadline, flow.output.recv())
            .await
            .unwrap_or_else(|_| panic!("no {want:?} in {got:?}"));
        match chunk {
            Some(OutputChunk::Stdout(d)) => {
                flow.handle.consumed(d.len()).await.unwrap();
                got.push_str(&String::from_utf8_lossy(&d));
            }
            Some(OutputChunk::Stderr(d)) => panic!("stderr on a terminal: {d:?}"),
            None => panic!("the output ended without {want:?}: {got:?}"),
        }
    }
}

#[tokio::test]
async fn the_program_gets_a_terminal_of_the_size_asked_with_stderr_merged() {
    let agent = start_agent().await;
    assert!(agent.client.supports(FEATURE_EXEC_TTY));
    let s = on_tty("stty size; tty; echo to-stderr >&2", 33, 101);
    let mut flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    let mut got = String::new();
    read_until(&mut flow, &mut got, "to-stderr").await;
    while let Some(chunk) = flow.output.recv().await {
        match chunk {
            OutputChunk::Stdout(d) => got.push_str(&String::from_utf8_lossy(&d)),
            OutputChunk::Stderr(d) => panic!("stderr on a terminal: {d:?}"),
        }
    }
    let exit = flow.exit.wait().await.unwrap();
    assert_eq!(exit.exit_code, 0, "{got}");
    assert_eq!(exit.stderr_total, 0);
    // The terminal turns each \n into \r\n.
    let lines: Vec<&str> = got.split("\r\n").collect();
    assert_eq!(lines[0], "33 101", "{got:?}");
    assert!(lines[1].starts_with("/dev/pts/"), "{got:?}");
    assert_eq!(lines[2], "to-stderr", "{got:?}");
}

#[tokio::test]
async fn a_resize_reaches_the_terminal_and_a_late_one_is_moot() {
    let agent = start_agent().await;
    let s = on_tty("stty size; read line; stty size", 24, 80);
    let mut flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    let mut got = String::new();
    read_until(&mut flow, &mut got, "24 80").await;
    flow.handle
        .resize(TtySize {
            rows: 50,
            cols: 132,
        })
        .await
        .unwrap();
    assert!(flow.handle.stdin(b"go\n").await.unwrap());
    read_until(&mut flow, &mut got, "50 132").await;
    let handle = flow.handle.clone();
    while flow.output.recv().await.is_some() {}
    let exit = flow.exit.wait().await.unwrap();
    assert_eq!(exit.exit_code, 0, "{got}");
    // After the end: no error, and the link serves on.
    handle.resize(TtySize { rows: 1, cols: 1 }).await.unwrap();
    let other = run(&agent, spec(&["echo", "alive"])).await;
    assert_eq!(text(&other.stdout), "alive\n");
}

#[tokio::test]
async fn a_flood_on_a_terminal_stays_within_the_window_and_ends_at_the_deadline() {
    let agent = start_agent().await;
    let mut s = on_tty("yes", 24, 80);
    s.timeout_ms = 1500;
    let mut flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    // Nothing consumed: what arrives stays within the window, then the program blocks.
    let mut cost = 0;
    while let Ok(Some(chunk)) =
        tokio::time::timeout(Duration::from_millis(500), flow.output.recv()).await
    {
        let (OutputChunk::Stdout(d) | OutputChunk::Stderr(d)) = chunk;
        cost += flow_cost(d.len());
    }
    assert!(cost > 0 && cost <= WINDOW, "{cost} cost units in flight");
    // The link is not blocked meanwhile.
    let other = run(&agent, spec(&["echo", "alive"])).await;
    assert_eq!(text(&other.stdout), "alive\n");
    let drain = tokio::spawn(async move {
        while let Some(chunk) = flow.output.recv().await {
            let (OutputChunk::Stdout(d) | OutputChunk::Stderr(d)) = chunk;
            flow.handle.consumed(d.len()).await.unwrap();
        }
    });
    let exit = flow.exit.wait().await.unwrap();
    assert!(exit.timed_out, "{exit:?}");
    drain.await.unwrap();
}

#[tokio::test]
async fn a_program_that_never_reads_or_stdin_closed_early_ends_at_the_deadline() {
    let agent = start_agent().await;
    let mut s = on_tty("sleep 30", 24, 80);
    s.timeout_ms = 1500;
    let flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    let handle = flow.handle.clone();
    // More than the terminal's line buffer and the window: the terminal drops what does
    // not fit a line, or the feeder waits for credit; either way it is done once the exec is.
    let feeding = tokio::spawn(async move { handle.stdin(&vec![b'x'; 4 * MIB]).await });
    let exit = flow.exit.wait().await.unwrap();
    assert!(exit.timed_out, "{exit:?}");
    tokio::time::timeout(Duration::from_secs(5), feeding)
        .await
        .expect("the feeder ends with the exec")
        .unwrap()
        .unwrap();

    // Closing stdin is not end of file on a terminal (^D is): `cat` waits on.
    let mut s = on_tty("cat", 24, 80);
    s.timeout_ms = 1500;
    let flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    flow.handle.close_stdin().await.unwrap();
    let exit = flow.exit.wait().await.unwrap();
    assert!(exit.timed_out, "{exit:?}");

    // ^D typed at the terminal is.
    let s = on_tty("cat", 24, 80);
    let flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    assert!(flow.handle.stdin(b"\x04").await.unwrap());
    let exit = flow.exit.wait().await.unwrap();
    assert_eq!((exit.exit_code, exit.timed_out), (0, false), "{exit:?}");
}

#[tokio::test]
async fn ctrl_c_typed_at_the_terminal_interrupts_the_foreground_program() {
    let agent = start_agent().await;
    let mut s = on_tty("echo ready; exec sleep 30", 24, 80);
    s.timeout_ms = 20_000;
    let mut flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    // The line discipline turns ^C into SIGINT for the terminal's foreground group, which
    // is the program's own (its session): typed once the program runs, so that the
    // terminal has a foreground group to signal (a fixed wait lost the ^C on a loaded host).
    let mut got = String::new();
    read_until(&mut flow, &mut got, "ready").await;
    assert!(flow.handle.stdin(b"\x03").await.unwrap());
    let exit = flow.exit.wait().await.unwrap();
    assert_eq!(
        (exit.exit_code, exit.signal, exit.timed_out),
        (130, Some(libc::SIGINT), false),
        "{exit:?}"
    );
}
