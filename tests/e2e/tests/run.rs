//! `run` end to end: the classic one-shot call in each language, nothing left behind.

use e2e_tests::{bwrap_usable, Stack};
use serde_json::json;

#[tokio::test(flavor = "multi_thread")]
async fn run_prints_42_in_every_language_and_leaves_nothing() {
    if !bwrap_usable("run_prints_42_in_every_language_and_leaves_nothing") {
        return;
    }
    let stack = Stack::bwrap().await;
    for (image, lang, code) in [
        ("python", "python", "print(6*7)"),
        ("python", "py", "print(6*7)"),
        ("node", "node", "console.log(6*7)"),
        ("node", "javascript", "console.log(6*7)"),
        ("python", "sh", "echo $((6*7))"),
    ] {
        let result = stack
            .call("run", json!({"image": image, "code": code, "lang": lang}))
            .await
            .unwrap_or_else(|e| panic!("{lang}: {e:?}\n{}", stack.adapter.log()));
        assert_eq!(result["stdout"], "42\n", "{lang}: {result}");
        assert_eq!(result["stderr"], "", "{lang}: {result}");
        assert_eq!(result["exit_code"], 0);
        assert_eq!(result["success"], true);
        assert_eq!(result["timed_out"], false);
        assert_eq!(result["stdout_truncated"], false);
        assert!(result.get("sandbox_id").is_none(), "not kept: {result}");
        let list = stack.call("list", json!({})).await.unwrap();
        assert_eq!(list["sandboxes"], json!([]), "{lang}: {list}");
        assert_eq!(list["in_flight"], 0);
    }
    let layers = std::fs::read_dir(stack.state_dir.path().join("sandboxes"))
        .unwrap()
        .count();
    assert_eq!(layers, 0, "no sandbox state left on disk");
}

/// `keep_sandbox`: the sandbox outlives the call (with the code and files in it) and its id
/// comes back; when the run fails the sandbox goes anyway, since nobody could reach it.
#[tokio::test(flavor = "multi_thread")]
async fn keep_sandbox_keeps_it_only_on_success() {
    if !bwrap_usable("keep_sandbox_keeps_it_only_on_success") {
        return;
    }
    let stack = Stack::bwrap().await;
    let kept = stack
        .call(
            "run",
            json!({"image": "python", "lang": "python", "keep_sandbox": true,
                   "code": "print(open('data.txt').read())",
                   "files": [{"path": "data.txt", "content": "kept"}]}),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:?}\n{}", stack.adapter.log()));
    assert_eq!(kept["stdout"], "kept\n", "{kept}");
    let id = kept["sandbox_id"].as_str().expect("sandbox_id").to_string();
    let again = stack
        .call("exec", json!({"sandbox_id": id, "argv": ["python3", "/tmp/iii-run/main.py"], "workdir": "/tmp/iii-run"}))
        .await
        .expect("exec in the kept sandbox");
    assert_eq!(again["stdout"], "kept\n", "{again}");
    stack
        .call("stop", json!({"sandbox_id": id, "wait": true}))
        .await
        .expect("stop");

    let timed_out = stack
        .call(
            "run",
            json!({"image": "python", "lang": "sh", "keep_sandbox": true, "timeout_ms": 300,
                   "code": "echo started; sleep 30"}),
        )
        .await
        .unwrap_err();
    assert_eq!(e2e_tests::s_code(&timed_out), "S200", "{timed_out:?}");
    assert_eq!(
        e2e_tests::error_body(&timed_out)["output"]["stdout"],
        "started\n"
    );
    let list = stack.call("list", json!({})).await.unwrap();
    assert_eq!(
        list["sandboxes"],
        json!([]),
        "a failed kept run leaves nothing: {list}"
    );
}
