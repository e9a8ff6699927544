//! Bad input end to end: every malformed payload of the table gets S001 (never a panic, never
//! another code), and the adapter keeps serving afterwards.

mod sandbox_support;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{create, expect_err, stop};
use serde_json::{json, Value};

/// `(function, payload, why it is malformed)`; `SID` in a payload stands for a live sandbox.
fn table(sid: &str) -> Vec<(&'static str, Value, &'static str)> {
    let huge = "a".repeat(2 * 1024 * 1024);
    vec![
        // Not an object at all.
        ("create", json!(null), "null payload"),
        ("create", json!([]), "array payload"),
        ("exec", json!("exec"), "string payload"),
        ("stop", json!(42), "number payload"),
        ("run", json!(true), "boolean payload"),
        // create.
        ("create", json!({}), "create without image"),
        ("create", json!({"image": 5}), "image of the wrong type"),
        ("create", json!({"image": ""}), "empty image"),
        (
            "create",
            json!({"image": "python", "cpus": -1}),
            "negative cpus",
        ),
        ("create", json!({"image": "python", "cpus": 0}), "zero cpus"),
        (
            "create",
            json!({"image": "python", "cpus": 1.5}),
            "fractional cpus",
        ),
        (
            "create",
            json!({"image": "python", "memory_mb": "512"}),
            "memory as a string",
        ),
        (
            "create",
            json!({"image": "python", "memory_mb": 1}),
            "memory below any use",
        ),
        (
            "create",
            json!({"image": "python", "network": "yes"}),
            "network not a boolean",
        ),
        (
            "create",
            json!({"image": "python", "idle_timeout_secs": 0}),
            "zero idle timeout",
        ),
        (
            "create",
            json!({"image": "python", "idle_timeout_secs": -3}),
            "negative idle timeout",
        ),
        (
            "create",
            json!({"image": "python", "name": ""}),
            "empty name",
        ),
        (
            "create",
            json!({"image": "python", "name": huge.clone()}),
            "huge name",
        ),
        (
            "create",
            json!({"image": "python", "env": "A=1"}),
            "env as a string",
        ),
        (
            "create",
            json!({"image": "python", "env": {"A": 1}}),
            "env map with a number",
        ),
        (
            "create",
            json!({"image": "python", "env": ["NOEQUALS"]}),
            "env entry without =",
        ),
        (
            "create",
            json!({"image": "python", "env": ["=value"]}),
            "env entry without a name",
        ),
        // exec.
        ("exec", json!({"argv": ["true"]}), "exec without sandbox_id"),
        (
            "exec",
            json!({"sandbox_id": "not-a-uuid", "argv": ["true"]}),
            "bad UUID",
        ),
        (
            "exec",
            json!({"sandbox_id": 7, "argv": ["true"]}),
            "sandbox_id a number",
        ),
        (
            "exec",
            json!({"sandbox_id": huge.clone(), "argv": ["true"]}),
            "huge sandbox_id",
        ),
        ("exec", json!({"sandbox_id": sid}), "no command"),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["echo"], "cmd": "echo"}),
            "argv with cmd",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["echo"], "args": ["x"]}),
            "argv with args",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "args": ["x"]}),
            "args without cmd",
        ),
        ("exec", json!({"sandbox_id": sid, "argv": []}), "empty argv"),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": [""]}),
            "empty program",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": [1, 2]}),
            "argv of numbers",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": "echo hi"}),
            "argv as a string",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "cmd": "echo 'unclosed"}),
            "unclosed quote",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["echo", "a\u{0}b"]}),
            "NUL in argv",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "cmd": "echo\u{0}"}),
            "NUL in cmd",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["env"], "env": ["X"]}),
            "env entry without =",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["env"], "env": {"A": null}}),
            "env map with null",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["env"], "env": ["A=\u{0}"]}),
            "NUL in env",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["env"], "env": 3}),
            "env a number",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["cat"], "stdin": "***"}),
            "stdin not base64",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["cat"], "stdin": 12}),
            "stdin a number",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["true"], "timeout_ms": 0}),
            "zero timeout",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["true"], "timeout_ms": -5}),
            "negative timeout",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["true"], "timeout_ms": "100"}),
            "timeout as a string",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["true"], "timeout_ms": 1.5}),
            "fractional timeout",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["pwd"], "workdir": "tmp"}),
            "relative workdir",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "argv": ["pwd"], "workdir": "/tmp\u{0}"}),
            "NUL in workdir",
        ),
        (
            "exec",
            json!({"sandbox_id": sid, "cmd": format!("echo '{huge}")}),
            "huge unclosed cmd",
        ),
        // stop.
        ("stop", json!({}), "stop without sandbox_id"),
        (
            "stop",
            json!({"sandbox_id": "1234"}),
            "stop with a bad UUID",
        ),
        (
            "stop",
            json!({"sandbox_id": sid, "wait": "yes"}),
            "wait not a boolean",
        ),
        // run.
        (
            "run",
            json!({"image": "python", "lang": "python"}),
            "run without code",
        ),
        (
            "run",
            json!({"image": "python", "code": "print(1)"}),
            "run without lang",
        ),
        (
            "run",
            json!({"code": "print(1)", "lang": "python"}),
            "run without image",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": ""}),
            "empty lang",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "py\u{0}"}),
            "NUL in lang",
        ),
        (
            "run",
            json!({"image": "python", "code": 1, "lang": "python"}),
            "code a number",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "files": "x"}),
            "files not an array",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "files": [{"path": "", "content": ""}]}),
            "empty file path",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "files": [{"path": "a"}]}),
            "file without content",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "stdin": "%%"}),
            "run stdin not base64",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "env": [1]}),
            "run env of numbers",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "timeout_ms": 0}),
            "run zero timeout",
        ),
        (
            "run",
            json!({"image": "python", "code": "1", "lang": "python", "keep_sandbox": 1}),
            "keep_sandbox a number",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_malformed_payload_is_s001_and_the_adapter_keeps_serving() {
    if !bwrap_usable("every_malformed_payload_is_s001_and_the_adapter_keeps_serving") {
        return;
    }
    let mut stack = Stack::bwrap().await;
    let sid = create(&stack, "python", json!({})).await;
    let cases = table(&sid);
    assert!(cases.len() >= 30, "the table holds at least 30 payloads");
    let mut wrong = Vec::new();
    for (function, payload, why) in &cases {
        match stack.call(function, payload.clone()).await {
            Ok(answer) => wrong.push(format!("{function} ({why}): answered {answer}")),
            Err(e) => {
                let (code, body) = expect_err(Err(e), why);
                if code != "S001" {
                    wrong.push(format!("{function} ({why}): {code} {body}"));
                } else if body["type"] != "invalid_request" || body["retryable"] != false {
                    wrong.push(format!("{function} ({why}): body {body}"));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} malformed payloads were not S001:\n{}\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n"),
        stack.adapter.log()
    );

    // Nothing was started by the bad calls, and the adapter still serves every kind of call.
    assert!(
        stack.adapter.is_running(),
        "adapter died:\n{}",
        stack.adapter.log()
    );
    let info = stack.call("adapter::info", json!({})).await.expect("info");
    assert_eq!(info["contract"]["major"], 1, "{info}");
    let list = stack.call("list", json!({})).await.expect("list");
    assert_eq!(
        list["in_flight"], 1,
        "only the one sandbox of the test: {list}"
    );
    let echo = stack
        .call(
            "exec",
            json!({"sandbox_id": sid, "argv": ["echo", "still here"]}),
        )
        .await
        .expect("exec after the table");
    assert_eq!(echo["stdout"], "still here\n");
    let run = stack
        .call(
            "run",
            json!({"image": "python", "code": "print(6*7)", "lang": "python"}),
        )
        .await
        .expect("run after the table");
    assert_eq!(run["stdout"], "42\n");
    stop(&stack, &sid, true).await;
}
