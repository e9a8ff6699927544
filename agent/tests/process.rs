//! Signals to execs and background processes, against the real agent over stdio: the
//! grace before SIGKILL, a signal no host may send, paging a ring from any offset, and the
//! refusals a host gets for bad requests.

mod common;

use std::time::{Duration, Instant};

use agent_proto::process::{MAX_LIVE_PROCESSES, MAX_OUTPUT_PAGE, RING_BYTES};
use agent_proto::{ProcErrorCode, ProcInfo, ProcReply, ProcRequest};
use common::{sh, start_agent};
use tokio::sync::mpsc;

async fn started(client: &agent_proto::AgentClient, script: &str) -> ProcInfo {
    let exec = sh(script).to_request();
    match client.process(ProcRequest::Start { exec }).await {
        Ok((ProcReply::Started { info }, _)) => info,
        other => panic!("start {script}: {other:?}"),
    }
}

async fn output(
    client: &agent_proto::AgentClient,
    process_id: u32,
    since: u64,
    max_bytes: u32,
) -> (ProcInfo, u64, u64, Vec<u8>) {
    let request = ProcRequest::Output {
        process_id,
        since,
        max_bytes,
    };
    match client.process(request).await {
        Ok((ProcReply::Output { info, start, next }, bytes)) => (info, start, next, bytes),
        other => panic!("output: {other:?}"),
    }
}

async fn refused(client: &agent_proto::AgentClient, request: ProcRequest) -> ProcErrorCode {
    match client.process(request.clone()).await {
        Ok((ProcReply::Refused { code, .. }, _)) => code,
        other => panic!("{request:?}: {other:?}"),
    }
}

#[tokio::test]
async fn term_then_kill_after_the_grace_and_a_foreign_signal_is_ignored() {
    let agent = start_agent().await;
    let (tx, rx) = mpsc::unbounded_channel();
    let client = agent.client.clone();
    let exec = tokio::spawn(async move {
        let spec = sh("trap '' TERM; echo ready; while :; do sleep 0.1; done");
        client.exec_signalled(spec, Some(rx)).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Not one of the five: the agent ignores it and the exec goes on.
    tx.send(10).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!exec.is_finished(), "a foreign signal ended the exec");
    let asked = Instant::now();
    tx.send(15).unwrap();
    let outcome = exec.await.unwrap().expect("the exec ends");
    let took = asked.elapsed();
    assert_eq!(outcome.exit_code, 128 + 9, "{outcome:?}");
    assert_eq!(outcome.stdout, b"ready\n");
    assert!(
        took >= Duration::from_millis(1800) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[tokio::test]
async fn a_ring_is_paged_from_any_offset_and_keeps_its_last_mib() {
    let agent = start_agent().await;
    let client = &agent.client;
    // 3 MiB of numbered 16-byte lines, then the process ends.
    let info = started(
        client,
        "i=0; while [ $i -lt 196608 ]; do printf '%015d\\n' $i; i=$((i+1)); done",
    )
    .await;
    let id = info.process_id;
    let mut last = info;
    for _ in 0..600 {
        last = output(client, id, 0, 0).await.0;
        if !last.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!last.running, "still running: {last:?}");
    assert_eq!(last.exit_code, Some(0));
    let total = 196_608 * 16;
    assert_eq!(last.total_bytes, total);
    // From 0: the ring's first byte, a page at most.
    let (_, start, next, bytes) = output(client, id, 0, u32::MAX).await;
    assert_eq!(start, total - RING_BYTES as u64);
    assert_eq!(bytes.len(), MAX_OUTPUT_PAGE as usize);
    assert_eq!(next, start + bytes.len() as u64);
    assert_eq!(&bytes[..16], format!("{:015}\n", start / 16).as_bytes());
    // From the middle of the ring, and past its end (nothing, at the end).
    let mid = total - 100 * 16;
    let (_, start, next, bytes) = output(client, id, mid, 32).await;
    assert_eq!((start, next), (mid, mid + 32));
    assert_eq!(
        bytes,
        format!("{:015}\n{:015}\n", mid / 16, mid / 16 + 1).as_bytes()
    );
    let (_, start, next, bytes) = output(client, id, u64::MAX, 10).await;
    assert_eq!((start, next, bytes.len()), (total, total, 0));
}

#[tokio::test]
async fn bad_requests_are_refused_and_the_ceiling_holds() {
    let agent = start_agent().await;
    let client = &agent.client;
    for request in [
        ProcRequest::Output {
            process_id: 7,
            since: 0,
            max_bytes: 1,
        },
        ProcRequest::Kill {
            process_id: 7,
            signal: 15,
        },
    ] {
        assert_eq!(refused(client, request).await, ProcErrorCode::NotFound);
    }
    let sleeper = started(client, "sleep 300").await;
    let bad_signal = ProcRequest::Kill {
        process_id: sleeper.process_id,
        signal: 19,
    };
    assert_eq!(refused(client, bad_signal).await, ProcErrorCode::BadSignal);
    for _ in 1..MAX_LIVE_PROCESSES {
        started(client, "sleep 300").await;
    }
    let exec = sh("sleep 300").to_request();
    assert_eq!(
        refused(client, ProcRequest::Start { exec }).await,
        ProcErrorCode::TooMany
    );
    let kill = ProcRequest::Kill {
        process_id: sleeper.process_id,
        signal: 9,
    };
    assert!(matches!(
        client.process(kill).await,
        Ok((ProcReply::Signalled { .. }, _))
    ));
    for _ in 0..50 {
        if !output(client, sleeper.process_id, 0, 0).await.0.running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (info, ..) = output(client, sleeper.process_id, 0, 0).await;
    assert_eq!(info.exit_code, Some(128 + 9), "{info:?}");
    // Room for one again.
    started(client, "true").await;
    let listed = match client.process(ProcRequest::List).await {
        Ok((ProcReply::List { processes }, _)) => processes,
        other => panic!("{other:?}"),
    };
    assert_eq!(listed.len(), MAX_LIVE_PROCESSES + 1);
}
