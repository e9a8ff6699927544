//! fs grep and fs sed through the agent against GNU `grep -rn` and `sed -i` run directly on
//! the same generated tree, in one process. The agent's numbers include the protocol round
//! trip and the reply's JSON; the tools' include a process spawn.
//! Set SANDBOX_AGENT_BIN to measure the static build; otherwise cargo's build is used.

mod common;

use common::{agent_bin, median, start_agent};

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_proto::fs::SedTarget;
use agent_proto::{FsRequest, FsResponse};

const RUNS: usize = 15;
const FILES: usize = 400;
const LINES: usize = 2_000;

/// FILES files of LINES lines in 20 directories; one line in 500 holds `needle<N>`.
fn make_tree(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for f in 0..FILES {
        let dir = root.join(format!("d{:02}", f % 20));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut text = String::new();
        for l in 0..LINES {
            if (f * LINES + l).is_multiple_of(500) {
                text.push_str(&format!("    let needle{l} = alpha({f});\n"));
            } else {
                text.push_str(&format!(
                    "    filler line {l} of file {f}: alpha beta gamma\n"
                ));
            }
        }
        let path = dir.join(format!("f{f:04}.txt"));
        std::fs::write(&path, text).expect("write");
        files.push(path.to_string_lossy().into_owned());
    }
    files
}

fn timed(mut run: impl FnMut()) -> Duration {
    let t = Instant::now();
    run();
    t.elapsed()
}

fn row(name: &str, ours: Duration, base: Duration, base_name: &str) {
    let ratio = ours.as_secs_f64() / base.as_secs_f64();
    println!(
        "| {name:<34} | {:>9.2} | {base_name:<30} | {:>9.2} | {ratio:>6.2}x |",
        ours.as_secs_f64() * 1e3,
        base.as_secs_f64() * 1e3
    );
}

fn tool(argv: &[&str]) {
    let status = Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .status()
        .expect("tool runs");
    assert!(status.success(), "{argv:?}");
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_string_lossy().into_owned();
    let files = make_tree(dir.path());
    println!(
        "agent: {}\ntree: {FILES} files x {LINES} lines, {} matching lines",
        agent_bin(),
        FILES * LINES / 500
    );
    println!(
        "| {:<34} | {:>9} | {:<30} | {:>9} | {:>7} |",
        "measure (median)", "ms", "baseline (same run)", "ms", "ratio"
    );
    println!(
        "|{:-<36}|{:-<11}|{:-<32}|{:-<11}|{:-<9}|",
        "", "", "", "", ""
    );
    let (client, _child) = start_agent().await;

    let grep = |pattern: &str| FsRequest::Grep {
        path: root.clone(),
        pattern: pattern.to_string(),
        recursive: true,
        ignore_case: false,
        include_glob: Vec::new(),
        exclude_glob: Vec::new(),
        max_matches: 100_000,
        max_line_bytes: 4096,
    };
    for (name, pattern, base) in [
        ("fs grep literal `needle`", "needle", "grep -rn needle"),
        (
            "fs grep regex `needle[0-9]+ =`",
            "needle[0-9]+ =",
            "grep -rnE 'needle[0-9]+ ='",
        ),
    ] {
        // Interleaved, so that the load of a shared machine weighs on both alike.
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let t = Instant::now();
            let FsResponse::Matches { matches, .. } = client.fs(grep(pattern)).await.expect("grep")
            else {
                panic!("not matches")
            };
            ours.push(t.elapsed());
            assert_eq!(matches.len(), FILES * LINES / 500);
            theirs.push(timed(|| tool(&["grep", "-rnE", pattern, &root])));
        }
        row(name, median(ours), median(theirs), base);
    }

    // Each run: the agent turns alpha into omega in every file, then `sed -i` turns it back,
    // so both rewrite every file every time.
    let sed = FsRequest::Sed {
        target: SedTarget::Files(files.clone()),
        pattern: "alpha".to_string(),
        replacement: "omega".to_string(),
        regex: true,
        first_only: false,
        ignore_case: false,
        recursive: true,
        include_glob: Vec::new(),
        exclude_glob: Vec::new(),
    };
    let mut ours = Vec::new();
    let mut theirs = Vec::new();
    for _ in 0..RUNS {
        let t = Instant::now();
        let FsResponse::Replaced {
            total_replacements, ..
        } = client.fs(sed.clone()).await.expect("sed")
        else {
            panic!("not replaced")
        };
        ours.push(t.elapsed());
        assert_eq!(total_replacements, (FILES * LINES) as u64);
        let mut argv = vec!["sed", "-i", "s/omega/alpha/g"];
        argv.extend(files.iter().map(String::as_str));
        theirs.push(timed(|| tool(&argv)));
    }
    row(
        "fs sed alpha->omega, 400 files",
        median(ours),
        median(theirs),
        "sed -i omega->alpha (no fsync)",
    );
}
