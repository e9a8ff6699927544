//! Filesystem operations through the real agent binary and the real client.

mod common;

use std::os::unix::fs::PermissionsExt;

use agent_proto::{AgentError, FsErrorCode, FsRequest, FsResponse};
use common::*;

fn p(dir: &tempfile::TempDir, rel: &str) -> String {
    format!("{}/{rel}", dir.path().display())
}

fn code(result: Result<FsResponse, AgentError>) -> FsErrorCode {
    match result {
        Err(AgentError::Fs(e)) => e.code,
        other => panic!("expected an fs error, got {other:?}"),
    }
}

fn write(path: String, data: &[u8], parents: bool) -> FsRequest {
    FsRequest::Write {
        path,
        mode: 0o640,
        parents,
        append: false,
        data: data.to_vec(),
    }
}

#[tokio::test]
async fn write_read_stat_ls_round_trip() {
    let agent = start_agent().await;
    let c = &agent.client;
    let dir = tempfile::tempdir().expect("tempdir");

    // Missing parent: refused unless asked to create it (the host offers {"parents":true}).
    let r = c.fs(write(p(&dir, "a/b/f.bin"), b"x", false)).await;
    assert_eq!(code(r), FsErrorCode::NotFound);

    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    let r = c
        .fs(write(p(&dir, "a/b/f.bin"), &data, true))
        .await
        .expect("write");
    assert_eq!(
        r,
        FsResponse::Written {
            bytes_written: 200_000,
            path: p(&dir, "a/b/f.bin")
        }
    );
    let on_disk = std::fs::metadata(dir.path().join("a/b/f.bin")).expect("exists");
    assert_eq!(on_disk.permissions().mode() & 0o777, 0o640);

    let r = c
        .fs(FsRequest::Read {
            path: p(&dir, "a/b/f.bin"),
            offset: 0,
            max_bytes: u64::MAX,
        })
        .await
        .expect("read");
    match r {
        FsResponse::Read {
            size,
            mode,
            data: got,
            ..
        } => {
            assert_eq!(size, 200_000);
            assert_eq!(mode, 0o640);
            assert!(got == data, "content round-trips");
        }
        other => panic!("{other:?}"),
    }
    // Paged read.
    let r = c
        .fs(FsRequest::Read {
            path: p(&dir, "a/b/f.bin"),
            offset: 100,
            max_bytes: 10,
        })
        .await
        .expect("read");
    assert!(matches!(r, FsResponse::Read { data, .. } if data == data_slice(100, 10)));

    // Append.
    let append = FsRequest::Write {
        path: p(&dir, "a/log"),
        mode: 0o644,
        parents: false,
        append: true,
        data: b"one\n".to_vec(),
    };
    c.fs(append.clone()).await.expect("append 1");
    c.fs(append).await.expect("append 2");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/log")).expect("log"),
        "one\none\n"
    );

    let r = c
        .fs(FsRequest::Ls { path: p(&dir, "a") })
        .await
        .expect("ls");
    match r {
        FsResponse::Entries { entries } => {
            let names: Vec<_> = entries
                .iter()
                .map(|e| (e.name.as_str(), e.is_dir))
                .collect();
            assert_eq!(names, vec![("b", true), ("log", false)]);
            assert_eq!(entries[1].size, 8);
            assert_eq!(entries[1].mode_octal(), "0644");
        }
        other => panic!("{other:?}"),
    }
    let r = c
        .fs(FsRequest::Stat {
            path: p(&dir, "a/b"),
        })
        .await
        .expect("stat");
    assert!(matches!(r, FsResponse::Entry { entry } if entry.name == "b" && entry.is_dir));

    assert_eq!(
        code(
            c.fs(FsRequest::Stat {
                path: p(&dir, "nope")
            })
            .await
        ),
        FsErrorCode::NotFound
    );
    assert_eq!(
        code(
            c.fs(FsRequest::Ls {
                path: p(&dir, "a/log")
            })
            .await
        ),
        FsErrorCode::WrongType
    );
    let r = c
        .fs(FsRequest::Read {
            path: p(&dir, "a"),
            offset: 0,
            max_bytes: 1,
        })
        .await;
    assert_eq!(code(r), FsErrorCode::WrongType);
    let r = c
        .fs(FsRequest::Ls {
            path: "relative/path".into(),
        })
        .await;
    assert_eq!(code(r), FsErrorCode::BadRequest);
}

