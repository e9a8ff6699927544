//! A pipe into a bounded log: the write end goes to a process (as its stdout or stderr), a
//! task of the caller's runtime copies the read end into the file. The task reads to the
//! pipe's end whatever happens to the file (a layer removed under it, a full disk), so the
//! writer is never stalled by us, and ends when every copy of the write end is closed.

use std::io;
use std::path::Path;

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::watch;

use crate::file::{BoundedFile, Start};

/// How much one read takes from the pipe.
const CHUNK: usize = 64 << 10;

/// A new pipe feeding the log at `path` (see [`pump`]); its write end, for a process.
pub fn start(path: &Path, limit: u64, start: Start) -> io::Result<(io::PipeWriter, Drained)> {
    let (reader, writer) = io::pipe()?;
    let drained = pump(reader, path, limit, start)?;
    Ok((writer, drained))
}

/// Opens the log at `path` (see [`BoundedFile::open`]) and copies into it, from a task of the
/// current tokio runtime, all that comes out of `reader` until its last writer is gone.
pub fn pump(reader: io::PipeReader, path: &Path, limit: u64, start: Start) -> io::Result<Drained> {
    let file = BoundedFile::open(path, limit, start)?;
    let reader = pipe::Receiver::from_owned_fd(reader.into())?;
    let (done, drained) = watch::channel(false);
    let shown = path.display().to_string();
    tokio::spawn(async move {
        copy(reader, file, shown).await;
        done.send_replace(true);
    });
    Ok(Drained(drained))
}

/// Tells when a pump has written all its pipe carried.
#[derive(Clone)]
pub struct Drained(watch::Receiver<bool>);

impl Drained {
    /// Returns once every writer of the pipe is gone and all they wrote is in the log (or
    /// dropped past a write error); at once if the pump's runtime went away.
    pub async fn wait(&self) {
        let mut done = self.0.clone();
        let _ = done.wait_for(|done| *done).await;
    }
}

async fn copy(mut reader: pipe::Receiver, mut file: BoundedFile, path: String) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => file.write(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(log = %path, "its pipe failed: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::rotated;

    fn size(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[tokio::test]
    async fn endless_output_keeps_the_newest_within_twice_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let limit = 64 << 10;
        let (mut writer, drained) = start(&path, limit, Start::Fresh).unwrap();
        // 10 MiB of numbered lines from a blocking thread, as a process would write them.
        let last = tokio::task::spawn_blocking(move || {
            let mut n = 0u64;
            let mut total = 0;
            while total < 10 << 20 {
                let line = format!("line {n}\n");
                writer.write_all(line.as_bytes()).unwrap();
                total += line.len();
                n += 1;
            }
            n - 1
        })
        .await
        .unwrap();
        drained.wait().await;
        assert!(size(&path) > 0 && size(&path) <= limit);
        assert_eq!(size(&rotated(&path)), limit);
        // A line may be split across the halves: the tail joins them.
        let (newest, _) = crate::tail(&path, 64).unwrap();
        let newest = String::from_utf8(newest).unwrap();
        assert!(
            newest.ends_with(&format!("\nline {last}\n")),
            "the newest output is kept: {newest:?}"
        );
    }

    #[tokio::test]
    async fn a_fresh_start_removes_the_older_rotation_and_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.log");
        std::fs::write(rotated(&path), "old").unwrap();
        let (writer, drained) = start(&path, crate::LIMIT, Start::Fresh).unwrap();
        assert!(!rotated(&path).exists());
        drop(writer);
        drained.wait().await;
        drained.wait().await;
        assert_eq!(size(&path), 0);

        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        let linked = dir.path().join("linked.log");
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        assert!(start(&linked, crate::LIMIT, Start::Fresh).is_err());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
    }

    #[tokio::test]
    async fn a_removed_log_does_not_stall_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let (mut writer, drained) = start(&path, 4096, Start::Fresh).unwrap();
        std::fs::remove_file(&path).unwrap();
        tokio::task::spawn_blocking(move || {
            for _ in 0..1000 {
                writer.write_all(&[b'x'; 1024]).unwrap();
            }
        })
        .await
        .unwrap();
        drained.wait().await;
    }
}
