//! File watches through the real agent binary and the real client: events in order, renames
//! paired, symbolic links never followed, refusals, a burst bounded, and the host's stop.

mod common;

use std::time::Duration;

use agent_proto::client::{WatchItem, WatchStream};
use agent_proto::{AgentError, FsErrorCode, WatchEvent, WatchKind, WatchRequest};
use common::*;

fn request(path: &std::path::Path, recursive: bool) -> WatchRequest {
    WatchRequest {
        path: path.to_str().unwrap().to_string(),
        recursive,
        max_dirs: 8192,
    }
}

/// Events until `until` matches one of them (acknowledging every batch), or 20 s pass.
async fn events_until(
    stream: &mut WatchStream,
    until: impl Fn(&WatchEvent) -> bool,
) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let item = tokio::time::timeout_at(deadline, stream.recv())
            .await
            .unwrap_or_else(|_| panic!("no matching event; saw {seen:?}"));
        match item {
            Some(WatchItem::Batch(batch)) => {
                stream.passed_on().await.unwrap();
                let done = batch.events.iter().any(&until);
                seen.extend(batch.events);
                if done {
                    return seen;
                }
            }
            other => panic!("the watch ended: {other:?}; saw {seen:?}"),
        }
    }
}

fn kinds_of<'a>(events: &'a [WatchEvent], path: &str) -> Vec<(WatchKind, Option<&'a str>)> {
    events
        .iter()
        .filter(|e| e.path == path || e.from.as_deref() == Some(path))
        .map(|e| (e.kind, e.from.as_deref()))
        .collect()
}

#[tokio::test]
async fn create_write_rename_delete_come_in_order_and_stop_ends_it() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let (mut stream, watched) = agent.client.watch(request(dir.path(), true)).await.unwrap();
    assert_eq!(watched, 2);
    let f = dir.path().join("sub/a.txt");
    std::fs::write(&f, b"one").unwrap();
    std::fs::rename(&f, dir.path().join("sub/b.txt")).unwrap();
    std::fs::remove_file(dir.path().join("sub/b.txt")).unwrap();
    let events = events_until(&mut stream, |e| {
        e.kind == WatchKind::Deleted && e.path == "sub/b.txt"
    })
    .await;
    let a: Vec<WatchKind> = kinds_of(&events, "sub/a.txt")
        .iter()
        .map(|(k, _)| *k)
        .collect();
    assert_eq!(
        a,
        [WatchKind::Created, WatchKind::Modified, WatchKind::Moved],
        "{events:?}"
    );
    assert_eq!(
        kinds_of(&events, "sub/b.txt"),
        [
            (WatchKind::Moved, Some("sub/a.txt")),
            (WatchKind::Deleted, None)
        ]
    );
    // A directory made later is watched too.
    std::fs::create_dir(dir.path().join("new")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    std::fs::write(dir.path().join("new/c"), b"").unwrap();
    events_until(&mut stream, |e| e.path == "new/c").await;
    stream.stop().await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.recv())
            .await
            .expect("the end comes")
        {
            Some(WatchItem::Batch(_)) => stream.passed_on().await.unwrap(),
            Some(WatchItem::End(end)) => {
                assert_eq!(end.error, None);
                break;
            }
            None => panic!("the link ended instead"),
        }
    }
}

#[tokio::test]
async fn links_are_not_followed_and_bad_paths_are_refused() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
    let (mut stream, watched) = agent.client.watch(request(dir.path(), true)).await.unwrap();
    assert_eq!(watched, 1, "the link to a directory is not entered");
    std::fs::write(outside.path().join("secret"), b"x").unwrap();
    std::fs::write(dir.path().join("marker"), b"x").unwrap();
    let events = events_until(&mut stream, |e| e.path == "marker").await;
    assert!(
        events.iter().all(|e| !e.path.contains("secret")),
        "{events:?}"
    );
    // The watched path itself may not be a link.
    let refused = agent
        .client
        .watch(request(&dir.path().join("out"), true))
        .await
        .err()
        .expect("a link is refused");
    let code = |e: &AgentError| match e {
        AgentError::Fs(e) => e.code,
        other => panic!("{other:?}"),
    };
    assert_eq!(code(&refused), FsErrorCode::WrongType);
    let missing = agent
        .client
        .watch(request(&dir.path().join("nope"), false))
        .await
        .err()
        .expect("missing");
    assert_eq!(code(&missing), FsErrorCode::NotFound);
    let relative = WatchRequest {
        path: "tmp".into(),
        recursive: false,
        max_dirs: 1,
    };
    let relative = agent.client.watch(relative).await.err().expect("relative");
    assert_eq!(code(&relative), FsErrorCode::BadRequest);
}

