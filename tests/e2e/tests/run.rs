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
