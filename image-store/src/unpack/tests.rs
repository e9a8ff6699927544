//! Unit tests of the unpacker on layers built in memory.

use super::*;
use std::io::{Cursor, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

/// A tar built entry by entry; `raw` names go in unchecked (tar::Builder refuses `..`).
struct T(Vec<u8>);

impl T {
    fn new() -> Self {
        T(Vec::new())
    }
    fn push(mut self, name: &str, kind: EntryType, link: &str, data: &[u8], mode: u32) -> Self {
        let mut h = tar::Header::new_gnu();
        {
            let raw = h.as_old_mut();
            raw.name[..name.len()].copy_from_slice(name.as_bytes());
            raw.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(1234);
        h.set_gid(4321);
        h.set_mtime(1_000_000);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0, pad));
        self
    }
    fn file(self, name: &str, data: &[u8]) -> Self {
        self.push(name, EntryType::Regular, "", data, 0o644)
    }
    fn dir(self, name: &str) -> Self {
        self.push(name, EntryType::Directory, "", b"", 0o755)
    }
    fn sym(self, name: &str, target: &str) -> Self {
        self.push(name, EntryType::Symlink, target, b"", 0o777)
    }
    fn hard(self, name: &str, target: &str) -> Self {
        self.push(name, EntryType::Link, target, b"", 0o644)
    }
    fn done(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0, 1024));
        self.0
    }
}

fn apply(root: &Path, tar: &[u8]) -> Result<LayerStats, UnpackError> {
    apply_layer(
        root,
        BufReader::new(Cursor::new(tar.to_vec())),
        &Digest::of(tar),
    )
}

fn setup() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    fs::create_dir(&root).unwrap();
    (tmp, root)
}

use std::fs;

#[test]
fn files_dirs_links_modes_and_owners_are_kept() {
    let (_t, root) = setup();
    let tar = T::new()
        .dir("etc/")
        .push("etc/secret", EntryType::Regular, "", b"s", 0o4750)
        .file("etc/motd", b"hi\n")
        .sym("etc/link", "/etc/motd")
        .hard("etc/hard", "etc/motd")
        .done();
    let stats = apply(&root, &tar).unwrap();
    assert_eq!(stats.entries, 5);
    assert_eq!(fs::read(root.join("etc/motd")).unwrap(), b"hi\n");
    assert_eq!(
        fs::read_link(root.join("etc/link")).unwrap(),
        Path::new("/etc/motd")
    );
    let md = fs::metadata(root.join("etc/hard")).unwrap();
    assert_eq!(md.ino(), fs::metadata(root.join("etc/motd")).unwrap().ino());
    let secret = fs::metadata(root.join("etc/secret")).unwrap();
    assert_eq!(secret.permissions().mode() & 0o7777, 0o4750);
    assert_eq!(secret.mtime(), 1_000_000);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!((secret.uid(), secret.gid()), (1234, 4321));
    } else {
        println!("NOTE: not root, ownership not checked");
    }
}

#[test]
fn whiteouts_and_opaque_dirs_hide_lower_layers_only() {
    let (_t, root) = setup();
    apply(
        &root,
        &T::new()
            .file("etc/motd", b"x")
            .file("opt/a", b"a")
            .file("opt/d/deep", b"d")
            .done(),
    )
    .unwrap();
    let upper = T::new()
        .file("opt/b", b"b")
        .file("opt/.wh..wh..opq", b"")
        .file("etc/.wh.motd", b"")
        .done();
    let stats = apply(&root, &upper).unwrap();
    assert_eq!(stats.whiteouts, 2);
    assert!(!root.join("etc/motd").exists());
    assert!(root.join("etc").is_dir());
    assert!(!root.join("opt/a").exists() && !root.join("opt/d").exists());
    assert_eq!(fs::read(root.join("opt/b")).unwrap(), b"b");
}

