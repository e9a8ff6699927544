//! The `iii-test-engine` binary: ready line on stdout, `--config` seeds, clean stop on SIGTERM.

use std::process::Stdio;
use std::time::Duration;

use iii_test_engine::client::Client;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prints_its_url_serves_seeded_config_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cfg.json");
    std::fs::write(&file, r#"{"greeting": "${III_TEST_ENGINE_UNSET:hello}"}"#).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_iii-test-engine"))
        .args(["--listen", "127.0.0.1:0", "--config"])
        .arg(format!("my-config={}", file.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("ready line in time")
        .unwrap()
        .expect("a line");
    let url = line
        .strip_prefix("iii-test-engine listening on ")
        .unwrap_or_else(|| panic!("unexpected ready line {line:?}"));
    assert!(url.starts_with("ws://127.0.0.1:"), "{url}");

    let client = Client::connect(url).await.unwrap();
    let got = client
        .invoke("configuration::get", json!({"id": "my-config"}), WAIT)
        .await
        .unwrap();
    assert_eq!(got["value"], json!({"greeting": "hello"}));

    let pid = child.id().expect("running");
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(WAIT, child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn unreadable_config_file_exits_2() {
    let output = Command::new(env!("CARGO_BIN_EXE_iii-test-engine"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--config",
            "x=does-not-exist.json",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read"));
}
