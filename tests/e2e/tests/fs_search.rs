//! `fs::grep` and `fs::sed` end to end on the bwrap plugin: a grep over a tree (line numbers,
//! ignore_case, include/exclude globs, recursive: false, max_matches -> truncated,
//! max_line_bytes cut at a UTF-8 boundary, binary files and symlinks skipped, /proc left out
//! of a grep of /), a grep of one file, S217/S211/S210; sed with capture groups, literal mode,
//! first_only, a missing file among `files` (per-file error, the others done), mode and owner
//! kept, untouched files not rewritten, exec seeing the result; and a table of malformed payloads (S001/S210) after
//! which the adapter keeps serving.

mod sandbox_support;

use e2e_tests::{bwrap_usable, Stack};
use sandbox_support::{create, expect_err, fs_err, fs_ok, stdout_of, stop};
use serde_json::{json, Value};

/// A grep's matches as `(path, line, content)`, and its `truncated` flag.
async fn grep(stack: &Stack, id: &str, fields: Value) -> (Vec<(String, u64, String)>, bool) {
    let answer = fs_ok(stack, "grep", id, fields).await;
    let rows = answer["matches"]
        .as_array()
        .unwrap_or_else(|| panic!("no matches in {answer}"))
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap_or_default().to_string(),
                m["line"].as_u64().unwrap_or_default(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let truncated = answer["truncated"]
        .as_bool()
        .unwrap_or_else(|| panic!("no truncated in {answer}"));
    (rows, truncated)
}

fn row(path: &str, line: u64, content: &str) -> (String, u64, String) {
    (path.to_string(), line, content.to_string())
}

const TREE: &str = r#"
set -e
mkdir -p /tmp/g/src/deep /tmp/g/node_modules /tmp/outside
printf 'fn main() {\n    let Needle = 1;\n}\n' > /tmp/g/src/main.rs
printf 'needle one\nnothing\nneedle two\n' > /tmp/g/notes.txt
printf 'needle deep\n' > /tmp/g/src/deep/lib.rs
printf 'needle in deps\n' > /tmp/g/node_modules/dep.js
printf 'needle\000binary\n' > /tmp/g/blob.bin
printf 'needle outside\n' > /tmp/outside/secret.txt
printf '\303\251\303\251 needle\n' > /tmp/accents.txt
ln -s /tmp/outside /tmp/g/link
ln -s /tmp/g/notes.txt /tmp/g/notes-link.txt
"#;

#[tokio::test(flavor = "multi_thread")]
async fn grep_searches_trees_and_files() {
    if !bwrap_usable("grep_searches_trees_and_files") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    stdout_of(&stack, &id, TREE).await;
    let notes = "/tmp/g/notes.txt";
    let dep = "/tmp/g/node_modules/dep.js";
    let main = "/tmp/g/src/main.rs";
    let lib = "/tmp/g/src/deep/lib.rs";

    // Recursive by default: each directory's files in name order, then its subdirectories.
    // blob.bin (a NUL in its head) and both links (one leading out of the tree) are skipped.
    let all = grep(&stack, &id, json!({"path": "/tmp/g", "pattern": "needle"})).await;
    assert_eq!(
        all,
        (
            vec![
                row(notes, 1, "needle one"),
                row(notes, 3, "needle two"),
                row(dep, 1, "needle in deps"),
                row(lib, 1, "needle deep"),
            ],
            false
        )
    );
    let caseless = json!({"path": "/tmp/g", "pattern": "NEEDLE", "ignore_case": true});
    let (rows, _) = grep(&stack, &id, caseless).await;
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert!(
        rows.contains(&row(main, 2, "    let Needle = 1;")),
        "{rows:?}"
    );

    // Globs: without `/` the file name, with `/` the path under `path`; excludes prune.
    let rust = json!({"path": "/tmp/g", "pattern": "(?i)needle", "include_glob": ["*.rs"]});
    assert_eq!(
        grep(&stack, &id, rust).await.0,
        [
            row(main, 2, "    let Needle = 1;"),
            row(lib, 1, "needle deep")
        ]
    );
    let top_src = json!({"path": "/tmp/g", "pattern": "(?i)needle", "include_glob": ["src/*.rs"]});
    assert_eq!(
        grep(&stack, &id, top_src).await.0,
        [row(main, 2, "    let Needle = 1;")]
    );
    let pruned =
        json!({"path": "/tmp/g", "pattern": "needle", "exclude_glob": ["node_modules", "*.txt"]});
    assert_eq!(
        grep(&stack, &id, pruned).await.0,
        [row(lib, 1, "needle deep")]
    );
    let shallow = json!({"path": "/tmp/g", "pattern": "needle", "recursive": false});
    assert_eq!(
        grep(&stack, &id, shallow).await.0,
        [row(notes, 1, "needle one"), row(notes, 3, "needle two")]
    );

    // max_matches: truncated only when more matches exist.
    let two = json!({"path": "/tmp/g", "pattern": "needle", "max_matches": 2});
    assert_eq!(
        grep(&stack, &id, two).await,
        (
            vec![row(notes, 1, "needle one"), row(notes, 3, "needle two")],
            true
        )
    );
    let four = json!({"path": "/tmp/g", "pattern": "needle", "max_matches": 4});
    assert_eq!(grep(&stack, &id, four).await, (all.0.clone(), false));

    // One file; max_line_bytes cuts content, never inside a UTF-8 character.
    let one = json!({"path": notes, "pattern": "two$", "max_line_bytes": 6});
    assert_eq!(
        grep(&stack, &id, one).await,
        (vec![row(notes, 3, "needle")], false)
    );
    let accents = json!({"path": "/tmp/accents.txt", "pattern": "needle", "max_line_bytes": 3});
    assert_eq!(
        grep(&stack, &id, accents).await.0,
        [row("/tmp/accents.txt", 1, "é")]
    );
    // The `path` itself is followed when it is a link (only links met while walking are not).
    let through = json!({"path": "/tmp/g/link", "pattern": "needle"});
    assert_eq!(
        grep(&stack, &id, through).await.0,
        [row("/tmp/g/link/secret.txt", 1, "needle outside")]
    );

    // The whole root: pseudo filesystems (/proc, /sys) are left out, so nothing blocks there
    // and /proc/cmdline (one non-empty line) does not match the empty pattern.
    let started = std::time::Instant::now();
    let everything = json!({"path": "/", "pattern": "", "include_glob": ["cmdline", "notes.txt"]});
    let (rows, _) = grep(&stack, &id, everything).await;
    println!("grep over / of the python image: {:?}", started.elapsed());
    assert_eq!(
        rows,
        [
            row(notes, 1, "needle one"),
            row(notes, 2, "nothing"),
            row(notes, 3, "needle two")
        ]
    );

    // Refusals.
    let bad = fs_err(
        &stack,
        "grep",
        &id,
        json!({"path": "/tmp/g", "pattern": "(unclosed"}),
        "S217",
    )
    .await;
    assert!(bad.to_string().contains("pattern"), "{bad}");
    fs_err(
        &stack,
        "grep",
        &id,
        json!({"path": "/tmp/g", "pattern": "x", "include_glob": ["a[b"]}),
        "S217",
    )
    .await;
    fs_err(
        &stack,
        "grep",
        &id,
        json!({"path": "/tmp/none", "pattern": "x"}),
        "S211",
    )
    .await;
    fs_err(
        &stack,
        "grep",
        &id,
        json!({"path": "tmp/g", "pattern": "x"}),
        "S210",
    )
    .await;
    stop(&stack, &id, false).await;
}

/// A sed's results as `(path, replacements, success, has error)`, and its total.
async fn sed(stack: &Stack, id: &str, fields: Value) -> (Vec<(String, u64, bool, bool)>, u64) {
    let answer = fs_ok(stack, "sed", id, fields).await;
    let rows = answer["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results in {answer}"))
        .iter()
        .map(|r| {
            let success = r["success"].as_bool().unwrap_or_else(|| panic!("{r}"));
            let has_error = r
                .get("error")
                .is_some_and(|e| e.as_str().is_some_and(|e| !e.is_empty()));
            assert_eq!(
                success, !has_error,
                "error exactly when not successful: {r}"
            );
            (
                r["path"].as_str().unwrap_or_default().to_string(),
                r["replacements"].as_u64().unwrap_or_else(|| panic!("{r}")),
                success,
                has_error,
            )
        })
        .collect();
    let total = answer["total_replacements"]
        .as_u64()
        .unwrap_or_else(|| panic!("no total in {answer}"));
    (rows, total)
}

