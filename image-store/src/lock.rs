//! An exclusive advisory file lock (flock), so two processes sharing one cache pull an image
//! once. Released when dropped (closing the descriptor releases the lock, even on a crash).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

pub struct FileLock {
    _file: File,
}

impl FileLock {
    /// Blocks until the lock on `path` (created if missing) is held.
    pub fn acquire(path: &Path) -> io::Result<FileLock> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        loop {
            // SAFETY: the descriptor belongs to `file`, which is open for the whole call.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock { _file: file });
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn second_holder_waits_for_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.lock");
        let first = FileLock::acquire(&path).unwrap();
        let got = Arc::new(AtomicBool::new(false));
        let (p, g) = (path.clone(), got.clone());
        let t = std::thread::spawn(move || {
            let _l = FileLock::acquire(&p).unwrap();
            g.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!got.load(Ordering::SeqCst), "lock was not exclusive");
        drop(first);
        t.join().unwrap();
        assert!(got.load(Ordering::SeqCst));
    }
}
