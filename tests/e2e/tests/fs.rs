//! The `fs::*` functions end to end on the bwrap plugin: every verb's happy path and its main
//! refusals (S211 with the `parents` fix, S212, S213, S214, S210, S002, S004), write/read round
//! trips (text inline, any bytes through engine channels both ways, the 1 MiB body limit), exec and fs seeing each
//! other's files, mode rendering, a table of malformed payloads that are all S001, and no idle
//! reaping while an fs call is in flight.

mod sandbox_support;

use base64::Engine as _;
use e2e_tests::{bwrap_usable, Stack};
use std::time::Duration;

use iii_sdk::channel::{ChannelReader, ChannelWriter, StreamChannelRef};
use sandbox_support::{
    create, eventually, exec_ok, expect_err, fs, fs_err, fs_ok, live_ids, sh, stdout_of, stop,
};
use serde_json::{json, Value};

const MIB: usize = 1024 * 1024;

async fn stat(stack: &Stack, id: &str, path: &str) -> Value {
    fs_ok(stack, "stat", id, json!({ "path": path })).await
}

fn names(listing: &Value) -> Vec<String> {
    listing["entries"]
        .as_array()
        .unwrap_or_else(|| panic!("no entries in {listing}"))
        .iter()
        .map(|e| e["name"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn directories_modes_and_tree_changes() {
    if !bwrap_usable("directories_modes_and_tree_changes") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;

    // mkdir: default mode 0755, explicit modes rendered as four octal digits.
    let made = fs_ok(&stack, "mkdir", &id, json!({"path": "/tmp/t"})).await;
    assert_eq!(made, json!({"created": true}));
    let dir = stat(&stack, &id, "/tmp/t").await;
    assert_eq!(dir["name"], "t");
    assert_eq!(dir["is_dir"], true);
    assert_eq!(dir["is_symlink"], false);
    assert_eq!(dir["mode"], "0755", "{dir}");
    assert!(
        dir["mtime"].as_i64().is_some_and(|t| t > 1_600_000_000),
        "{dir}"
    );
    fs_ok(
        &stack,
        "mkdir",
        &id,
        json!({"path": "/tmp/t/private", "mode": "700"}),
    )
    .await;
    assert_eq!(stat(&stack, &id, "/tmp/t/private").await["mode"], "0700");
    assert_eq!(
        stdout_of(&stack, &id, "stat -c %a /tmp/t/private").await,
        "700\n"
    );

    // A missing parent is S211 with the fix that works; `parents` then creates the chain and
    // is idempotent like `mkdir -p`; without it an existing directory is S213.
    let body = fs_err(
        &stack,
        "mkdir",
        &id,
        json!({"path": "/tmp/t/a/b/c"}),
        "S211",
    )
    .await;
    assert_eq!(body["fix"], json!({"parents": true}), "{body}");
    assert!(
        body["fix_note"].as_str().is_some_and(|n| !n.is_empty()),
        "{body}"
    );
    let chain = json!({"path": "/tmp/t/a/b/c", "parents": true});
    assert_eq!(
        fs_ok(&stack, "mkdir", &id, chain.clone()).await["created"],
        true
    );
    assert_eq!(fs_ok(&stack, "mkdir", &id, chain).await["created"], false);
    fs_err(&stack, "mkdir", &id, json!({"path": "/tmp/t/a"}), "S213").await;

    // ls: sorted names, entries in the contract's shape; a file is not a directory.
    fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/t/f.txt", "content": "12345"}),
    )
    .await;
    exec_ok(&stack, &id, sh("ln -s f.txt /tmp/t/link")).await;
    let listing = fs_ok(&stack, "ls", &id, json!({"path": "/tmp/t"})).await;
    assert_eq!(
        names(&listing),
        ["a", "f.txt", "link", "private"],
        "{listing}"
    );
    let entries = listing["entries"].as_array().unwrap();
    assert_eq!(entries[1]["size"], 5);
    assert_eq!(entries[1]["mode"], "0644");
    assert_eq!(entries[1]["is_dir"], false);
    assert_eq!(entries[2]["is_symlink"], true, "{listing}");
    assert_eq!(entries[0]["is_dir"], true);
    for entry in entries {
        let mode = entry["mode"].as_str().unwrap_or_default();
        assert!(
            mode.len() == 4 && mode.bytes().all(|b| (b'0'..=b'7').contains(&b)),
            "{entry}"
        );
        for key in ["name", "is_dir", "is_symlink", "size", "mode", "mtime"] {
            assert!(entry.get(key).is_some(), "{key} missing in {entry}");
        }
    }
    assert_eq!(stat(&stack, &id, "/tmp/t/link").await["is_symlink"], true);
    fs_err(&stack, "ls", &id, json!({"path": "/tmp/t/f.txt"}), "S212").await;
    fs_err(&stack, "ls", &id, json!({"path": "/tmp/nope"}), "S211").await;
    fs_err(&stack, "stat", &id, json!({"path": "/tmp/nope"}), "S211").await;

    // chmod: one path, then a tree (symlinks skipped), counted; exec sees the modes.
    let one = fs_ok(
        &stack,
        "chmod",
        &id,
        json!({"path": "/tmp/t/f.txt", "mode": "0600"}),
    )
    .await;
    assert_eq!(one, json!({"updated": 1}));
    assert_eq!(
        stdout_of(&stack, &id, "stat -c %a /tmp/t/f.txt").await,
        "600\n"
    );
    let tree = json!({"path": "/tmp/t/a", "mode": "0750", "recursive": true});
    assert_eq!(fs_ok(&stack, "chmod", &id, tree).await["updated"], 3);
    assert_eq!(stat(&stack, &id, "/tmp/t/a/b/c").await["mode"], "0750");
    let sticky = json!({"path": "/tmp/t/a", "mode": "1777"});
    fs_ok(&stack, "chmod", &id, sticky).await;
    assert_eq!(stat(&stack, &id, "/tmp/t/a").await["mode"], "1777");
    fs_err(
        &stack,
        "chmod",
        &id,
        json!({"path": "/tmp/nope", "mode": "0644"}),
        "S211",
    )
    .await;

    // mv: rename, refuse an existing destination unless told to overwrite.
    fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/t/g.txt", "content": "g"}),
    )
    .await;
    let moved = fs_ok(
        &stack,
        "mv",
        &id,
        json!({"src": "/tmp/t/f.txt", "dst": "/tmp/t/h.txt"}),
    )
    .await;
    assert_eq!(moved, json!({"moved": true}));
    fs_err(&stack, "stat", &id, json!({"path": "/tmp/t/f.txt"}), "S211").await;
    let clash = json!({"src": "/tmp/t/h.txt", "dst": "/tmp/t/g.txt"});
    fs_err(&stack, "mv", &id, clash.clone(), "S213").await;
    let mut forced = clash;
    forced["overwrite"] = json!(true);
    fs_ok(&stack, "mv", &id, forced).await;
    let read = fs_ok(&stack, "read", &id, json!({"path": "/tmp/t/g.txt"})).await;
    assert_eq!(read["body"], "12345", "{read}");
    fs_err(
        &stack,
        "mv",
        &id,
        json!({"src": "/tmp/nope", "dst": "/tmp/x"}),
        "S211",
    )
    .await;
    fs_err(
        &stack,
        "mv",
        &id,
        json!({"src": "/tmp/t/g.txt", "dst": "x"}),
        "S210",
    )
    .await;

    // rm: a non-empty directory needs `recursive`.
    fs_err(&stack, "rm", &id, json!({"path": "/tmp/t/a"}), "S214").await;
    let removed = fs_ok(
        &stack,
        "rm",
        &id,
        json!({"path": "/tmp/t/a", "recursive": true}),
    )
    .await;
    assert_eq!(removed, json!({"removed": true}));
    fs_err(&stack, "stat", &id, json!({"path": "/tmp/t/a"}), "S211").await;
    fs_ok(&stack, "rm", &id, json!({"path": "/tmp/t/g.txt"})).await;
    fs_err(&stack, "rm", &id, json!({"path": "/tmp/t/g.txt"}), "S211").await;
    assert_eq!(stdout_of(&stack, &id, "ls /tmp/t").await, "link\nprivate\n");

    // Relative paths are a filesystem bad request.
    for (verb, fields) in [
        ("ls", json!({"path": "tmp"})),
        ("stat", json!({"path": ""})),
        ("mkdir", json!({"path": "new"})),
        ("write", json!({"path": "a.txt", "content": "x"})),
        ("read", json!({"path": "./a.txt"})),
        ("rm", json!({"path": "tmp/t"})),
        ("chmod", json!({"path": "t", "mode": "0644"})),
        ("mv", json!({"src": "a", "dst": "/tmp/b"})),
    ] {
        fs_err(&stack, verb, &id, fields, "S210").await;
    }

    // An id never seen is S002; a stopped sandbox is S004.
    let unknown = "00000000-0000-4000-8000-000000000000";
    fs_err(&stack, "ls", unknown, json!({"path": "/"}), "S002").await;
    stop(&stack, &id, true).await;
    fs_err(&stack, "ls", &id, json!({"path": "/"}), "S004").await;
    fs_err(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/x", "content": "x"}),
        "S004",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_contents_round_trip_between_fs_and_exec() {
    if !bwrap_usable("file_contents_round_trip_between_fs_and_exec") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;

    // Text: fs writes, exec and fs read it back, with the requested mode.
    let text = "héllo\nwörld\n";
    let written = fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/note.txt", "content": text, "mode": "0640"}),
    )
    .await;
    assert_eq!(
        written,
        json!({"bytes_written": text.len(), "path": "/tmp/note.txt"})
    );
    assert_eq!(stdout_of(&stack, &id, "cat /tmp/note.txt").await, text);
    assert_eq!(
        stdout_of(&stack, &id, "stat -c %a /tmp/note.txt").await,
        "640\n"
    );
    let read = fs_ok(&stack, "read", &id, json!({"path": "/tmp/note.txt"})).await;
    assert_eq!(read["body"], text, "{read}");
    assert_eq!(
        read_channel(&stack, &read["content"]).await,
        text.as_bytes()
    );
    assert_eq!(read["size"], text.len());
    assert_eq!(read["mode"], "0640");
    assert!(
        read["mtime"].as_i64().is_some_and(|t| t > 1_600_000_000),
        "{read}"
    );

    // Writing again replaces the contents; an empty file reads as an empty body.
    fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/note.txt", "content": "short"}),
    )
    .await;
    assert_eq!(stdout_of(&stack, &id, "cat /tmp/note.txt").await, "short");
    fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/empty", "content": ""}),
    )
    .await;
    let empty = fs_ok(&stack, "read", &id, json!({"path": "/tmp/empty"})).await;
    assert_eq!(
        (empty["body"].clone(), empty["size"].clone()),
        (json!(""), json!(0))
    );

    // A missing parent: S211 with the fix, which then works.
    let deep = json!({"path": "/tmp/d1/d2/f.txt", "content": "deep"});
    let body = fs_err(&stack, "write", &id, deep.clone(), "S211").await;
    assert_eq!(body["fix"], json!({"parents": true}), "{body}");
    let mut fixed = deep;
    fixed["parents"] = json!(true);
    fs_ok(&stack, "write", &id, fixed).await;
    assert_eq!(stdout_of(&stack, &id, "cat /tmp/d1/d2/f.txt").await, "deep");
    fs_err(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/d1", "content": "x"}),
        "S212",
    )
    .await;
    fs_err(&stack, "read", &id, json!({"path": "/tmp/d1"}), "S212").await;
    let missing = fs_err(&stack, "read", &id, json!({"path": "/tmp/none"}), "S211").await;
    assert_eq!(
        missing["fix"],
        Value::Null,
        "read has no parents fix: {missing}"
    );

    // Binary through base64: exec sees the exact bytes; fs::read gives them through the
    // channel only (no `body`).
    let bytes: Vec<u8> = (0..=255u8).rev().collect();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
    let written = fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/bin", "content_b64": b64}),
    )
    .await;
    assert_eq!(written["bytes_written"], 256);
    assert_eq!(stdout_of(&stack, &id, "base64 -w0 /tmp/bin").await, b64);
    let read = fs_ok(&stack, "read", &id, json!({"path": "/tmp/bin"})).await;
    assert!(read.get("body").is_none(), "no body for binary: {read}");
    assert_eq!(read_channel(&stack, &read["content"]).await, bytes);

    // What exec writes, fs sees.
    exec_ok(
        &stack,
        &id,
        sh("printf 'from exec' > /tmp/e.txt && chmod 604 /tmp/e.txt"),
    )
    .await;
    let seen = fs_ok(&stack, "read", &id, json!({"path": "/tmp/e.txt"})).await;
    assert_eq!(
        (seen["body"].clone(), seen["mode"].clone()),
        (json!("from exec"), json!("0604"))
    );
    let listing = fs_ok(&stack, "ls", &id, json!({"path": "/tmp"})).await;
    assert!(names(&listing).contains(&"e.txt".to_string()), "{listing}");

    // The body limit: exactly 1 MiB of text comes back whole (several agent pages), one byte
    // more comes through the channel only.
    exec_ok(
        &stack,
        &id,
        sh(&format!("head -c {MIB} /dev/zero | tr '\\0' a > /tmp/mib")),
    )
    .await;
    let whole = fs_ok(&stack, "read", &id, json!({"path": "/tmp/mib"})).await;
    assert_eq!(whole["size"], MIB);
    let body_text = whole["body"].as_str().unwrap_or_default();
    assert!(
        body_text.len() == MIB && body_text.bytes().all(|b| b == b'a'),
        "1 MiB body"
    );
    exec_ok(&stack, &id, sh("printf a >> /tmp/mib")).await;
    let over = fs_ok(&stack, "read", &id, json!({"path": "/tmp/mib"})).await;
    assert!(over.get("body").is_none(), "no body past 1 MiB");
    assert_eq!(over["size"], MIB + 1);
    let streamed = read_channel(&stack, &over["content"]).await;
    assert!(streamed.len() == MIB + 1 && streamed.iter().all(|b| *b == b'a'));
    stop(&stack, &id, false).await;
}

