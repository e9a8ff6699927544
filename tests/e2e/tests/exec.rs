//! `exec` end to end on the bwrap plugin: the three command shapes, base64 stdin, env in both
//! shapes (create env and exec env merged), workdir, 127/126, the timeout clamp, S200 with the
//! partial output, bounded output and memory, no lost tail, and group kill on timeout.

mod sandbox_support;

use std::time::Duration;

use base64::Engine as _;
use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{
    create, descendants, eventually, exec, exec_ok, expect_err, sh, status_kib, stdout, stop,
    timeout_kills_the_grandchild,
};
use serde_json::json;

const MIB: usize = 1024 * 1024;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread")]
async fn command_shapes_stdin_env_workdir_and_exit_codes() {
    if !bwrap_usable("command_shapes_stdin_env_workdir_and_exit_codes") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(
        &stack,
        "python",
        json!({"env": {"FROM_CREATE": "c", "SHARED": "create"}}),
    )
    .await;

    // The three command shapes give the program the same argv; the line is split like a
    // shell splits it, without expanding anything.
    for shape in [
        json!({"argv": ["echo", "a b", "c"]}),
        json!({"cmd": "echo", "args": ["a b", "c"]}),
        json!({"cmd": "echo 'a b' c"}),
    ] {
        let result = exec_ok(&stack, &id, shape.clone()).await;
        assert_eq!(stdout(&result), "a b c\n", "{shape}: {result}");
        assert_eq!(result["exit_code"], 0);
        assert_eq!(result["success"], true);
    }
    let line = exec_ok(&stack, &id, json!({"cmd": r#"echo "$HOME" \$x '*'"#})).await;
    assert_eq!(stdout(&line), "$HOME $x *\n", "no expansion: {line}");

    // stdin is base64, padded or not, and binary-safe.
    let text = exec_ok(
        &stack,
        &id,
        json!({"argv": ["cat"], "stdin": b64(b"hello\nworld\n")}),
    )
    .await;
    assert_eq!(stdout(&text), "hello\nworld\n");
    let unpadded = exec_ok(&stack, &id, json!({"argv": ["cat"], "stdin": "aGk"})).await;
    assert_eq!(stdout(&unpadded), "hi");
    let all_bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let counted = exec_ok(
        &stack,
        &id,
        json!({"argv": ["wc", "-c"], "stdin": b64(&all_bytes)}),
    )
    .await;
    assert_eq!(stdout(&counted).trim(), "70000", "{counted}");
    let check =
        "import sys; d = sys.stdin.buffer.read(); print(d == bytes(i % 256 for i in range(70000)))";
    let same = exec_ok(
        &stack,
        &id,
        json!({"argv": ["python3", "-c", check], "stdin": b64(&all_bytes)}),
    )
    .await;
    assert_eq!(
        stdout(&same),
        "True\n",
        "stdin arrives byte for byte: {same}"
    );

    // Stdin larger than any pipe buffer, to programs that read part of it or none at all.
    let big_stdin = b64(&vec![b'z'; 3 * MIB]);
    let part = exec_ok(
        &stack,
        &id,
        json!({"argv": ["head", "-c", "5"], "stdin": big_stdin}),
    )
    .await;
    assert_eq!(
        (stdout(&part), &part["exit_code"]),
        ("zzzzz", &json!(0)),
        "{part}"
    );
    let none = exec_ok(&stack, &id, json!({"argv": ["true"], "stdin": big_stdin})).await;
    assert_eq!(none["exit_code"], 0, "{none}");

    // env: the create env is the base, the exec env overrides it, in either shape.
    let show = "echo \"$FROM_CREATE|$SHARED|$FROM_EXEC\"";
    let base = exec_ok(&stack, &id, sh(show)).await;
    assert_eq!(stdout(&base), "c|create|\n");
    let mut listed = sh(show);
    listed["env"] = json!(["SHARED=exec", "FROM_EXEC=e=1"]);
    assert_eq!(stdout(&exec_ok(&stack, &id, listed).await), "c|exec|e=1\n");
    let mut mapped = sh(show);
    mapped["env"] = json!({"FROM_EXEC": "m"});
    assert_eq!(stdout(&exec_ok(&stack, &id, mapped).await), "c|create|m\n");
    let listed_create = create(&stack, "python", json!({"env": ["L=from list", "M="]})).await;
    let result = exec_ok(&stack, &listed_create, sh("echo \"$L|${M-unset}\"")).await;
    assert_eq!(stdout(&result), "from list|\n");
    stop(&stack, &listed_create, true).await;

    // workdir.
    for dir in ["/tmp", "/etc"] {
        let result = exec_ok(&stack, &id, json!({"argv": ["pwd"], "workdir": dir})).await;
        assert_eq!(stdout(&result), format!("{dir}\n"));
    }

    // Exit codes pass through; a missing program is 127, a non-executable one 126; neither is
    // an error.
    let three = exec_ok(&stack, &id, sh("echo out; exit 3")).await;
    assert_eq!(
        (three["exit_code"].clone(), three["success"].clone()),
        (json!(3), json!(false))
    );
    assert_eq!(stdout(&three), "out\n");
    for (argv, code) in [
        (json!(["/no/such/program"]), 127),
        (json!(["no-such-program-on-path"]), 127),
        (json!(["/etc/motd"]), 126),
    ] {
        let result = exec_ok(&stack, &id, json!({"argv": argv})).await;
        assert_eq!(result["exit_code"], code, "{argv}: {result}");
        assert_eq!(result["success"], false, "{argv}: {result}");
        assert_eq!(result["timed_out"], false, "{argv}: {result}");
    }
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn timeouts_are_clamped_carry_partial_output_and_kill_every_descendant() {
    if !bwrap_usable("timeouts_are_clamped_carry_partial_output_and_kill_every_descendant") {
        return;
    }
    let ceiling_ms = 3000;
    let stack = Stack::start(
        json!({"max_exec_timeout_ms": ceiling_ms}),
        Default::default(),
    )
    .await;
    let id = create(&stack, "python", json!({})).await;

    // Asked for ten minutes, cut at the ceiling; S200 carries what was printed before.
    let mut long = sh("echo before; echo err-before >&2; sleep 60; echo never");
    long["timeout_ms"] = json!(600_000);
    let (code, body) = expect_err(exec(&stack, &id, long).await, "clamped exec");
    assert_eq!(code, "S200", "{body}");
    let output = &body["output"];
    assert_eq!(output["stdout"], "before\n", "{body}");
    assert_eq!(output["stderr"], "err-before\n", "{body}");
    assert_eq!(output["timed_out"], true, "{body}");
    assert_eq!(output["success"], false, "{body}");
    let took = output["duration_ms"].as_u64().expect("duration_ms");
    assert!(
        (ceiling_ms..60_000).contains(&took),
        "cut at the {ceiling_ms} ms ceiling, not at 10 min nor at the program's end: {took} ms"
    );

    // A timeout under the ceiling is honoured as asked.
    let mut short = sh("echo quick; sleep 60");
    short["timeout_ms"] = json!(200);
    let (code, body) = expect_err(exec(&stack, &id, short).await, "short timeout");
    assert_eq!(code, "S200", "{body}");
    assert_eq!(body["output"]["stdout"], "quick\n", "{body}");
    let took = body["output"]["duration_ms"].as_u64().expect("duration_ms");
    assert!(
        took < ceiling_ms,
        "the asked 200 ms were used, not the ceiling: {took}"
    );

    // A program printing without end: S200 whose partial output is still capped.
    let mut endless = sh("yes endless");
    endless["timeout_ms"] = json!(1000);
    let (code, body) = expect_err(exec(&stack, &id, endless).await, "endless output");
    assert_eq!(code, "S200");
    assert_eq!(body["output"]["stdout"].as_str().map(str::len), Some(MIB));
    assert_eq!(body["output"]["stdout_truncated"], true);

    // A grandchild (own shell, same process group) writes its pid; the timeout kills it too.
    timeout_kills_the_grandchild(&stack, &id, 1000, Duration::from_secs(5)).await;

    // A background child holding stdout open: the program itself ends at once, the call ends
    // at its timeout with what was printed, and the child is killed.
    let mut holder = sh("sleep 1000 & echo started");
    holder["timeout_ms"] = json!(1000);
    let (code, body) = expect_err(exec(&stack, &id, holder).await, "background holder");
    assert_eq!(code, "S200", "{body}");
    assert_eq!(body["output"]["stdout"], "started\n", "{body}");

    // Seen from the host: no `sleep` left under the adapter (every one above was killed).
    let adapter = stack.adapter.pid();
    let no_sleep = eventually(Duration::from_secs(5), || async {
        !descendants(adapter).iter().any(|p| p.comm == "sleep")
    })
    .await;
    assert!(no_sleep, "sleeps left: {:?}", descendants(adapter));

    // The sandbox keeps serving after its timeouts.
    let after = exec_ok(&stack, &id, json!({"argv": ["echo", "alive"]})).await;
    assert_eq!(stdout(&after), "alive\n");
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn fifty_mib_of_output_keeps_one_mib_per_stream_and_adapter_memory_bounded() {
    if !bwrap_usable("fifty_mib_of_output_keeps_one_mib_per_stream_and_adapter_memory_bounded") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;

    // At the cap exactly: nothing cut, no flag. One byte more: cut, flagged.
    let exact = exec_ok(&stack, &id, sh("yes x | head -c 1048576")).await;
    assert_eq!(stdout(&exact).len(), MIB);
    assert_eq!(exact["stdout_truncated"], false);
    let over = exec_ok(&stack, &id, sh("yes x | head -c 1048577")).await;
    assert_eq!(stdout(&over).len(), MIB);
    assert_eq!(over["stdout_truncated"], true);
    assert_eq!(over["stderr_truncated"], false);

    let adapter = stack.adapter.pid();
    let before = status_kib(adapter, "VmHWM").expect("adapter VmHWM");
    let fifty = 50 * MIB;
    let script = format!(
        "yes 0123456789abcdef | head -c {fifty}; yes fedcba9876543210 | head -c {fifty} >&2"
    );
    let big = exec_ok(&stack, &id, sh(&script)).await;
    let after = status_kib(adapter, "VmHWM").expect("adapter VmHWM");

    let expect = |line: &str| line.repeat(MIB / line.len() + 1)[..MIB].to_string();
    assert_eq!(
        big["exit_code"],
        0,
        "{}",
        big["stderr"]
            .as_str()
            .map(|s| &s[..s.len().min(200)])
            .unwrap_or("")
    );
    assert_eq!(big["stdout"].as_str().map(str::len), Some(MIB));
    assert_eq!(big["stderr"].as_str().map(str::len), Some(MIB));
    assert!(
        big["stdout"] == expect("0123456789abcdef\n"),
        "stdout is the first MiB"
    );
    assert!(
        big["stderr"] == expect("fedcba9876543210\n"),
        "stderr is the first MiB"
    );
    assert_eq!(big["stdout_truncated"], true);
    assert_eq!(big["stderr_truncated"], true);

    let growth_mib = after.saturating_sub(before) as f64 / 1024.0;
    println!(
        "adapter VmHWM {before} KiB -> {after} KiB (+{growth_mib:.1} MiB) for 100 MiB printed"
    );
    assert!(
        growth_mib < 16.0,
        "the adapter's peak memory grew by {growth_mib:.1} MiB for 2 x 50 MiB printed"
    );
    stop(&stack, &id, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn last_bytes_before_exit_are_never_lost_over_1000_runs() {
    if !bwrap_usable("last_bytes_before_exit_are_never_lost_over_1000_runs") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    const RUNS: usize = 1000;
    const WORKERS: usize = 4; // the default exec cap of one sandbox
    const BULK: usize = 65_536;
    // A pipe-full of output, then the last bytes on both streams, then exit at once.
    let script =
        format!("yes ab | head -c {BULK}; printf 'out-%s' \"$1\"; printf 'err-%s' \"$1\" >&2");
    let bulk = "ab\n".repeat(BULK / 3 + 1)[..BULK].to_string();
    let worker = |first: usize| {
        let (stack, id, script, bulk) = (&stack, &id, &script, &bulk);
        async move {
            let mut failures = Vec::new();
            for run in (first..RUNS).step_by(WORKERS) {
                let fields = json!({"argv": ["/bin/sh", "-c", script, "sh", run.to_string()]});
                match exec(stack, id, fields).await {
                    Ok(result) => {
                        let want_out = format!("{bulk}out-{run}");
                        let want_err = format!("err-{run}");
                        if result["stdout"] != want_out.as_str()
                            || result["stderr"] != want_err.as_str()
                            || result["exit_code"] != 0
                        {
                            let out = result["stdout"].as_str().unwrap_or("");
                            failures.push(format!(
                                "run {run}: stdout {} bytes ending {:?}, stderr {:?}, exit {}",
                                out.len(),
                                &out[out.len().saturating_sub(12)..],
                                result["stderr"],
                                result["exit_code"]
                            ));
                        }
                    }
                    Err(e) => failures.push(format!("run {run}: {e:?}")),
                }
            }
            failures
        }
    };
    let failures: Vec<String> = futures::future::join_all((0..WORKERS).map(worker))
        .await
        .into_iter()
        .flatten()
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {RUNS} runs lost output or failed; first ones: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    stop(&stack, &id, true).await;
}
