//! A snapshot's layer: a copy of a sandbox's writable layer (overlay's upper directory) that
//! later sandboxes stack, read-only, between the image and their own writable layer.
//!
//! The upper directory is overlay's own format, kept as it is: a deleted image file is a
//! whiteout (a character device 0/0) and a directory that hides the image's is marked by the
//! `user.overlay.opaque` xattr (the sandbox's overlay is mounted with `userxattr`); both mean
//! the same in a lower layer. Owners, modes, times, hard links and the guest's own `user.*`
//! xattrs are kept; sockets and device nodes other than whiteouts are left out (a sandbox cannot
//! make a real device, and a socket is nothing without its process).
//!
//! Everything here is written by the guest, possibly while it runs: every entry is reached
//! from its directory's descriptor without following a link (`O_NOFOLLOW`, `AT_SYMLINK_NOFOLLOW`),
//! a file is checked to still be the one listed once open, and the copy stops at the byte
//! budget it was given, counted while it writes.
//!
//! What the guest may write but the store's filesystem cannot hold (a 60 KB `user.*` xattr
//! tmpfs takes and ext4 refuses, a file past the store's largest) stops the copy as
//! [`CaptureError::Unstorable`], naming the file (escaped: it is the guest's text) and the
//! store's limit, told apart from a fault of the store; the plugins answer it S310.
//!
//! Unsafe code: descriptors taken over from `nix`'s raw-fd calls, and the xattr calls `nix`
//! does not wrap.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{
    fchmod, fstat, fstatat, futimens, mkdirat, mknodat, utimensat, FileStat, Mode, SFlag,
    UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, mkfifoat, symlinkat, Gid, Uid};

/// What each entry costs the budget besides its contents: the inode and directory entry a
/// layer of many empty files still takes on disk.
pub const ENTRY_BYTES: u64 = 512;

/// Deeper trees are refused: each level holds two descriptors while its children are copied.
pub const MAX_DEPTH: usize = 256;