/// Reads a channel ref the adapter answered, to its end.
async fn read_channel(stack: &Stack, content: &Value) -> Vec<u8> {
    let channel_ref: StreamChannelRef =
        serde_json::from_value(content.clone()).unwrap_or_else(|e| panic!("{content}: {e}"));
    let reader = ChannelReader::new(&stack.engine.url(), &channel_ref);
    tokio::time::timeout(Duration::from_secs(60), reader.read_all())
        .await
        .expect("the channel ends")
        .expect("the channel reads")
}

/// A channel whose read end goes to the adapter; `bytes` are written (in 64 KiB frames by the
/// SDK) and the writer closed, concurrently with the call that consumes them.
async fn channel_with(stack: &Stack, bytes: Vec<u8>) -> (Value, tokio::task::JoinHandle<()>) {
    let (write_end, read_end) = sandbox_support::streams::channel(stack).await;
    let writer_ref = sandbox_support::streams::channel_ref(&write_end);
    let writer = ChannelWriter::new(&stack.engine.url(), &writer_ref);
    let feeding = tokio::spawn(async move {
        writer.write(&bytes).await.expect("channel write");
        writer.close().await.expect("channel close");
    });
    (read_end, feeding)
}

/// Large and binary content both ways through engine channels: 3 MiB of every byte value
/// written through a channel arrives whole (exec's checksum agrees), comes back through
/// `fs::read`'s channel byte for byte; an empty stream makes an empty file; a write end or a
/// malformed ref is S001, a channel nobody can attach to is S218, and the adapter serves on.
#[tokio::test(flavor = "multi_thread")]
async fn large_and_binary_content_through_channels() {
    if !bwrap_usable("large_and_binary_content_through_channels") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let bytes: Vec<u8> = (0..3 * MIB).map(|i| (i * 7 % 256) as u8).collect();
    let (reader_ref, feeding) = channel_with(&stack, bytes.clone()).await;
    let written = fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/big.bin", "content": reader_ref, "parents": true}),
    )
    .await;
    feeding.await.expect("feeder");
    assert_eq!(written["bytes_written"], 3 * MIB, "{written}");
    let digest = |data: &[u8]| {
        let mut sum: u64 = 0;
        for (i, b) in data.iter().enumerate() {
            sum = sum
                .wrapping_mul(31)
                .wrapping_add(u64::from(*b) ^ (i as u64 & 0xff));
        }
        sum
    };
    let listed = stdout_of(&stack, &id, "wc -c < /tmp/big.bin").await;
    assert_eq!(listed.trim(), (3 * MIB).to_string());
    let read = fs_ok(&stack, "read", &id, json!({"path": "/tmp/big.bin"})).await;
    assert!(read.get("body").is_none(), "{read}");
    assert_eq!(read["size"], 3 * MIB);
    let back = read_channel(&stack, &read["content"]).await;
    assert_eq!(back.len(), bytes.len());
    assert_eq!(
        digest(&back),
        digest(&bytes),
        "the bytes came back unchanged"
    );

    let (empty_ref, feeding) = channel_with(&stack, Vec::new()).await;
    let empty = fs_ok(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/big.bin", "content": empty_ref}),
    )
    .await;
    feeding.await.expect("feeder");
    assert_eq!(empty["bytes_written"], 0, "{empty}");
    assert_eq!(
        stdout_of(&stack, &id, "wc -c < /tmp/big.bin").await.trim(),
        "0"
    );

    let write_end = json!({"channel_id": "c", "access_key": "k", "direction": "write"});
    fs_err(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/x", "content": write_end}),
        "S001",
    )
    .await;
    fs_err(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/x", "content": {"channel_id": 5}}),
        "S001",
    )
    .await;
    let nowhere = json!({"channel_id": "no-such-channel", "access_key": "k", "direction": "read"});
    let body = fs_err(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/x", "content": nowhere}),
        "S218",
    )
    .await;
    assert_eq!(body["retryable"], true, "{body}");
    let after = fs_ok(&stack, "stat", &id, json!({"path": "/tmp/big.bin"})).await;
    assert_eq!(after["size"], 0, "{after}");
    stop(&stack, &id, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_fs_payloads_are_s001_and_the_adapter_keeps_serving() {
    if !bwrap_usable("malformed_fs_payloads_are_s001_and_the_adapter_keeps_serving") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({})).await;
    let cases: Vec<(&str, Value)> = vec![
        ("ls", json!({})),
        ("ls", json!({"sandbox_id": "not-a-uuid", "path": "/"})),
        ("ls", json!({"sandbox_id": 7, "path": "/"})),
        ("ls", json!({"sandbox_id": id, "path": 5})),
        ("stat", json!({"sandbox_id": id})),
        ("ls", json!([id, "/"])),
        ("read", json!("just a string")),
        (
            "write",
            json!({"sandbox_id": id, "path": "/tmp/x", "content": "a", "content_b64": "YQ=="}),
        ),
        ("write", json!({"sandbox_id": id, "path": "/tmp/x"})),
        (
            "write",
            json!({"sandbox_id": id, "path": "/tmp/x", "content_b64": "***"}),
        ),
        (
            "write",
            json!({"sandbox_id": id, "path": "/tmp/x", "content": 42}),
        ),
        (
            "write",
            json!({"sandbox_id": id, "path": "/tmp/x", "content": "a", "mode": "999"}),
        ),
        (
            "write",
            json!({"sandbox_id": id, "path": "/tmp/x", "content": "a", "mode": 644}),
        ),
        (
            "write",
            json!({"sandbox_id": id, "path": "/tmp/x", "content": "a", "parents": "yes"}),
        ),
        (
            "mkdir",
            json!({"sandbox_id": id, "path": "/tmp/y", "mode": "07555"}),
        ),
        (
            "mkdir",
            json!({"sandbox_id": id, "path": "/tmp/y", "parents": 1}),
        ),
        ("chmod", json!({"sandbox_id": id, "path": "/tmp"})),
        (
            "chmod",
            json!({"sandbox_id": id, "path": "/tmp", "mode": "rwx"}),
        ),
        (
            "chmod",
            json!({"sandbox_id": id, "path": "/tmp", "mode": "0755", "uid": -1}),
        ),
        (
            "rm",
            json!({"sandbox_id": id, "path": "/tmp", "recursive": "true"}),
        ),
        ("mv", json!({"sandbox_id": id, "src": "/tmp/a"})),
        (
            "mv",
            json!({"sandbox_id": id, "src": ["/tmp/a"], "dst": "/tmp/b"}),
        ),
    ];
    assert!(cases.len() >= 10);
    for (verb, payload) in cases {
        let what = format!("fs::{verb} {payload}");
        let result = stack.call(&format!("fs::{verb}"), payload).await;
        let (code, body) = expect_err(result, &what);
        assert_eq!(code, "S001", "{what}: {body}");
    }
    // None of it touched the sandbox, and the adapter still serves.
    fs_err(&stack, "stat", &id, json!({"path": "/tmp/x"}), "S211").await;
    fs_err(&stack, "stat", &id, json!({"path": "/tmp/y"}), "S211").await;
    let root = stat(&stack, &id, "/").await;
    assert_eq!(
        (root["name"].clone(), root["is_dir"].clone()),
        (json!("/"), json!(true))
    );
    stop(&stack, &id, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_fs_call_in_flight_keeps_the_reaper_away() {
    if !bwrap_usable("an_fs_call_in_flight_keeps_the_reaper_away") {
        return;
    }
    let stack = Stack::bwrap().await;
    let id = create(&stack, "python", json!({"idle_timeout_secs": 1})).await;
    // A write fed through a channel stays in flight while its stream is open: the test sends
    // part of it, waits well past the idle timeout, then sends the rest.
    let (write_end, read_end) = sandbox_support::streams::channel(&stack).await;
    let writer_ref = sandbox_support::streams::channel_ref(&write_end);
    let writer = ChannelWriter::new(&stack.engine.url(), &writer_ref);
    let write = fs(
        &stack,
        "write",
        &id,
        json!({"path": "/tmp/slow.txt", "content": read_end}),
    );
    let meanwhile = async {
        writer.write(b"first ").await.expect("channel write");
        tokio::time::sleep(Duration::from_secs(4)).await;
        let live = live_ids(&stack).await;
        writer.write(b"last\n").await.expect("channel write");
        writer.close().await.expect("channel close");
        live
    };
    let (write, live_during_write) = tokio::join!(write, meanwhile);
    assert!(
        live_during_write.contains(&id),
        "reaped mid-call: {live_during_write:?}"
    );
    let written = write.unwrap_or_else(|e| panic!("slow write: {e:?}"));
    assert_eq!(written["bytes_written"], 11, "{written}");
    // Idle again, it goes.
    let reaped = eventually(Duration::from_secs(20), || async {
        !live_ids(&stack).await.contains(&id)
    })
    .await;
    assert!(reaped, "an idle sandbox with no call in flight is reaped");
}
