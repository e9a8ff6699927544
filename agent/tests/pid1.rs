//! PID 1 duties: signal forwarding (on the host), and reaping as a real PID 1 inside a
//! fresh PID namespace (needs `unshare`, root or user namespaces; skipped with a notice
//! otherwise).

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_proto::AgentClient;
use common::*;
use tokio::process::Command;

#[tokio::test]
async fn sigterm_is_forwarded_to_every_exec() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let ready = dir.path().join("ready");
    let script = format!(
        "trap 'echo got-term; exit 5' TERM; touch {}; while :; do sleep 0.05; done",
        ready.display()
    );
    let client = agent.client.clone();
    let pending = tokio::spawn(async move { client.exec(sh(&script)).await });
    let until = Instant::now() + Duration::from_secs(10);
    while !ready.exists() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let agent_pid = agent.child.id().expect("agent running") as libc::pid_t;
    // SAFETY: kill has no memory effects; the pid is our own live child.
    unsafe { libc::kill(agent_pid, libc::SIGTERM) };
    let out = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("exec ends after SIGTERM")
        .expect("task")
        .expect("exec answers");
    assert_eq!(out.exit_code, 5);
    assert_eq!(text(&out.stdout), "got-term\n");
    // The agent itself keeps serving.
    let out = run(&agent, spec(&["echo", "ok"])).await;
    assert_eq!(text(&out.stdout), "ok\n");
}

#[tokio::test]
async fn as_pid_1_orphans_are_reaped() {
    let mut child = match Command::new("unshare")
        .args(["--pid", "--fork", "--mount", "--mount-proc", "--kill-child"])
        .arg(agent_bin())
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("SKIPPED as_pid_1_orphans_are_reaped: cannot run unshare ({e})");
            return;
        }
    };
    let (stdin, stdout) = (
        child.stdin.take().expect("in"),
        child.stdout.take().expect("out"),
    );
    let connect =
        tokio::time::timeout(Duration::from_secs(10), AgentClient::connect(stdout, stdin));
    let client = match connect.await {
        Ok(Ok(client)) => client,
        other => {
            let status = child.wait().await;
            eprintln!(
                "SKIPPED as_pid_1_orphans_are_reaped: no PID namespace here ({:?}, {status:?})",
                other.err()
            );
            return;
        }
    };
    let out = client.exec(sh("echo $PPID")).await.expect("exec");
    assert_eq!(text(&out.stdout), "1\n", "the agent is PID 1");

    let out = client
        .exec(sh("sleep 0.2 >/dev/null 2>&1 & echo $!; exit 7"))
        .await
        .expect("exec");
    assert_eq!(
        out.exit_code, 7,
        "the exec's status is not stolen by the reaper"
    );
    let orphan = parse_pid(&out.stdout);
    // Inside the namespace: the orphan must vanish, not stay a zombie of PID 1.
    let probe = format!(
        "for i in $(seq 100); do [ -e /proc/{orphan} ] || exit 0; sleep 0.05; done; cat /proc/{orphan}/stat; exit 1"
    );
    let out = client.exec(sh(&probe)).await.expect("exec");
    assert_eq!(
        out.exit_code,
        0,
        "orphan left behind: {}",
        text(&out.stdout)
    );
    client.shutdown().await.expect("shutdown");
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .expect("exits")
        .expect("wait");
    assert!(status.success(), "{status:?}");
}
