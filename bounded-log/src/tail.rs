//! The newest bytes of a log, read from its end: a boot error's tail, `worker::logs`.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use crate::file::open_read;
use crate::rotated;

/// The last `max_bytes` of the log at `path`, from its older half `<path>.1` too when the
/// newer holds fewer (a rotation may just have happened), and whether older bytes came before
/// them. A missing file is empty; a link or anything but a regular file is refused. At most
/// `max_bytes` are read, wherever the files end.
pub fn tail(path: &Path, max_bytes: u64) -> io::Result<(Vec<u8>, bool)> {
    let (newer, cut) = tail_of(path, max_bytes)?;
    let missing = max_bytes - newer.len() as u64;
    if cut || missing == 0 {
        return Ok((newer, cut));
    }
    let (mut content, cut) = tail_of(&rotated(path), missing)?;
    content.extend_from_slice(&newer);
    Ok((content, cut))
}

fn tail_of(path: &Path, max_bytes: u64) -> io::Result<(Vec<u8>, bool)> {
    let Some(mut file) = open_read(path)? else {
        return Ok((Vec::new(), false));
    };
    let length = file.metadata()?.len();
    let start = length.saturating_sub(max_bytes);
    file.seek(SeekFrom::Start(start))?;
    let mut content = Vec::new();
    file.take(max_bytes).read_to_end(&mut content)?;
    Ok((content, start > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_spans_both_halves_and_says_when_it_cut() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("worker.log");
        assert_eq!(tail(&log, 10).unwrap(), (Vec::new(), false));
        std::fs::write(&log, b"0123456789abc").unwrap();
        assert_eq!(tail(&log, 3).unwrap(), (b"abc".to_vec(), true));
        assert_eq!(tail(&log, 100).unwrap(), (b"0123456789abc".to_vec(), false));
        std::fs::write(rotated(&log), b"older-").unwrap();
        assert_eq!(tail(&log, 13).unwrap(), (b"0123456789abc".to_vec(), false));
        assert_eq!(tail(&log, 15).unwrap(), (b"r-0123456789abc".to_vec(), true));
        assert_eq!(
            tail(&log, 100).unwrap(),
            (b"older-0123456789abc".to_vec(), false)
        );
        // Just rotated: the newer half is empty.
        std::fs::write(&log, b"").unwrap();
        assert_eq!(tail(&log, 2).unwrap(), (b"r-".to_vec(), true));
    }

    #[test]
    fn a_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("canary");
        std::fs::write(&canary, b"host file").unwrap();
        let log = dir.path().join("worker.log");
        std::os::unix::fs::symlink(&canary, &log).unwrap();
        assert!(tail(&log, 100).is_err());
    }
}
