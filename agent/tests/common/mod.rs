//! Spawns the real agent binary with `--stdio` and connects an `AgentClient` to it.

#![allow(dead_code)] // each test file uses a different subset

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use agent_proto::{AgentClient, ExecOutcome, ExecSpec};
use tokio::process::{Child, Command};

pub const MIB: usize = 1024 * 1024;

pub struct Agent {
    pub client: AgentClient,
    pub child: Child,
}

/// The agent under test: `$SANDBOX_AGENT_BIN` (e.g. the static build from
/// `build-static.sh`), else the binary cargo built for these tests.
pub fn agent_bin() -> String {
    std::env::var("SANDBOX_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_sandbox-agent").to_string())
}

pub async fn start_agent() -> Agent {
    start_agent_from(Command::new(agent_bin()).arg("--stdio")).await
}

/// The agent started by `command` (which must run it with `--stdio`).
pub async fn start_agent_from(command: &mut Command) -> Agent {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("agent binary starts");
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    let client = tokio::time::timeout(Duration::from_secs(10), AgentClient::connect(stdout, stdin))
        .await
        .expect("hello within 10 s")
        .expect("handshake succeeds");
    Agent { client, child }
}

pub fn spec(argv: &[&str]) -> ExecSpec {
    ExecSpec {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        workdir: None,
        stdin: Vec::new(),
        timeout_ms: 30_000,
        max_output_bytes: MIB,
        tty: None,
    }
}

pub fn sh(script: &str) -> ExecSpec {
    spec(&["sh", "-c", script])
}

pub async fn run(agent: &Agent, spec: ExecSpec) -> ExecOutcome {
    agent.client.exec(spec).await.expect("exec answers")
}

pub fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).expect("utf-8 output")
}

/// True once `/proc/<pid>` is gone (killed and reaped), polling up to `within`.
pub async fn pid_gone(pid: u32, within: Duration) -> bool {
    let path = format!("/proc/{pid}");
    let until = Instant::now() + within;
    while Instant::now() < until {
        if !Path::new(&path).exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

pub fn parse_pid(out: &[u8]) -> u32 {
    text(out)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("first line is a pid")
}