fn done(path: &str, replacements: u64) -> (String, u64, bool, bool) {
    (path.to_string(), replacements, true, false)
}

const FILES: &str = r#"
set -e
mkdir -p /tmp/s/sub
printf 'name=alice\nname=bob\n' > /tmp/s/a.conf
chmod 0750 /tmp/s/a.conf
# Another owner where the sandbox's user namespace maps one (bwrap's may not): either way
# the test checks that sed keeps whatever owner the file has.
chown 1234:2345 /tmp/s/a.conf 2>/dev/null || true
printf 'cost $5\n' > /tmp/s/price.txt
printf 'x=1\nx=2\nx=3\n' > /tmp/s/sub/x.txt
printf 'untouched\n' > /tmp/s/sub/none.txt
"#;

#[tokio::test(flavor = "multi_thread")]
async fn sed_rewrites_files_atomically() {
    if !bwrap_usable("sed_rewrites_files_atomically") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    stdout_of(&stack, &id, FILES).await;
    let conf = "/tmp/s/a.conf";

    // Regex mode: capture groups by number and name; mode and owner survive the rename.
    let inode = stdout_of(&stack, &id, "stat -c %i /tmp/s/a.conf").await;
    let owner = stdout_of(&stack, &id, "stat -c %u:%g /tmp/s/a.conf").await;
    let groups =
        json!({"files": [conf], "pattern": r"name=(?P<who>\w+)", "replacement": "user=${who}!$1"});
    assert_eq!(sed(&stack, &id, groups).await, (vec![done(conf, 2)], 2));
    assert_eq!(
        stdout_of(&stack, &id, "cat /tmp/s/a.conf").await,
        "user=alice!alice\nuser=bob!bob\n"
    );
    let stat = fs_ok(&stack, "stat", &id, json!({"path": conf})).await;
    assert_eq!(stat["mode"], "0750", "{stat}");
    assert_eq!(
        stdout_of(&stack, &id, "stat -c %u:%g /tmp/s/a.conf").await,
        owner
    );
    assert_ne!(
        stdout_of(&stack, &id, "stat -c %i /tmp/s/a.conf").await,
        inode,
        "replaced by a rename"
    );
    let caseless = json!({"files": [conf], "pattern": "^USER=ALICE", "replacement": "who=alice", "ignore_case": true});
    assert_eq!(sed(&stack, &id, caseless).await.1, 1);
    assert_eq!(
        stdout_of(&stack, &id, "head -n 1 /tmp/s/a.conf").await,
        "who=alice!alice\n"
    );

    // Literal mode: `$5` is text, and so is `$1` in the replacement.
    let literal = json!({"files": ["/tmp/s/price.txt"], "pattern": "$5", "replacement": "$1.50", "regex": false});
    assert_eq!(
        sed(&stack, &id, literal).await,
        (vec![done("/tmp/s/price.txt", 1)], 1)
    );
    assert_eq!(
        stdout_of(&stack, &id, "cat /tmp/s/price.txt").await,
        "cost $1.50\n"
    );

    // A walk with first_only: a file without a match is reported, and not rewritten.
    let none_inode = stdout_of(&stack, &id, "stat -c %i:%Y /tmp/s/sub/none.txt").await;
    let first =
        json!({"path": "/tmp/s/sub", "pattern": r"x=\d", "replacement": "y", "first_only": true});
    assert_eq!(
        sed(&stack, &id, first).await,
        (
            vec![done("/tmp/s/sub/none.txt", 0), done("/tmp/s/sub/x.txt", 1)],
            1
        )
    );
    assert_eq!(
        stdout_of(&stack, &id, "cat /tmp/s/sub/x.txt").await,
        "y\nx=2\nx=3\n"
    );
    assert_eq!(
        stdout_of(&stack, &id, "stat -c %i:%Y /tmp/s/sub/none.txt").await,
        none_inode
    );
    // Globs filter a walk: without `/` by name; excludes win.
    let globbed = json!({"path": "/tmp/s", "pattern": "x", "replacement": "z", "include_glob": ["*.txt"], "exclude_glob": ["none.txt"]});
    assert_eq!(
        sed(&stack, &id, globbed).await,
        (
            vec![done("/tmp/s/price.txt", 0), done("/tmp/s/sub/x.txt", 2)],
            2
        )
    );

    // A missing file among `files` fails alone; the others are done.
    let mixed = json!({"files": ["/tmp/s/missing.txt", "/tmp/s/price.txt"], "pattern": "cost", "replacement": "price"});
    assert_eq!(
        sed(&stack, &id, mixed).await,
        (
            vec![
                ("/tmp/s/missing.txt".to_string(), 0, false, true),
                done("/tmp/s/price.txt", 1),
            ],
            1
        )
    );
    assert_eq!(
        stdout_of(&stack, &id, "cat /tmp/s/price.txt; ls -A /tmp/s /tmp/s/sub").await,
        "price $1.50\n/tmp/s:\na.conf\nprice.txt\nsub\n\n/tmp/s/sub:\nnone.txt\nx.txt\n",
        "no temporary file left behind"
    );

    // Refusals: exactly one of files/path (S001), bad regex (S217), missing path (S211).
    let base = json!({"pattern": "a", "replacement": "b"});
    let with = |extra: Value| {
        let mut fields = base.clone();
        if let (Some(all), Value::Object(extra)) = (fields.as_object_mut(), extra) {
            all.extend(extra);
        }
        fields
    };
    fs_err(&stack, "sed", &id, with(json!({})), "S001").await;
    fs_err(
        &stack,
        "sed",
        &id,
        with(json!({"files": [conf], "path": "/tmp/s"})),
        "S001",
    )
    .await;
    fs_err(
        &stack,
        "sed",
        &id,
        with(json!({"path": "/tmp/s", "pattern": "(["})),
        "S217",
    )
    .await;
    fs_err(
        &stack,
        "sed",
        &id,
        with(json!({"path": "/tmp/nowhere"})),
        "S211",
    )
    .await;
    stop(&stack, &id, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_search_payloads_are_refused_and_the_adapter_keeps_serving() {
    if !bwrap_usable("malformed_search_payloads_are_refused_and_the_adapter_keeps_serving") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    stdout_of(&stack, &id, "printf 'keep\\n' > /tmp/k.txt").await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("grep", json!({"sandbox_id": id, "path": "/tmp"}), "S001"),
        ("grep", json!({"sandbox_id": id, "pattern": "x"}), "S001"),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": 7}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": "x", "max_matches": 0}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": "x", "max_matches": 100_001}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": "x", "max_line_bytes": -4}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": "x", "max_line_bytes": 65_537}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": "x", "include_glob": "*.rs"}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "/tmp", "pattern": "x", "recursive": "no"}),
            "S001",
        ),
        (
            "grep",
            json!({"sandbox_id": id, "path": "tmp", "pattern": "x"}),
            "S210",
        ),
        ("grep", json!([id, "/tmp", "x"]), "S001"),
        (
            "sed",
            json!({"sandbox_id": id, "path": "/tmp/k.txt", "pattern": "keep"}),
            "S001",
        ),
        (
            "sed",
            json!({"sandbox_id": id, "files": "/tmp/k.txt", "pattern": "keep", "replacement": ""}),
            "S001",
        ),
        (
            "sed",
            json!({"sandbox_id": id, "files": [], "pattern": "keep", "replacement": ""}),
            "S001",
        ),
        (
            "sed",
            json!({"sandbox_id": id, "files": ["/tmp/k.txt"], "path": "/tmp", "pattern": "keep", "replacement": ""}),
            "S001",
        ),
        (
            "sed",
            json!({"sandbox_id": id, "path": "/tmp/k.txt", "pattern": "", "replacement": "x"}),
            "S001",
        ),
        (
            "sed",
            json!({"sandbox_id": id, "path": "/tmp/k.txt", "pattern": "keep", "replacement": "x", "regex": "false"}),
            "S001",
        ),
        (
            "sed",
            json!({"sandbox_id": id, "files": ["k.txt"], "pattern": "keep", "replacement": "x"}),
            "S210",
        ),
        (
            "sed",
            json!({"sandbox_id": "nope", "path": "/tmp/k.txt", "pattern": "keep", "replacement": "x"}),
            "S001",
        ),
    ];
    assert!(cases.len() >= 8);
    for (verb, payload, want) in cases {
        let what = format!("fs::{verb} {payload}");
        let result = stack.call(&format!("fs::{verb}"), payload).await;
        let (code, body) = expect_err(result, &what);
        assert_eq!(code, want, "{what}: {body}");
    }
    // Nothing was rewritten, and the adapter still serves both functions.
    assert_eq!(stdout_of(&stack, &id, "cat /tmp/k.txt").await, "keep\n");
    let (rows, truncated) = grep(&stack, &id, json!({"path": "/tmp/k.txt", "pattern": "ee"})).await;
    assert_eq!(
        (rows, truncated),
        (vec![row("/tmp/k.txt", 1, "keep")], false)
    );
    let kept = json!({"path": "/tmp/k.txt", "pattern": "keep", "replacement": "kept"});
    assert_eq!(
        sed(&stack, &id, kept).await,
        (vec![done("/tmp/k.txt", 1)], 1)
    );
    stop(&stack, &id, false).await;
}