fn data_slice(from: u32, len: u32) -> Vec<u8> {
    (from..from + len).map(|i| (i % 253) as u8).collect()
}

#[tokio::test]
async fn mkdir_rm_chmod_mv() {
    let agent = start_agent().await;
    let c = &agent.client;
    let dir = tempfile::tempdir().expect("tempdir");
    let mk = |path: String, parents: bool| FsRequest::Mkdir {
        path,
        mode: 0o700,
        parents,
    };

    assert_eq!(
        code(c.fs(mk(p(&dir, "x/y"), false)).await),
        FsErrorCode::NotFound
    );
    assert_eq!(
        c.fs(mk(p(&dir, "x/y"), true)).await.expect("mkdir -p"),
        FsResponse::Created { created: true }
    );
    assert_eq!(
        c.fs(mk(p(&dir, "x/y"), true)).await.expect("again"),
        FsResponse::Created { created: false }
    );
    assert_eq!(
        code(c.fs(mk(p(&dir, "x/y"), false)).await),
        FsErrorCode::Exists
    );
    let mode = std::fs::metadata(dir.path().join("x/y"))
        .expect("dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);

    c.fs(write(p(&dir, "x/y/f"), b"1", false))
        .await
        .expect("write");
    let rm = |path: String, recursive: bool| FsRequest::Rm { path, recursive };
    assert_eq!(
        code(c.fs(rm(p(&dir, "x"), false)).await),
        FsErrorCode::NotEmpty
    );

    let r = c
        .fs(FsRequest::Chmod {
            path: p(&dir, "x"),
            mode: 0o750,
            uid: None,
            gid: None,
            recursive: true,
        })
        .await
        .expect("chmod");
    assert_eq!(r, FsResponse::Updated { updated: 3 });
    let mode = std::fs::metadata(dir.path().join("x/y/f"))
        .expect("f")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o750);

    c.fs(write(p(&dir, "other"), b"2", false))
        .await
        .expect("write");
    let mv = |src: String, dst: String, overwrite: bool| FsRequest::Mv {
        src,
        dst,
        overwrite,
    };
    assert_eq!(
        code(c.fs(mv(p(&dir, "other"), p(&dir, "x/y/f"), false)).await),
        FsErrorCode::Exists
    );
    c.fs(mv(p(&dir, "other"), p(&dir, "x/y/f"), true))
        .await
        .expect("mv overwrite");
    assert_eq!(std::fs::read(dir.path().join("x/y/f")).expect("f"), b"2");
    assert_eq!(
        code(c.fs(mv(p(&dir, "gone"), p(&dir, "z"), false)).await),
        FsErrorCode::NotFound
    );

    assert_eq!(
        c.fs(rm(p(&dir, "x"), true)).await.expect("rm -r"),
        FsResponse::Removed { removed: true }
    );
    assert!(!dir.path().join("x").exists());
    assert_eq!(
        code(c.fs(rm(p(&dir, "x"), true)).await),
        FsErrorCode::NotFound
    );
    assert_eq!(
        code(c.fs(rm("/".into(), true)).await),
        FsErrorCode::BadRequest
    );
}

#[tokio::test]
async fn fs_and_exec_share_one_connection() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = p(&dir, "script.sh");
    agent
        .client
        .fs(FsRequest::Write {
            path: path.clone(),
            mode: 0o755,
            parents: false,
            append: false,
            data: b"#!/bin/sh\necho from-file\n".to_vec(),
        })
        .await
        .expect("write");
    let out = run(&agent, spec(&[&path])).await;
    assert_eq!(text(&out.stdout), "from-file\n");
}
