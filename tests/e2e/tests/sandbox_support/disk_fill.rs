//! Filling a sandbox's disk and measuring what the host paid: the disk-limit tests on both
//! backends.

use std::path::Path;

/// Bytes free on the filesystem holding `path`, as an ordinary process sees them.
pub fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(path)
        .output()
        .expect("stat -f");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    let (blocks, size) = (parts.next().unwrap(), parts.next().unwrap());
    blocks * size
}

/// Bytes the files under `dir` (an adapter's state directory) take on the disk: their
/// allocated blocks, a sparse image counting only what was written. What one adapter's
/// sandboxes cost the host, whatever other adapters on the host write meanwhile (free space
/// on the filesystem counts theirs too). Mount points below `dir` (another filesystem) and
/// entries gone while walking are skipped.
pub fn paid_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &Path, dev: u64) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return 0;
        };
        entries
            .flatten()
            .map(|entry| match entry.path().symlink_metadata() {
                Ok(meta) if meta.dev() != dev => 0,
                Ok(meta) if meta.is_dir() => meta.blocks() * 512 + walk(&entry.path(), dev),
                Ok(meta) => meta.blocks() * 512,
                Err(_) => 0,
            })
            .sum()
    }
    std::fs::symlink_metadata(dir).map_or(0, |meta| walk(dir, meta.dev()))
}

/// A python3 program that writes 1 MiB blocks to `path` until the kernel refuses; it prints
/// what it wrote (`written_mb N`) and why it stopped (`errno 28 ENOSPC`).
pub fn filler(path: &str) -> String {
    format!(
        r#"
import errno, os
block = b"x" * (1 << 20)
written = 0
try:
    with open("{path}", "wb") as f:
        for _ in range(4096):
            f.write(block)
            f.flush()
            written += len(block)
        os.fsync(f.fileno())
    print("full no")
except OSError as e:
    print("errno", e.errno, errno.errorcode.get(e.errno))
print("written_mb", written >> 20)
"#
    )
}

/// The number after `key` on one of `out`'s lines.
pub fn number(out: &str, key: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key:?} in {out:?}"))
}