#[test]
fn type_changes_replace_lower_entries() {
    let (_t, root) = setup();
    apply(
        &root,
        &T::new()
            .file("a/x", b"1")
            .file("b", b"file")
            .sym("c", "b")
            .done(),
    )
    .unwrap();
    apply(
        &root,
        &T::new()
            .file("a", b"now a file")
            .dir("b/")
            .file("c", b"plain")
            .done(),
    )
    .unwrap();
    assert_eq!(fs::read(root.join("a")).unwrap(), b"now a file");
    assert!(root.join("b").is_dir());
    assert!(!fs::symlink_metadata(root.join("c"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn writes_through_symlinked_dirs_stay_inside_root() {
    let (tmp, root) = setup();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let evil = T::new()
        .sym("abs", outside.to_str().unwrap())
        .sym("rel", "../outside")
        .sym("lib", "usr/lib")
        .file("abs/pwned", b"x")
        .file("rel/pwned", b"x")
        .file("lib/libc.so", b"elf")
        .done();
    apply(&root, &evil).unwrap();
    assert_eq!(
        fs::read_dir(&outside).unwrap().count(),
        0,
        "wrote outside the root"
    );
    assert!(root
        .join(outside.strip_prefix("/").unwrap())
        .join("pwned")
        .exists());
    assert!(root.join("outside/pwned").exists());
    assert!(root.join("usr/lib/libc.so").exists());
}

#[test]
fn dotdot_entries_and_hardlinks_out_are_refused() {
    let (tmp, root) = setup();
    let err = apply(&root, &T::new().file("../escape", b"x").done()).unwrap_err();
    assert!(
        matches!(err, UnpackError::Unsafe(ResolveError::DotDot(_))),
        "{err}"
    );
    assert!(!tmp.path().join("escape").exists());
    let err = apply(&root, &T::new().hard("h", "../../etc/passwd").done()).unwrap_err();
    assert!(
        matches!(err, UnpackError::Unsafe(ResolveError::DotDot(_))),
        "{err}"
    );
    // A hard link through an absolute symlink resolves inside the root: target missing there.
    let err = apply(
        &root,
        &T::new().sym("e", "/etc").hard("h", "e/hostname").done(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            UnpackError::HardLink { .. } | UnpackError::Unsafe(ResolveError::Io(..))
        ),
        "{err}"
    );
    assert!(!root.join("h").exists());
}

#[test]
fn diff_id_mismatch_and_truncation_are_errors() {
    let (_t, root) = setup();
    let tar = T::new().file("a", b"a").done();
    let wrong = Digest::of(b"something else");
    let err = apply_layer(&root, BufReader::new(Cursor::new(tar.clone())), &wrong).unwrap_err();
    assert!(matches!(err, UnpackError::DiffId { .. }), "{err}");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let mut gz = gz.finish().unwrap();
    gz.truncate(gz.len() / 2);
    let err = apply_layer(&root, BufReader::new(Cursor::new(gz)), &Digest::of(&tar)).unwrap_err();
    assert!(
        matches!(err, UnpackError::Read(_) | UnpackError::DiffId { .. }),
        "{err}"
    );
}

/// A gzip layer of 64 MiB of zeros is ~64 KiB on the wire: the byte budget stops it while
/// inflating, whatever the compressed size; the same layer within budget applies.
#[test]
fn a_decompression_bomb_stops_at_the_byte_budget() {
    let (_t, root) = setup();
    let zeros = vec![0u8; 64 << 20];
    let tar = T::new().file("bomb", &zeros).done();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    assert!(gz.len() < 1 << 20, "the bomb is small on the wire");
    let budget = Budget {
        bytes: 8 << 20,
        entries: 10,
    };
    let layer = || BufReader::new(Cursor::new(gz.clone()));
    let err = apply_layer_within(&root, layer(), &Digest::of(&tar), budget).unwrap_err();
    assert!(
        matches!(
            err,
            UnpackError::TooLarge {
                what: "uncompressed bytes",
                limit
            } if limit == 8 << 20
        ),
        "{err}"
    );
    let written = fs::metadata(root.join("bomb"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert!(written <= 8 << 20, "wrote {written} bytes past the budget");

    let (_t2, root2) = setup();
    let enough = Budget {
        bytes: tar.len() as u64,
        entries: 1,
    };
    let stats = apply_layer_within(&root2, layer(), &Digest::of(&tar), enough).unwrap();
    let mut left = enough;
    left.spend(&stats);
    assert_eq!(
        left,
        Budget {
            bytes: 0,
            entries: 0
        }
    );
}

#[test]
fn an_inode_bomb_stops_at_the_entry_budget() {
    let (_t, root) = setup();
    let tar = (0..100)
        .fold(T::new(), |t, i| t.file(&format!("f{i}"), b""))
        .done();
    let budget = Budget {
        bytes: u64::MAX,
        entries: 50,
    };
    let layer = BufReader::new(Cursor::new(tar.clone()));
    let err = apply_layer_within(&root, layer, &Digest::of(&tar), budget).unwrap_err();
    assert!(
        matches!(
            err,
            UnpackError::TooLarge {
                what: "entries",
                limit: 50
            }
        ),
        "{err}"
    );
    assert!(fs::read_dir(&root).unwrap().count() <= 50);
}

#[test]
fn zstd_layer_applies_with_its_diff_id() {
    let (_t, root) = setup();
    let tar = T::new().file("z", b"zstd").done();
    let z = zstd::encode_all(&tar[..], 3).unwrap();
    let stats = apply_layer(&root, BufReader::new(Cursor::new(z)), &Digest::of(&tar)).unwrap();
    assert_eq!(stats.compression, Some(Compression::Zstd));
    assert_eq!(fs::read(root.join("z")).unwrap(), b"zstd");
}

/// Cheap in-tree fuzzing: mutated layers may fail but never panic or write outside the root.
#[test]
fn mutated_layers_never_escape_or_panic() {
    let base = T::new()
        .dir("etc/")
        .file("etc/motd", b"hello")
        .sym("lib", "usr/lib")
        .file("lib/x", b"x")
        .hard("etc/h", "etc/motd")
        .file("opt/.wh..wh..opq", b"")
        .done();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..300 {
        let (tmp, root) = setup();
        let mut data = base.clone();
        let headers = header_offsets(&data);
        for _ in 0..(next() % 8 + 1) {
            // Mutate a name or link name (bytes 0..100, 157..257), then fix the checksum so
            // the entry reaches the unpacker instead of failing the tar checksum.
            let h = headers[(next() as usize) % headers.len()];
            let field = if next() % 2 == 0 { 0 } else { 157 };
            let i = h + field + (next() as usize) % 24;
            data[i] = match next() % 4 {
                0 => b'/',
                1 => b'.',
                2 => 0,
                _ => next() as u8,
            };
            fix_checksum(&mut data[h..h + 512]);
        }
        let _ = apply_layer(
            &root,
            BufReader::new(Cursor::new(data.clone())),
            &Digest::of(&data),
        );
        let names: Vec<_> = fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("root")],
            "escaped with {data:?}"
        );
    }
}

fn header_offsets(tar: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + 512 <= tar.len() && tar[off] != 0 {
        out.push(off);
        let size_field = std::str::from_utf8(&tar[off + 124..off + 135]).unwrap();
        let size =
            usize::from_str_radix(size_field.trim_matches(|c: char| c == '\0' || c == ' '), 8)
                .unwrap();
        off += 512 + size.div_ceil(512) * 512;
    }
    out
}

fn fix_checksum(h: &mut [u8]) {
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|b| *b as u32).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
}

#[test]
fn pax_xattrs_and_large_ids_are_applied() {
    let (_t, root) = setup();
    let mut b = tar::Builder::new(Vec::new());
    b.append_pax_extensions([
        ("SCHILY.xattr.user.note", &b"kept"[..]),
        ("uid", &b"3000000"[..]),
    ])
    .unwrap();
    let mut h = tar::Header::new_ustar();
    h.set_path("f").unwrap();
    h.set_size(1);
    h.set_mode(0o644);
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    apply(&root, &tar).unwrap();
    let path = std::ffi::CString::new(root.join("f").as_os_str().as_encoded_bytes()).unwrap();
    let mut buf = [0u8; 16];
    // SAFETY: valid NUL-terminated strings and a buffer of the given length.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            c"user.note".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        println!("NOTE: file system without user xattrs; xattr not checked");
    } else {
        assert_eq!(&buf[..n as usize], b"kept");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(fs::metadata(root.join("f")).unwrap().uid(), 3_000_000);
    }
}