/// Why a copy stopped.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("the layer holds more than the {limit} bytes allowed")]
    OverBudget { limit: u64 },
    /// Something the guest wrote that the snapshot store's filesystem cannot hold (an xattr
    /// past its size limit, a file past its largest): the guest's doing, not a fault.
    #[error("the snapshot store cannot hold {what} of the sandbox's file {path}: {limit}")]
    Unstorable {
        /// The file, escaped (it is the guest's text).
        path: String,
        what: String,
        limit: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(nix::Error) -> CaptureError {
    let what = what.into();
    move |e| CaptureError::Io {
        what,
        source: io::Error::from(e),
    }
}

/// Copies the tree under the directory `from` into the empty directory `into` (the root's
/// own attributes too); returns the bytes it counted against `limit`.
pub fn copy_layer(from: OwnedFd, into: OwnedFd, limit: u64) -> Result<u64, CaptureError> {
    let mut copy = Copy {
        root: into.as_raw_fd(),
        limit,
        used: 0,
        links: HashMap::new(),
    };
    copy.directory(&from, &into, Path::new(""), 0)?;
    let stat = fstat(from.as_raw_fd()).map_err(io_error("cannot stat the layer's root"))?;
    copy.attributes(&from, &into, &stat, "/")?;
    Ok(copy.used)
}

struct Copy {
    /// The copy's root directory (borrowed from `copy_layer`'s `into`), for hard links
    /// named by their path in it.
    root: RawFd,
    limit: u64,
    used: u64,
    /// Files with more than one link already copied: (device, inode) to their path in the copy.
    links: HashMap<(u64, u64), PathBuf>,
}

impl Copy {
    fn charge(&mut self, bytes: u64) -> Result<(), CaptureError> {
        self.used = self.used.saturating_add(bytes);
        if self.used > self.limit {
            return Err(CaptureError::OverBudget { limit: self.limit });
        }
        Ok(())
    }

    fn directory(
        &mut self,
        from: &OwnedFd,
        into: &OwnedFd,
        at: &Path,
        depth: usize,
    ) -> Result<(), CaptureError> {
        if depth > MAX_DEPTH {
            return Err(CaptureError::Io {
                what: format!("/{}", at.display()),
                source: io::Error::other(format!("deeper than {MAX_DEPTH} directories")),
            });
        }
        let listing = Dir::openat(
            Some(from.as_raw_fd()),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_error(format!("cannot list /{}", at.display())))?;
        let mut names = Vec::new();
        for entry in listing {
            let entry = entry.map_err(io_error(format!("cannot list /{}", at.display())))?;
            let name = entry.file_name();
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                names.push(name.to_owned());
            }
        }
        for name in names {
            self.entry(from, into, at, &name, depth)?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        from: &OwnedFd,
        into: &OwnedFd,
        at: &Path,
        name: &CStr,
        depth: usize,
    ) -> Result<(), CaptureError> {
        let path = at.join(OsStr::from_bytes(name.to_bytes()));
        let shown = escape(&[b"/", path.as_os_str().as_bytes()].concat());
        let stat = match fstatat(Some(from.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Removed by the guest since the listing: it is not in the copy.
            Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => return Err(io_error(format!("cannot stat {shown}"))(e)),
        };
        self.charge(ENTRY_BYTES)?;
        let (from_fd, into_fd) = (Some(from.as_raw_fd()), Some(into.as_raw_fd()));
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        match kind {
            SFlag::S_IFDIR => {
                mkdirat(into_fd, name, Mode::from_bits_truncate(0o700))
                    .map_err(io_error(format!("cannot make {shown}")))?;
                let open_dir = |dir: RawFd| {
                    openat(
                        Some(dir),
                        name,
                        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                        Mode::empty(),
                    )
                    // SAFETY: openat returned a new descriptor that nothing else owns.
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
                };
                let source =
                    open_dir(from.as_raw_fd()).map_err(io_error(format!("cannot open {shown}")))?;
                let target = open_dir(into.as_raw_fd())
                    .map_err(io_error(format!("cannot open the copy of {shown}")))?;
                let opened =
                    fstat(source.as_raw_fd()).map_err(io_error(format!("cannot stat {shown}")))?;
                self.directory(&source, &target, &path, depth + 1)?;
                // After its entries: the directory's own mode may forbid writing them, and
                // writing them changes its times.
                self.attributes(&source, &target, &opened, &shown)?;
            }
            SFlag::S_IFREG => self.file(from, into, name, &path, &stat)?,
            SFlag::S_IFLNK => {
                let text =
                    readlinkat(from_fd, name).map_err(io_error(format!("cannot read {shown}")))?;
                self.charge(text.len() as u64)?;
                symlinkat(text.as_os_str(), into_fd, name)
                    .map_err(io_error(format!("cannot make {shown}")))?;
                self.owner_and_times_of_entry(into, name, &stat, &shown)?;
            }
            // A whiteout: the image's file deleted in the sandbox.
            SFlag::S_IFCHR if stat.st_rdev == 0 => {
                mknodat(into_fd, name, SFlag::S_IFCHR, Mode::empty(), 0)
                    .map_err(io_error(format!("cannot make the whiteout {shown}")))?;
                self.owner_and_times_of_entry(into, name, &stat, &shown)?;
            }
            SFlag::S_IFIFO => {
                mkfifoat(into_fd, name, Mode::from_bits_truncate(0o600))
                    .map_err(io_error(format!("cannot make {shown}")))?;
                self.owner_and_times_of_entry(into, name, &stat, &shown)?;
                nix::sys::stat::fchmodat(
                    into_fd,
                    name,
                    Mode::from_bits_truncate(stat.st_mode & 0o7777),
                    nix::sys::stat::FchmodatFlags::FollowSymlink,
                )
                .map_err(io_error(format!("cannot set the mode of {shown}")))?;
            }
            // Sockets and device nodes that are not whiteouts.
            _ => {
                tracing::debug!(path = %shown, "left out of the snapshot: not a file, directory, link or fifo")
            }
        }
        Ok(())
    }

    fn file(
        &mut self,
        from: &OwnedFd,
        into: &OwnedFd,
        name: &CStr,
        path: &Path,
        stat: &FileStat,
    ) -> Result<(), CaptureError> {
        let shown = escape(&[b"/", path.as_os_str().as_bytes()].concat());
        let identity = (stat.st_dev, stat.st_ino);
        if stat.st_nlink > 1 {
            if let Some(first) = self.links.get(&identity) {
                let first =
                    CString::new(first.as_os_str().as_bytes()).map_err(|e| CaptureError::Io {
                        what: shown.clone(),
                        source: io::Error::other(e),
                    })?;
                let here =
                    CString::new(path.as_os_str().as_bytes()).map_err(|e| CaptureError::Io {
                        what: shown.clone(),
                        source: io::Error::other(e),
                    })?;
                return linkat(
                    Some(self.root),
                    first.as_c_str(),
                    Some(self.root),
                    here.as_c_str(),
                    AtFlags::empty(),
                )
                .map_err(io_error(format!("cannot link {shown}")));
            }
        }
        // O_NONBLOCK: a fifo swapped in since the stat must not hold the copy.
        let source = openat(
            Some(from.as_raw_fd()),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_error(format!("cannot open {shown}")))?;
        // SAFETY: openat returned a new descriptor that nothing else owns.
        let source = unsafe { File::from_raw_fd(source) };
        let opened = fstat(source.as_raw_fd()).map_err(io_error(format!("cannot stat {shown}")))?;
        if (opened.st_dev, opened.st_ino) != identity
            || SFlag::from_bits_truncate(opened.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG
        {
            // Replaced by the guest since the listing: copied as it is now.
            return Ok(());
        }
        let target = openat(
            Some(into.as_raw_fd()),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(io_error(format!("cannot make {shown}")))?;
        // SAFETY: openat returned a new descriptor that nothing else owns.
        let mut target = unsafe { File::from_raw_fd(target) };
        let room = self.limit.saturating_sub(self.used);
        let copied = io::copy(&mut (&source).take(room.saturating_add(1)), &mut target).map_err(
            |source| match source.raw_os_error() {
                Some(libc::EFBIG) => CaptureError::Unstorable {
                    path: shown.clone(),
                    what: format!("the contents ({} bytes)", stat.st_size),
                    limit: "larger than its filesystem allows one file to be (EFBIG)".into(),
                },
                _ => CaptureError::Io {
                    what: format!("cannot copy {shown}"),
                    source,
                },
            },
        )?;
        self.charge(copied)?;
        let (source, target) = (OwnedFd::from(source), OwnedFd::from(target));
        self.attributes(&source, &target, &opened, &shown)?;
        if opened.st_nlink > 1 {
            self.links.insert(identity, path.to_path_buf());
        }
        Ok(())
    }

    /// Owner, mode, times and `user.*` xattrs of an open directory or regular file.
    fn attributes(
        &mut self,
        from: &OwnedFd,
        into: &OwnedFd,
        stat: &FileStat,
        shown: &str,
    ) -> Result<(), CaptureError> {
        self.xattrs(from, into, shown)?;
        fchown(
            into.as_raw_fd(),
            Some(Uid::from_raw(stat.st_uid)),
            Some(Gid::from_raw(stat.st_gid)),
        )
        .map_err(io_error(format!("cannot set the owner of {shown}")))?;
        // After the owner: a change of owner clears the set-id bits.
        fchmod(
            into.as_raw_fd(),
            Mode::from_bits_truncate(stat.st_mode & 0o7777),
        )
        .map_err(io_error(format!("cannot set the mode of {shown}")))?;
        futimens(into.as_raw_fd(), &atime(stat), &mtime(stat))
            .map_err(io_error(format!("cannot set the times of {shown}")))
    }

    fn owner_and_times_of_entry(
        &mut self,
        into: &OwnedFd,
        name: &CStr,
        stat: &FileStat,
        shown: &str,
    ) -> Result<(), CaptureError> {
        fchownat(
            Some(into.as_raw_fd()),
            name,
            Some(Uid::from_raw(stat.st_uid)),
            Some(Gid::from_raw(stat.st_gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(io_error(format!("cannot set the owner of {shown}")))?;
        utimensat(
            Some(into.as_raw_fd()),
            name,
            &atime(stat),
            &mtime(stat),
            UtimensatFlags::NoFollowSymlink,
        )
        .map_err(io_error(format!("cannot set the times of {shown}")))
    }

    /// Copies the `user.*` xattrs: the guest's own and overlay's opaque mark. Overlay's
    /// other marks (`origin`, `impure`) describe the sandbox's own upper directory and
    /// mean nothing in a lower layer.
    fn xattrs(&mut self, from: &OwnedFd, into: &OwnedFd, shown: &str) -> Result<(), CaptureError> {
        for name in list_xattrs(from).map_err(|source| CaptureError::Io {
            what: format!("cannot list the xattrs of {shown}"),
            source,
        })? {
            let bytes = name.to_bytes();
            let overlay_mark = bytes.starts_with(b"user.overlay.");
            if !bytes.starts_with(b"user.") || (overlay_mark && bytes != b"user.overlay.opaque") {
                continue;
            }
            let Some(value) = get_xattr(from, &name).map_err(|source| CaptureError::Io {
                what: format!("cannot read an xattr of {shown}"),
                source,
            })?
            else {
                continue;
            };
            self.charge((bytes.len() + value.len()) as u64)?;
            set_xattr(into, &name, &value).map_err(|source| {
                match unstorable_xattr(into, &source) {
                    Some(limit) => CaptureError::Unstorable {
                        path: shown.to_string(),
                        what: format!("the xattr {} ({} bytes)", escape(bytes), value.len()),
                        limit,
                    },
                    None => CaptureError::Io {
                        what: format!("cannot set an xattr of {shown}"),
                        source,
                    },
                }
            })?;
        }
        Ok(())
    }
}

fn atime(stat: &FileStat) -> TimeSpec {
    TimeSpec::new(stat.st_atime, stat.st_atime_nsec)
}

fn mtime(stat: &FileStat) -> TimeSpec {
    TimeSpec::new(stat.st_mtime, stat.st_mtime_nsec)
}

/// Free blocks past which a store refusing an xattr for room is refusing it for the file's
/// own xattr space, not for its disk.
const STORE_ROOM_BLOCKS: u64 = 1024;

/// Why the store refused an xattr the guest could set, when it is its filesystem's limit (the
/// guest's file's size, not a fault of the store): said with that limit.
fn unstorable_xattr(into: &OwnedFd, error: &io::Error) -> Option<String> {
    match error.raw_os_error()? {
        libc::ENOSPC => {
            // A store out of room is the host's to fix, not this file's.
            let stat = nix::sys::statvfs::fstatvfs(into).ok()?;
            if stat.blocks_available() < STORE_ROOM_BLOCKS {
                return None;
            }
            let block = stat.block_size();
            Some(format!(
                "its filesystem has no room for it in the file's xattr space (ENOSPC; ext4 \
                 without ea_inode holds all of one file's xattrs in one {block}-byte block)"
            ))
        }
        libc::E2BIG | libc::ERANGE => Some(format!(
            "over the largest xattr its filesystem takes ({}; Linux takes at most {XATTR_MAX} \
             bytes)",
            if error.raw_os_error() == Some(libc::E2BIG) {
                "E2BIG"
            } else {
                "ERANGE"
            }
        )),
        libc::EOPNOTSUPP => Some("its filesystem takes no user xattrs (EOPNOTSUPP)".into()),
        _ => None,
    }
}

/// The guest's text as a message may carry it: printable ASCII but for `\` (as `\\`), everything
/// else (control characters, non-ASCII, bytes that are not UTF-8) as `\xNN`.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for &byte in bytes {
        match byte {
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(byte as char),
            _ => out.push_str(&format!("\\x{byte:02x}")),
        }
    }
    out
}

/// Most xattr names and values a file may have on Linux.
const XATTR_MAX: usize = 64 * 1024;

fn list_xattrs(fd: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut buffer = vec![0u8; XATTR_MAX];
    // SAFETY: the buffer is valid for writes of its length for the whole call.
    let length =
        unsafe { libc::flistxattr(fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
    if length < 0 {
        let error = io::Error::last_os_error();
        // A filesystem without xattrs has none to copy.
        if error.raw_os_error() == Some(libc::ENOTSUP) {
            return Ok(Vec::new());
        }
        return Err(error);
    }
    buffer.truncate(length as usize);
    Ok(buffer
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty())
        .filter_map(|name| CString::new(name).ok())
        .collect())
}

fn get_xattr(fd: &OwnedFd, name: &CStr) -> io::Result<Option<Vec<u8>>> {
    let mut value = vec![0u8; XATTR_MAX];
    // SAFETY: `name` is NUL-terminated and the buffer is valid for writes of its length.
    let length = unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    if length < 0 {
        let error = io::Error::last_os_error();
        // Removed by the guest since the listing.
        if error.raw_os_error() == Some(libc::ENODATA) {
            return Ok(None);
        }
        return Err(error);
    }
    value.truncate(length as usize);
    Ok(Some(value))
}

fn set_xattr(fd: &OwnedFd, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `value` is valid for reads of its length.
    let done = unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    if done < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// How the copying process says the layer is over its budget (its exit status).
pub const OVER_BUDGET_EXIT: u8 = 3;
/// How it says the layer holds something the store cannot (its exit status; the line on its
/// stderr names it).
pub const UNSTORABLE_EXIT: u8 = 4;

/// The upper directory `upper` of the sandbox whose launcher (bwrap) or runner (libkrun) is
/// `pid`, as that process's mount namespace shows it (a root adapter's layer is staged, a
/// tmpfs holds the upper directory): reached through `/proc/PID/root` with no link followed
/// past it.
pub fn open_upper(pid: u32, upper: &Path) -> io::Result<OwnedFd> {
    let root = File::open(format!("/proc/{pid}/root"))?;
    let relative = upper.strip_prefix("/").unwrap_or(upper);
    let how = nix::fcntl::OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(
            nix::fcntl::ResolveFlag::RESOLVE_BENEATH
                | nix::fcntl::ResolveFlag::RESOLVE_NO_SYMLINKS
                | nix::fcntl::ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = nix::fcntl::openat2(root.as_raw_fd(), relative, how)?;
    // SAFETY: openat2 returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The empty directory the copy goes into (made by the adapter, never by a guest).
pub fn open_into(into: &Path) -> io::Result<OwnedFd> {
    let fd = nix::fcntl::open(
        into,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // SAFETY: open returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The copying process's side: opens the layers (before the caller changes its ids, while
/// `/proc/PID/root` is still its to open), lets `become_owner` give the process the ids that
/// can read every file of the layer and give the copy the same owners, copies, prints the
/// bytes counted. Returns the process's exit status (`OVER_BUDGET_EXIT` past `limit`).
pub fn copy_as_process(
    program: &str,
    pid: u32,
    upper: &Path,
    into: &Path,
    limit: u64,
    become_owner: impl FnOnce() -> io::Result<()>,
) -> u8 {
    let fail = |message: String| {
        eprintln!("{program}: {message}");
        1
    };
    let opened = open_upper(pid, upper).and_then(|from| Ok((from, open_into(into)?)));
    let (from, into) = match opened {
        Ok(fds) => fds,
        Err(e) => return fail(format!("cannot open the layers: {e}")),
    };
    if let Err(e) = become_owner() {
        return fail(format!("cannot take the ids of the sandbox's files: {e}"));
    }
    match copy_layer(from, into, limit) {
        Ok(bytes) => {
            println!("{bytes}");
            0
        }
        Err(e @ CaptureError::OverBudget { .. }) => {
            eprintln!("{program}: {e}");
            OVER_BUDGET_EXIT
        }
        Err(e @ CaptureError::Unstorable { .. }) => {
            eprintln!("{program}: {e}");
            UNSTORABLE_EXIT
        }
        Err(e) => fail(e.to_string()),
    }
}

/// How long a copy may take: a sandbox's layer is bounded by its disk, so only a host under
/// heavy load gets near it.
#[cfg(feature = "run")]
const CAPTURE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Why [`run`] got no size from the copying process. Its callers answer these with their
/// S-codes: `OverBudget` is a resource limit, `Unstorable` what the store cannot hold (the
/// plugins' S310), the others internal faults. The messages are the ones callers show.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot start {program} to copy the sandbox's files: {source}")]
    Start {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("copying the sandbox's files took over {secs} s")]
    TimedOut { secs: u64 },
    #[error("the sandbox's files are over what `max_snapshot_disk_mb` has left ({limit} bytes)")]
    OverBudget { limit: u64 },
    /// `line`: the copier's own line, without its program name; the guest's text in it is
    /// escaped.
    #[error("{line}; remove or shrink it in the sandbox and take the snapshot again")]
    Unstorable { line: String },
    #[error("copying the sandbox's files failed ({status}): {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("the copy did not say its size")]
    NoSize,
}

/// Runs `command`, a process that copies a sandbox's layer with [`copy_as_process`] (the
/// bwrap launcher's or the VM runner's `--capture-layer`), within a time bound, and reads
/// its answer: the bytes it counted against `limit`.
#[cfg(feature = "run")]
pub async fn run(mut command: tokio::process::Command, limit: u64) -> Result<u64, RunError> {
    let program = command.as_std().get_program().to_owned();
    let copy = command
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(CAPTURE_TIMEOUT, copy).await {
        Ok(Ok(output)) => output,
        Ok(Err(source)) => {
            return Err(RunError::Start {
                program: Path::new(&program).display().to_string(),
                source,
            })
        }
        Err(_) => {
            return Err(RunError::TimedOut {
                secs: CAPTURE_TIMEOUT.as_secs(),
            })
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stderr = stderr.trim();
    if output.status.code() == Some(i32::from(OVER_BUDGET_EXIT)) {
        return Err(RunError::OverBudget { limit });
    }
    if output.status.code() == Some(i32::from(UNSTORABLE_EXIT)) {
        let line = stderr.lines().last().unwrap_or_default();
        let line = line.split_once(": ").map_or(line, |(_, rest)| rest);
        return Err(RunError::Unstorable {
            line: line.to_string(),
        });
    }
    if !output.status.success() {
        return Err(RunError::Failed {
            status: output.status,
            stderr: stderr.to_string(),
        });
    }
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| RunError::NoSize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 60 KB: within what tmpfs takes for one xattr, far past ext4's one block.
    const BIG: usize = 60_000;

    fn dir_fd(path: &Path) -> OwnedFd {
        open_into(path).unwrap()
    }

    /// A directory on tmpfs (`/dev/shm`), where a guest's layer lives and a 60 KB xattr is
    /// taken; none where this host's tmpfs takes no such xattr.
    fn tmpfs_source() -> Option<(tempfile::TempDir, PathBuf)> {
        let dir = tempfile::tempdir_in("/dev/shm").ok()?;
        let file = dir.path().join("bad\nname\u{e9}");
        std::fs::write(&file, b"data").unwrap();
        let name = CString::new("user.x").unwrap();
        let opened = File::open(&file).unwrap();
        set_xattr(&OwnedFd::from(opened), &name, &vec![b'a'; BIG]).ok()?;
        Some((dir, file))
    }

    #[test]
    fn an_xattr_the_store_cannot_hold_is_unstorable_and_named_escaped() {
        let Some((source, _file)) = tmpfs_source() else {
            println!("*** DID NOT RUN: this host's tmpfs takes no {BIG}-byte user xattr ***");
            return;
        };
        // The store: the temporary directory's filesystem (ext4 here).
        let store = tempfile::tempdir().unwrap();
        let probe = store.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        let name = CString::new("user.x").unwrap();
        let store_takes_it = set_xattr(
            &OwnedFd::from(File::open(&probe).unwrap()),
            &name,
            &vec![b'a'; BIG],
        )
        .is_ok();
        std::fs::remove_file(&probe).unwrap();
        let result = copy_layer(dir_fd(source.path()), dir_fd(store.path()), 1 << 30);
        if store_takes_it {
            println!("the store's filesystem takes a {BIG}-byte xattr: it is copied");
            result.expect("copied");
            return;
        }
        let error = result.expect_err("the store refuses the xattr");
        let message = error.to_string();
        println!("{message}");
        match &error {
            CaptureError::Unstorable { path, what, limit } => {
                assert_eq!(path, "/bad\\x0aname\\xc3\\xa9");
                assert_eq!(what, &format!("the xattr user.x ({BIG} bytes)"));
                assert!(
                    limit.contains("ENOSPC") || limit.contains("E2BIG"),
                    "{limit}"
                );
            }
            other => panic!("not unstorable: {other:?}"),
        }
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn small_xattrs_are_copied_and_escape_keeps_printable_text() {
        let source = tempfile::tempdir().unwrap();
        let file = source.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        let name = CString::new("user.small").unwrap();
        set_xattr(&OwnedFd::from(File::open(&file).unwrap()), &name, b"v").unwrap();
        let store = tempfile::tempdir().unwrap();
        copy_layer(dir_fd(source.path()), dir_fd(store.path()), 1 << 20).unwrap();
        let copied = OwnedFd::from(File::open(store.path().join("f")).unwrap());
        assert_eq!(get_xattr(&copied, &name).unwrap(), Some(b"v".to_vec()));
        assert_eq!(escape(b"/a b/c\\d\x01"), "/a b/c\\\\d\\x01");
    }

    use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    fn copy(source: &Path, store: &Path, limit: u64) -> Result<u64, CaptureError> {
        copy_layer(dir_fd(source), dir_fd(store), limit)
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Every path under `dir`, relative, without following a link.
    fn listing(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut pending = vec![PathBuf::new()];
        while let Some(at) = pending.pop() {
            for entry in std::fs::read_dir(dir.join(&at)).unwrap() {
                let entry = entry.unwrap();
                let path = at.join(entry.file_name());
                if entry.file_type().unwrap().is_dir() {
                    pending.push(path.clone());
                }
                found.push(path);
            }
        }
        found.sort();
        found
    }

    #[test]
    fn links_are_copied_as_their_text_and_never_followed() {
        let source = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"host's").unwrap();
        std::fs::create_dir(source.path().join("sub")).unwrap();
        std::fs::write(source.path().join("sub/f"), b"guest's").unwrap();
        symlink(outside.path(), source.path().join("out")).unwrap();
        symlink("../../../../etc/passwd", source.path().join("up")).unwrap();
        symlink("sub", source.path().join("to-sub")).unwrap();
        // A name that is not UTF-8 and holds a newline, kept byte for byte.
        let odd = OsStr::from_bytes(b"odd\n\xff");
        symlink("dangling", source.path().join(odd)).unwrap();
        let store = tempfile::tempdir().unwrap();
        let used = copy(source.path(), store.path(), 1 << 20).unwrap();
        let text_bytes = outside.path().as_os_str().len() + 22 + 3 + 8;
        assert_eq!(used, 6 * ENTRY_BYTES + 7 + text_bytes as u64);
        for (name, text) in [
            (OsStr::new("out"), outside.path().as_os_str()),
            (OsStr::new("up"), OsStr::new("../../../../etc/passwd")),
            (OsStr::new("to-sub"), OsStr::new("sub")),
            (odd, OsStr::new("dangling")),
        ] {
            let copied = store.path().join(name);
            assert!(copied.symlink_metadata().unwrap().is_symlink(), "{name:?}");
            assert_eq!(std::fs::read_link(&copied).unwrap().as_os_str(), text);
        }
        let names: Vec<_> = ["odd\n\u{fffd}", "out", "sub", "sub/f", "to-sub", "up"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let copied: Vec<_> = listing(store.path())
            .iter()
            .map(|p| PathBuf::from(p.to_string_lossy().into_owned()))
            .collect();
        assert_eq!(copied, names);
        assert_eq!(listing(outside.path()), vec![PathBuf::from("secret")]);
    }

    #[test]
    fn hard_links_stay_one_file_counted_once() {
        let source = tempfile::tempdir().unwrap();
        std::fs::write(source.path().join("a"), b"hello").unwrap();
        std::fs::hard_link(source.path().join("a"), source.path().join("b")).unwrap();
        std::fs::create_dir(source.path().join("dir")).unwrap();
        std::fs::hard_link(source.path().join("a"), source.path().join("dir/c")).unwrap();
        let store = tempfile::tempdir().unwrap();
        let used = copy(source.path(), store.path(), 1 << 20).unwrap();
        // Four entries (a, b, dir, dir/c), the contents once.
        assert_eq!(used, 4 * ENTRY_BYTES + 5);
        let a = std::fs::metadata(store.path().join("a")).unwrap();
        assert_eq!(a.nlink(), 3);
        for other in ["b", "dir/c"] {
            let other = std::fs::metadata(store.path().join(other)).unwrap();
            assert_eq!((other.dev(), other.ino()), (a.dev(), a.ino()));
        }
        assert_eq!(std::fs::read(store.path().join("dir/c")).unwrap(), b"hello");
    }

    #[test]
    fn whiteouts_and_fifos_are_kept_devices_and_sockets_left_out() {
        if !is_root() {
            println!("*** DID NOT RUN: making device nodes needs root ***");
            return;
        }
        let source = tempfile::tempdir().unwrap();
        let node = |name: &str, kind: SFlag, dev: libc::dev_t| {
            let path = source.path().join(name);
            nix::sys::stat::mknod(&path, kind, Mode::from_bits_truncate(0o644), dev).unwrap();
        };
        node("whiteout", SFlag::S_IFCHR, 0);
        node("null", SFlag::S_IFCHR, libc::makedev(1, 3));
        node("disk", SFlag::S_IFBLK, libc::makedev(7, 0));
        nix::unistd::mkfifo(&source.path().join("fifo"), Mode::from_bits_truncate(0o640)).unwrap();
        let _socket = std::os::unix::net::UnixListener::bind(source.path().join("sock")).unwrap();
        std::fs::write(source.path().join("file"), b"x").unwrap();
        let store = tempfile::tempdir().unwrap();
        copy(source.path(), store.path(), 1 << 20).unwrap();
        assert_eq!(
            listing(store.path()),
            ["fifo", "file", "whiteout"].map(PathBuf::from)
        );
        let whiteout = store.path().join("whiteout").symlink_metadata().unwrap();
        assert_eq!(whiteout.mode() & libc::S_IFMT, libc::S_IFCHR);
        assert_eq!(whiteout.rdev(), 0);
        let fifo = store.path().join("fifo").symlink_metadata().unwrap();
        assert_eq!(fifo.mode() & libc::S_IFMT, libc::S_IFIFO);
        assert_eq!(fifo.mode() & 0o7777, 0o640);
    }

    #[test]
    fn set_id_bits_owners_and_times_are_kept() {
        let source = tempfile::tempdir().unwrap();
        let file = source.path().join("tool");
        std::fs::write(&file, b"#!").unwrap();
        let dir = source.path().join("shared");
        std::fs::create_dir(&dir).unwrap();
        // As root, owners the copier is not: the change of owner must not drop the bits.
        let (uid, gid) = if is_root() {
            (1000, 1234)
        } else {
            (
                nix::unistd::getuid().as_raw(),
                nix::unistd::getgid().as_raw(),
            )
        };
        std::os::unix::fs::chown(&file, Some(uid), Some(gid)).unwrap();
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o6755)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o3775)).unwrap();
        let old = TimeSpec::new(1_000_000_000, 5);
        utimensat(None, &file, &old, &old, UtimensatFlags::NoFollowSymlink).unwrap();
        let store = tempfile::tempdir().unwrap();
        copy(source.path(), store.path(), 1 << 20).unwrap();
        let tool = std::fs::metadata(store.path().join("tool")).unwrap();
        assert_eq!(tool.mode() & 0o7777, 0o6755);
        assert_eq!((tool.uid(), tool.gid()), (uid, gid));
        assert_eq!((tool.mtime(), tool.mtime_nsec()), (1_000_000_000, 5));
        let shared = std::fs::metadata(store.path().join("shared")).unwrap();
        assert_eq!(shared.mode() & 0o7777, 0o3775);
        assert_eq!((shared.uid(), shared.gid()), (uid, gid));
    }

    #[test]
    fn only_the_guests_xattrs_and_overlays_opaque_mark_are_copied() {
        let source = tempfile::tempdir().unwrap();
        let dir = source.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        let set = |path: &Path, name: &str, value: &[u8]| {
            let fd = OwnedFd::from(File::open(path).unwrap());
            set_xattr(&fd, &CString::new(name).unwrap(), value)
        };
        set(&dir, "user.overlay.opaque", b"y").unwrap();
        set(&dir, "user.overlay.origin", b"handle").unwrap();
        set(&dir, "user.mine", b"kept").unwrap();
        let trusted = is_root() && set(&dir, "trusted.overlay.opaque", b"y").is_ok();
        let store = tempfile::tempdir().unwrap();
        copy(source.path(), store.path(), 1 << 20).unwrap();
        let copied = OwnedFd::from(File::open(store.path().join("d")).unwrap());
        let mut names: Vec<_> = list_xattrs(&copied)
            .unwrap()
            .into_iter()
            .filter(|n| !n.to_bytes().starts_with(b"security."))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [c"user.mine".to_owned(), c"user.overlay.opaque".to_owned()]
        );
        println!("a trusted.* xattr was in the source too: {trusted}");
    }

    #[test]
    fn the_budget_stops_a_copy_while_it_writes() {
        let source = tempfile::tempdir().unwrap();
        std::fs::write(source.path().join("big"), vec![7u8; 1 << 20]).unwrap();
        let store = tempfile::tempdir().unwrap();
        let limit = 64 * 1024;
        match copy(source.path(), store.path(), limit) {
            Err(CaptureError::OverBudget { limit: said }) => assert_eq!(said, limit),
            other => panic!("not over budget: {other:?}"),
        }
        // Written no further than the budget (and the one byte that tells it is past).
        let written = std::fs::metadata(store.path().join("big")).unwrap().len();
        assert!(written <= limit + 1, "{written}");
        // Many empty entries cost their inodes.
        let many = tempfile::tempdir().unwrap();
        for i in 0..100 {
            std::fs::write(many.path().join(i.to_string()), b"").unwrap();
        }
        let store = tempfile::tempdir().unwrap();
        assert!(matches!(
            copy(many.path(), store.path(), 99 * ENTRY_BYTES),
            Err(CaptureError::OverBudget { .. })
        ));
    }

    const STACK: usize = 8 << 20;

    #[test]
    fn a_tree_deeper_than_the_bound_is_refused() {
        let source = tempfile::tempdir().unwrap();
        let mut at = source.path().to_path_buf();
        for _ in 0..=MAX_DEPTH + 1 {
            at.push("d");
            std::fs::create_dir(&at).unwrap();
        }
        let store = tempfile::tempdir().unwrap();
        // On a thread with the stack of a process's main thread (Linux's default 8 MiB
        // limit), where the copying process runs it: each level is a few frames deep.
        let (from, into) = (source.path().to_path_buf(), store.path().to_path_buf());
        let error = std::thread::Builder::new()
            .stack_size(STACK)
            .spawn(move || copy(&from, &into, 1 << 30))
            .unwrap()
            .join()
            .unwrap()
            .expect_err("too deep");
        assert!(
            error
                .to_string()
                .contains(&format!("deeper than {MAX_DEPTH} directories")),
            "{error}"
        );
    }

    /// The guest swaps a directory and a file for links out of its tree (and back) while the
    /// copy runs: every copy either fails cleanly or holds the guest's own files and links,
    /// never what the links point at, and nothing is written outside the copy.
    #[test]
    fn a_tree_that_changes_while_copied_never_leads_the_copy_out() {
        let source = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"SECRET").unwrap();
        let dir = source.path().join("d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("f"), b"guest").unwrap();
        std::fs::write(source.path().join("x"), b"guest").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let guest = {
            let (stop, root) = (stop.clone(), source.path().to_path_buf());
            let outside = outside.path().to_path_buf();
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(root.join("d"), root.join("d.real")).unwrap();
                    symlink(&outside, root.join("d")).unwrap();
                    std::fs::rename(root.join("x"), root.join("x.real")).unwrap();
                    symlink(outside.join("secret"), root.join("x")).unwrap();
                    std::fs::remove_file(root.join("d")).unwrap();
                    std::fs::rename(root.join("d.real"), root.join("d")).unwrap();
                    std::fs::remove_file(root.join("x")).unwrap();
                    std::fs::rename(root.join("x.real"), root.join("x")).unwrap();
                    swaps += 1;
                }
                swaps
            })
        };
        let (mut copied, mut failed) = (0, 0);
        for _ in 0..300 {
            let store = tempfile::tempdir().unwrap();
            match copy(source.path(), store.path(), 1 << 20) {
                Ok(_) => copied += 1,
                Err(CaptureError::Io { .. }) => {
                    failed += 1;
                    continue;
                }
                Err(other) => panic!("{other}"),
            }
            for path in listing(store.path()) {
                let full = store.path().join(&path);
                let meta = full.symlink_metadata().unwrap();
                if meta.is_symlink() {
                    let text = std::fs::read_link(&full).unwrap();
                    assert!(text.starts_with(outside.path()), "{path:?} -> {text:?}");
                } else if meta.is_file() {
                    assert_eq!(std::fs::read(&full).unwrap(), b"guest", "{path:?}");
                }
                assert!(!path.ends_with("secret"), "{path:?} copied from outside");
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = guest.join().unwrap();
        println!("{copied} copies, {failed} stopped cleanly, {swaps} swaps by the guest");
        assert!(swaps > 0 && copied > 0);
        assert_eq!(listing(outside.path()), vec![PathBuf::from("secret")]);
    }

    #[test]
    fn the_stores_refusals_that_are_the_files_doing_are_told_apart() {
        let store = tempfile::tempdir().unwrap();
        let into = dir_fd(store.path());
        let said = |errno| unstorable_xattr(&into, &io::Error::from_raw_os_error(errno));
        assert!(said(libc::E2BIG).unwrap().contains("E2BIG"));
        assert!(said(libc::ERANGE).unwrap().contains("ERANGE"));
        assert!(said(libc::EOPNOTSUPP).unwrap().contains("no user xattrs"));
        // This store has room: ENOSPC is the file's xattr space, not the disk.
        let room = nix::sys::statvfs::fstatvfs(&into)
            .unwrap()
            .blocks_available();
        if room >= STORE_ROOM_BLOCKS {
            assert!(said(libc::ENOSPC).unwrap().contains("ENOSPC"));
        }
        assert_eq!(said(libc::EIO), None);
        assert_eq!(said(libc::EACCES), None);
        assert_eq!(unstorable_xattr(&into, &io::Error::other("no errno")), None);
    }

    #[cfg(feature = "run")]
    #[tokio::test]
    async fn an_unstorable_exit_carries_the_copiers_line() {
        let mut command = tokio::process::Command::new("/bin/sh");
        command.args([
            "-c",
            "echo 'copier: the snapshot store cannot hold the xattr user.x (60000 bytes) of the sandbox'\"'\"'s file /a: limit' >&2; exit 4",
        ]);
        let error = run(command, 100).await.expect_err("refused");
        assert!(matches!(error, RunError::Unstorable { .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            "the snapshot store cannot hold the xattr user.x (60000 bytes) of the sandbox's \
             file /a: limit; remove or shrink it in the sandbox and take the snapshot again"
        );
    }
}
