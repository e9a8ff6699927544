//! Shared by the agent's benches: starting an agent on pipes, and medians.
//! Set SANDBOX_AGENT_BIN to measure the static build; otherwise cargo's build is used.

use std::process::Stdio;
use std::time::Duration;

use agent_proto::AgentClient;

pub fn agent_bin() -> String {
    std::env::var("SANDBOX_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sandbox-agent").to_string())
}

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// An agent in `--stdio` mode and a client that completed the handshake.
pub async fn start_agent() -> (AgentClient, tokio::process::Child) {
    let mut child = tokio::process::Command::new(agent_bin())
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("agent starts");
    let (i, o) = (
        child.stdin.take().expect("in"),
        child.stdout.take().expect("out"),
    );
    let client = AgentClient::connect(o, i).await.expect("hello");
    (client, child)
}
