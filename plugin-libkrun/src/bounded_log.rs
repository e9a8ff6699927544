//! The runner's output (libkrun's log) and the guest console, kept on disk within a bound.
//! A guest is hostile: one that writes to its console without end, or makes libkrun log
//! without end, must not fill the host's disk. Each log reaches a task of ours through a
//! pipe; the task keeps the newest output: at [`LIMIT`] bytes the file becomes `<name>.1`
//! (replacing the older one) and a new file starts, so a log never takes much more than
//! twice the limit. The task reads to the pipe's end whatever happens to the file (a layer
//! removed under it, a full disk), so the writer is never stalled by us.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::task::JoinHandle;

/// Bytes a log file holds before it is rotated (the newest output is what explains a
/// failure; the kernel's boot messages fit many times over).
pub const LIMIT: u64 = 2 << 20;

/// The older half of a rotated log: `console.log` -> `console.log.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".1");
    PathBuf::from(name)
}

/// A pipe whose write end goes to a process and whose read end a task copies into `path`
/// (created afresh, an older rotation removed). Awaiting the handle waits until every copy
/// of the write end is closed and all was written.
pub fn start(path: &Path, limit: u64) -> io::Result<(io::PipeWriter, JoinHandle<()>)> {
    let (reader, writer) = io::pipe()?;
    let reader = pipe::Receiver::from_owned_fd(reader.into())?;
    match std::fs::remove_file(rotated(path)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let file = create(path)?;
    let sink = Sink {
        path: path.to_path_buf(),
        file: Some(file),
        written: 0,
        limit,
    };
    Ok((writer, tokio::spawn(copy(reader, sink))))
}

/// Opens `path` for writing, truncated; never through a symbolic link.
fn create(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

struct Sink {
    path: PathBuf,
    /// None once the file could not be written: the rest is read and dropped.
    file: Option<File>,
    written: u64,
    limit: u64,
}

impl Sink {
    fn write(&mut self, bytes: &[u8]) {
        if self.written >= self.limit {
            self.rotate();
        }
        let Some(file) = &mut self.file else { return };
        match file.write_all(bytes) {
            Ok(()) => self.written += bytes.len() as u64,
            Err(e) => {
                tracing::warn!(log = %self.path.display(), "stops being written: {e}");
                self.file = None;
            }
        }
    }

    fn rotate(&mut self) {
        self.written = 0;
        let renamed = std::fs::rename(&self.path, rotated(&self.path));
        self.file = match renamed.and_then(|()| create(&self.path)) {
            Ok(file) => Some(file),
            Err(e) => {
                tracing::warn!(log = %self.path.display(), "cannot rotate, stops being written: {e}");
                None
            }
        };
    }
}

async fn copy(mut reader: pipe::Receiver, mut sink: Sink) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => sink.write(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(log = %sink.path.display(), "its pipe failed: {e}");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[tokio::test]
    async fn endless_output_keeps_the_newest_within_twice_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let limit = 64 << 10;
        let (mut writer, drained) = start(&path, limit).unwrap();
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
        drained.await.unwrap();
        let current = size(&path);
        let older = size(&rotated(&path));
        assert!(current > 0 && current <= limit + (64 << 10), "{current}");
        assert!(older >= limit && older <= limit + (64 << 10), "{older}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.ends_with(&format!("line {last}\n")),
            "the newest output is kept"
        );
    }

    #[tokio::test]
    async fn a_fresh_start_removes_the_older_rotation_and_a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runner.log");
        std::fs::write(rotated(&path), "old").unwrap();
        let (writer, drained) = start(&path, LIMIT).unwrap();
        assert!(!rotated(&path).exists());
        drop(writer);
        drained.await.unwrap();
        assert_eq!(size(&path), 0);

        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "keep").unwrap();
        let linked = dir.path().join("linked.log");
        std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
        assert!(start(&linked, LIMIT).is_err());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "keep");
    }

    #[tokio::test]
    async fn a_removed_log_does_not_stall_the_writer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.log");
        let (mut writer, drained) = start(&path, 4096).unwrap();
        std::fs::remove_file(&path).unwrap();
        tokio::task::spawn_blocking(move || {
            for _ in 0..1000 {
                writer.write_all(&[b'x'; 1024]).unwrap();
            }
        })
        .await
        .unwrap();
        drained.await.unwrap();
    }
}
