//! The examples under `examples/` run as a user runs them, against the test engine and the
//! adapter on the bwrap plugin, and print exactly the output their READMEs show: the block
//! after the README's `<!-- expected-output FILE` marker is FILE's expected stdout.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use e2e_tests::{bwrap_usable, python_sdk, repo_root, Stack};

/// The fenced block after `<!-- expected-output FILE ... -->` in `readme`.
fn expected_output(readme: &Path, file: &str) -> String {
    let text =
        std::fs::read_to_string(readme).unwrap_or_else(|e| panic!("{}: {e}", readme.display()));
    let after = text
        .split_once(&format!("<!-- expected-output {file}"))
        .unwrap_or_else(|| {
            panic!(
                "{} has no expected-output marker for {file}",
                readme.display()
            )
        })
        .1;
    let block = after
        .split_once("```\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("{}: no fenced block after the marker", readme.display()))
        .0;
    block.to_string()
}

/// Runs `examples/python/<program>` with the official SDK against a fresh stack and checks its
/// stdout against the README's block for it.
async fn python_example_prints_what_its_readme_says(test: &str, program: &str) {
    if !bwrap_usable(test) {
        return;
    }
    let sdk = match python_sdk() {
        Ok(dir) => dir,
        Err(why) => {
            println!("\n*** {test} DID NOT RUN: {why} ***\n");
            return;
        }
    };
    let example = repo_root().join("examples/python");
    let expected = expected_output(&example.join("README.md"), program);
    let stack = Stack::bwrap().await;
    let out = tokio::process::Command::new("/usr/bin/python3")
        .arg(example.join(program))
        .env("III_URL", stack.engine.url())
        .env("PYTHONPATH", &sdk)
        .output()
        .await
        .expect("python3 runs");
    let stdout = succeeded(program, &out, &stack);
    assert_eq!(stdout, expected, "{program}'s output is not its README's");
    let list = stack.call("list", serde_json::json!({})).await.unwrap();
    assert_eq!(
        list["sandboxes"],
        serde_json::json!([]),
        "nothing left: {list}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn python_code_interpreter_prints_what_its_readme_says() {
    python_example_prints_what_its_readme_says(
        "python_code_interpreter_prints_what_its_readme_says",
        "code_interpreter.py",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_streaming_prints_what_its_readme_says() {
    python_example_prints_what_its_readme_says(
        "python_streaming_prints_what_its_readme_says",
        "streaming.py",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn python_repl_prints_what_its_readme_says() {
    python_example_prints_what_its_readme_says(
        "python_repl_prints_what_its_readme_says",
        "repl.py",
    )
    .await;
}

/// A copy of `examples/node` with its locked dependencies installed (`npm ci`), once per test
/// process; or why not (no node or npm, the npm registry not reachable).
fn node_example() -> Result<PathBuf, String> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("sandbox-examples-node-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for file in [
            "package.json",
            "package-lock.json",
            "tsconfig.json",
            "code_interpreter.ts",
        ] {
            std::fs::copy(repo_root().join("examples/node").join(file), dir.join(file))
                .map_err(|e| format!("copying {file}: {e}"))?;
        }
        let out = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--silent"])
            .current_dir(&dir)
            .output()
            .map_err(|e| format!("cannot run npm: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "npm ci could not install the iii-sdk: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        // Type-checked against the SDK's own declarations and compiled (`npm run build`): a
        // type error fails the test, it is not a reason the test did not run.
        let built = Command::new("node_modules/.bin/tsc")
            .args(["-p", "."])
            .current_dir(&dir)
            .output()
            .expect("run the example's tsc");
        assert!(
            built.status.success(),
            "the TypeScript example does not compile:\n{}{}",
            String::from_utf8_lossy(&built.stdout),
            String::from_utf8_lossy(&built.stderr)
        );
        Ok(dir)
    })
    .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn node_code_interpreter_prints_what_its_readme_says() {
    let test = "node_code_interpreter_prints_what_its_readme_says";
    if !bwrap_usable(test) {
        return;
    }
    let dir = match node_example() {
        Ok(dir) => dir,
        Err(why) => {
            println!("\n*** {test} DID NOT RUN: {why} ***\n");
            return;
        }
    };
    let expected = expected_output(
        &repo_root().join("examples/node/README.md"),
        "code_interpreter.ts",
    );
    let stack = Stack::bwrap().await;
    let out = tokio::process::Command::new("node")
        .arg("dist/code_interpreter.js")
        .current_dir(&dir)
        .env("III_URL", stack.engine.url())
        .output()
        .await
        .expect("node runs");
    let stdout = succeeded("the example", &out, &stack);
    // The npm SDK prints its own status lines on stdout (`[iii] Worker registered with ID:
    // <uuid>`, `[OTel] ...`); its README says so, and they are not the example's output.
    let own: String = stdout
        .lines()
        .filter(|line| !line.starts_with("[iii] ") && !line.starts_with("[OTel] "))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(
        own, expected,
        "the example's output is not its README's:\n{stdout}"
    );
    let list = stack.call("list", serde_json::json!({})).await.unwrap();
    assert_eq!(
        list["sandboxes"],
        serde_json::json!([]),
        "nothing left: {list}"
    );
}

/// Copies the tree at `from` into `to` (which exists).
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn compose_project_runs_its_worker_vm_as_its_readme_says() {
    if !bwrap_usable("compose_project_runs_its_worker_vm_as_its_readme_says") {
        return;
    }
    let example = repo_root().join("examples/compose");
    let expected = expected_output(&example.join("README.md"), "compose_calls.sh");
    // A copy the adapter's user owns (an ordinary-user adapter must reach it), as Compose's
    // project directory.
    let project = e2e_tests::host_dir();
    copy_tree(&example, project.path());
    let token = "example-worker-token-0123456789";
    let options = e2e_tests::AdapterOptions {
        env: vec![
            ("III_SANDBOX_WORKER_TOKEN".into(), token.into()),
            (
                "III_COMPOSE_DIR".into(),
                project.path().display().to_string(),
            ),
        ],
        ..e2e_tests::AdapterOptions::default()
    };
    let stack = Stack::start(serde_json::json!({}), options).await;
    let out = tokio::process::Command::new("bash")
        .arg(project.path().join("compose_calls.sh"))
        .env("III_URL", stack.engine.url())
        .env("III_SANDBOX_WORKER_TOKEN", token)
        .env("TRIGGER", e2e_tests::profile_dir().join("trigger"))
        .output()
        .await
        .expect("bash runs");
    let stdout = succeeded("the example", &out, &stack);
    assert_eq!(stdout, expected, "the example's output is not its README's");
}

/// The stdout of an example `what` that must have succeeded; else fails with everything it and
/// the adapter said.
fn succeeded(what: &str, out: &std::process::Output, stack: &Stack) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}\nadapter log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        stack.adapter.log()
    );
    stdout
}
