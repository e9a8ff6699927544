//! The static agent runs in a root holding nothing but itself (no libc, no /bin/sh, no
//! /dev). Needs the static build in SANDBOX_AGENT_BIN (see build-static.sh) and root
//! for chroot; skipped with a notice otherwise.

mod common;

use std::process::Stdio;
use std::time::Duration;

use agent_proto::{AgentClient, FsRequest, FsResponse};
use common::*;

#[tokio::test]
async fn static_agent_serves_from_an_empty_root() {
    let Ok(bin) = std::env::var("SANDBOX_AGENT_BIN") else {
        eprintln!("SKIPPED static_agent_serves_from_an_empty_root: SANDBOX_AGENT_BIN not set");
        return;
    };
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::copy(&bin, root.path().join("agent")).expect("copy agent");
    let spawned = tokio::process::Command::new("chroot")
        .arg(root.path())
        .args(["/agent", "--stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            eprintln!("SKIPPED static_agent_serves_from_an_empty_root: no chroot ({e})");
            return;
        }
    };
    let (i, o) = (
        child.stdin.take().expect("in"),
        child.stdout.take().expect("out"),
    );
    let client = match tokio::time::timeout(Duration::from_secs(10), AgentClient::connect(o, i))
        .await
    {
        Ok(Ok(client)) => client,
        other => {
            let status = child.wait().await;
            // chroot itself fails without root; a dynamic agent would fail here too,
            // so only a non-root run may skip.
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                eprintln!("SKIPPED static_agent_serves_from_an_empty_root: not root ({status:?})");
                return;
            }
            panic!(
                "agent did not start in an empty root: {:?} {status:?}",
                other.err()
            );
        }
    };
    let out = client
        .exec(spec(&["/bin/sh", "-c", "true"]))
        .await
        .expect("exec");
    assert_eq!(out.exit_code, 127);
    let listing = client
        .fs(FsRequest::Ls { path: "/".into() })
        .await
        .expect("ls");
    match listing {
        FsResponse::Entries { entries } => {
            let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
            assert_eq!(names, vec!["agent"]);
        }
        other => panic!("{other:?}"),
    }
    client.shutdown().await.expect("shutdown");
}