#[tokio::test]
async fn a_burst_is_bounded_and_overflow_is_marked_while_the_host_is_slow() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut stream, _) = agent
        .client
        .watch(request(dir.path(), false))
        .await
        .unwrap();
    // The host takes nothing while 30,000 files appear.
    let script = format!(
        "cd {} && i=0; while [ $i -lt 30000 ]; do : > f$i; i=$((i+1)); done",
        dir.path().display()
    );
    let out = agent.client.exec(sh(&script)).await.unwrap();
    assert_eq!(out.exit_code, 0);
    let mut total = 0;
    let mut overflow = false;
    loop {
        let item = tokio::time::timeout(Duration::from_secs(2), stream.recv()).await;
        let Ok(Some(WatchItem::Batch(batch))) = item else {
            break;
        };
        stream.passed_on().await.unwrap();
        total += batch.events.len();
        overflow |= batch.events.iter().any(|e| e.kind == WatchKind::Overflow);
    }
    assert!(overflow, "{total} events and no overflow");
    assert!(total < 30_000, "{total}");
}

#[tokio::test]
async fn more_watches_than_the_limit_are_refused_busy() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let mut held = Vec::new();
    let refused = loop {
        match agent.client.watch(request(dir.path(), false)).await {
            Ok(stream) => held.push(stream),
            Err(e) => break e,
        }
        assert!(held.len() <= agent_proto::MAX_WATCHES, "no limit");
    };
    assert!(
        matches!(&refused, AgentError::Request(r) if r.code == agent_proto::ErrorCode::Busy),
        "{refused:?}"
    );
    // One stopped makes room again.
    held.pop();
    tokio::time::sleep(Duration::from_millis(300)).await;
    agent
        .client
        .watch(request(dir.path(), false))
        .await
        .expect("room again");
}

#[tokio::test]
async fn all_watches_share_one_pool_of_directories() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().unwrap();
    for i in 0..5000 {
        std::fs::create_dir(dir.path().join(format!("d{i}"))).unwrap();
    }
    let (first, watched) = agent.client.watch(request(dir.path(), true)).await.unwrap();
    assert_eq!(watched, 5001);
    let (mut second, watched) = agent.client.watch(request(dir.path(), true)).await.unwrap();
    assert_eq!(watched, agent_proto::MAX_WATCH_DIRS - 5001);
    let events = events_until(&mut second, |e| e.kind == WatchKind::Limit).await;
    assert_eq!(events.len(), 1, "{events:?}");
    // A watch's own `max_dirs` caps it below the pool.
    let small = WatchRequest {
        max_dirs: 10,
        ..request(dir.path(), true)
    };
    drop(second);
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_third, watched) = agent.client.watch(small).await.unwrap();
    assert_eq!(watched, 10, "the pool came back and max_dirs holds");
}

#[tokio::test]
async fn a_watched_path_deleted_ends_the_watch_not_found() {
    let agent = start_agent().await;
    let dir = tempfile::tempdir().unwrap();
    let watched = dir.path().join("w");
    std::fs::create_dir_all(watched.join("sub")).unwrap();
    let (mut stream, _) = agent.client.watch(request(&watched, true)).await.unwrap();
    std::fs::remove_dir_all(&watched).unwrap();
    let mut seen = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.recv())
            .await
            .expect("the end comes")
        {
            Some(WatchItem::Batch(batch)) => {
                stream.passed_on().await.unwrap();
                seen.extend(batch.events);
            }
            Some(WatchItem::End(end)) => break end,
            None => panic!("the link ended instead"),
        }
    };
    assert_eq!(end.error.map(|e| e.code), Some(FsErrorCode::NotFound));
    assert!(
        seen.iter()
            .any(|e| e.kind == WatchKind::Deleted && e.path.is_empty()),
        "{seen:?}"
    );
}
