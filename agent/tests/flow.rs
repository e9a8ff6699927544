//! Flow-controlled execs (`exec_flow`) through the real agent binary and the real client:
//! output held at the window until acknowledged (the program blocks, the connection does
//! not), stdin fed while the program runs, deadlines still end a stalled exec.

mod common;

use std::time::Duration;

use agent_proto::client::OutputChunk;
use agent_proto::{flow_cost, FEATURE_EXEC_FLOW};
use common::*;

const WINDOW: u64 = MIB as u64;

fn len(chunk: &OutputChunk) -> usize {
    match chunk {
        OutputChunk::Stdout(d) | OutputChunk::Stderr(d) => d.len(),
    }
}

#[tokio::test]
async fn output_waits_at_the_window_until_consumed_and_the_connection_serves_on() {
    let agent = start_agent().await;
    assert!(agent.client.supports(FEATURE_EXEC_FLOW));
    let mut s = sh("head -c 10485760 /dev/zero; echo done >&2");
    s.max_output_bytes = usize::MAX;
    let mut flow = agent.client.exec_flow(&s, false, WINDOW).await.unwrap();

    // Nothing consumed: what arrives stays within the window, then stops.
    let mut held = Vec::new();
    let mut cost = 0;
    while let Ok(Some(chunk)) =
        tokio::time::timeout(Duration::from_millis(500), flow.output.recv()).await
    {
        cost += flow_cost(len(&chunk));
        held.push(chunk);
    }
    assert!(!held.is_empty(), "the first chunks come at once");
    assert!(
        cost <= WINDOW,
        "{cost} cost units in flight past the window"
    );
    // The program is blocked, not the link: another exec on it answers.
    let other = run(&agent, spec(&["echo", "alive"])).await;
    assert_eq!(text(&other.stdout), "alive\n");

    // Consuming lets the rest through, in order, to the end.
    let mut stdout = 0usize;
    let mut stderr = Vec::new();
    for chunk in held {
        stdout += len(&chunk);
        flow.handle.consumed(len(&chunk)).await.unwrap();
    }
    while let Some(chunk) = flow.output.recv().await {
        flow.handle.consumed(len(&chunk)).await.unwrap();
        match chunk {
            OutputChunk::Stdout(d) => stdout += d.len(),
            OutputChunk::Stderr(d) => stderr.extend(d),
        }
    }
    let exit = flow.exit.wait().await.unwrap();
    assert_eq!(exit.exit_code, 0);
    assert_eq!(stdout, 10 * MIB);
    assert_eq!(text(&stderr), "done\n");
    assert!(!exit.stdout_truncated && !exit.timed_out);
}

#[tokio::test]
async fn stdin_is_fed_as_it_arrives_and_closing_it_ends_the_program() {
    let agent = start_agent().await;
    let s = spec(&["cat"]);
    let mut flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    for line in ["first\n", "second\n"] {
        assert!(flow.handle.stdin(line.as_bytes()).await.unwrap());
        let mut got = Vec::new();
        while got.len() < line.len() {
            match flow
                .output
                .recv()
                .await
                .expect("cat answers before it ends")
            {
                OutputChunk::Stdout(d) => {
                    flow.handle.consumed(d.len()).await.unwrap();
                    got.extend(d);
                }
                OutputChunk::Stderr(d) => panic!("stderr {d:?}"),
            }
        }
        assert_eq!(text(&got), line);
    }
    flow.handle.close_stdin().await.unwrap();
    assert!(flow.output.recv().await.is_none());
    let exit = flow.exit.wait().await.unwrap();
    assert_eq!(exit.exit_code, 0);
}

#[tokio::test]
async fn stdin_past_the_window_waits_and_gives_up_when_the_exec_ends() {
    let agent = start_agent().await;
    // Never reads its stdin: the agent holds at most a window of it, the host the rest.
    let mut s = spec(&["sleep", "30"]);
    s.timeout_ms = 1500;
    let flow = agent.client.exec_flow(&s, true, WINDOW).await.unwrap();
    let handle = flow.handle.clone();
    let feeding = tokio::spawn(async move { handle.stdin(&vec![b'x'; 16 * MIB]).await });
    let exit = flow.exit.wait().await.unwrap();
    assert!(exit.timed_out);
    let fed = feeding.await.unwrap().unwrap();
    assert!(!fed, "16 MiB did not fit: the call learns the exec ended");
}

#[tokio::test]
async fn a_stalled_consumer_still_ends_at_the_deadline() {
    let agent = start_agent().await;
    let mut s = spec(&["yes"]);
    s.timeout_ms = 1000;
    s.max_output_bytes = usize::MAX;
    let mut flow = agent.client.exec_flow(&s, false, WINDOW).await.unwrap();
    let exit = flow.exit.wait().await.unwrap();
    assert!(exit.timed_out, "{exit:?}");
    assert!(
        exit.stdout_truncated,
        "what did not fit was dropped: {exit:?}"
    );
    let mut cost = 0;
    while let Some(chunk) = flow.output.recv().await {
        cost += flow_cost(len(&chunk));
    }
    assert!(cost <= WINDOW, "{cost}");
}
