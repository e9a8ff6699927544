//! Directory descriptors for the walks (`fs::grep`, `fs::sed`, recursive `fs::chmod`): every
//! step below the root is resolved relative to the directory descriptor already held, with
//! `O_NOFOLLOW`, so a directory swapped for a symbolic link while a walk runs can never send
//! it out of the tree. The `*at` system calls live here, each with its safety argument.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path};

/// What a directory entry is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// FIFOs, sockets, devices.
    Other,
}

impl Kind {
    fn of_mode(mode: libc::mode_t) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            _ => Kind::Other,
        }
    }
}

/// One entry of a directory listing.
pub struct Entry {
    pub name: OsString,
    pub kind: Kind,
}

/// An open directory (`O_RDONLY | O_DIRECTORY`, close-on-exec).
pub struct Dir(OwnedFd);

fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// A single path component: no `/`, not `.` or `..`, not empty.
fn check_name(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    c_name(name)
}

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// `fstat` of any descriptor (`O_PATH` ones included).
pub fn stat_fd(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: stat is plain old data; all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable stat; a bad descriptor only makes fstat fail.
    check(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

impl Dir {
    /// Opens the directory at `path`, following links on the way: the caller named it.
    pub fn open(path: &Path) -> io::Result<Dir> {
        let c_path = c_name(path.as_os_str())?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC;
        // SAFETY: `c_path` is NUL-terminated and outlives the call.
        let fd = check(unsafe { libc::open(c_path.as_ptr(), flags) })?;
        // SAFETY: open succeeded: `fd` is open and owned by nobody else.
        Ok(Dir(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn openat(&self, name: &OsStr, flags: libc::c_int) -> io::Result<OwnedFd> {
        let c_name = check_name(name)?;
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: `c_name` is NUL-terminated; our descriptor is open for the borrow; the
        // mode argument is read only with O_CREAT and is a valid mode_t then.
        let fd = check(unsafe { libc::openat(self.0.as_raw_fd(), c_name.as_ptr(), flags, 0o600) })?;
        // SAFETY: openat succeeded: `fd` is open and owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Another descriptor for the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir(self.0.try_clone()?))
    }

    /// The subdirectory `name`, never through a link (ELOOP or ENOTDIR then).
    pub fn sub(&self, name: &OsStr) -> io::Result<Dir> {
        self.openat(name, libc::O_RDONLY | libc::O_DIRECTORY)
            .map(Dir)
    }

    /// The directory `rel` below this one, one component at a time, none a link.
    pub fn resolve(&self, rel: &Path) -> io::Result<Dir> {
        let mut dir = Dir(self.0.try_clone()?);
        for component in rel.components() {
            match component {
                Component::Normal(name) => dir = dir.sub(name)?,
                Component::CurDir => {}
                _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
            }
        }
        Ok(dir)
    }

    /// The regular file (or FIFO) `name` for reading, never through a link and never
    /// blocking on a FIFO's open.
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
        self.openat(name, flags).map(File::from)
    }

    /// A new file `name` (`O_EXCL`: never an existing file, nor a link) with `mode`.
    pub fn create_new(&self, name: &OsStr, mode: u32) -> io::Result<File> {
        let c_name = check_name(name)?;
        let flags =
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: `c_name` is NUL-terminated; the mode is a plain integer.
        let fd = check(unsafe {
            libc::openat(
                self.0.as_raw_fd(),
                c_name.as_ptr(),
                flags,
                mode as libc::c_uint,
            )
        })?;
        // SAFETY: openat succeeded: `fd` is open and owned by nobody else.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// `name` itself, whatever it is (a link included, not followed): an `O_PATH` descriptor.
    pub fn open_path(&self, name: &OsStr) -> io::Result<OwnedFd> {
        self.openat(name, libc::O_PATH)
    }

    /// Renames `from` to `to`, both in this directory.
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (from, to) = (check_name(from)?, check_name(to)?);
        let fd = self.0.as_raw_fd();
        // SAFETY: both names are NUL-terminated; our descriptor is open for the borrow.
        check(unsafe { libc::renameat(fd, from.as_ptr(), fd, to.as_ptr()) })?;
        Ok(())
    }

    /// Removes the file `name` of this directory (a link itself, never its target).
    pub fn unlink(&self, name: &OsStr) -> io::Result<()> {
        let c_name = check_name(name)?;
        // SAFETY: `c_name` is NUL-terminated; our descriptor is open for the borrow.
        check(unsafe { libc::unlinkat(self.0.as_raw_fd(), c_name.as_ptr(), 0) })?;
        Ok(())
    }

    /// What `name` is, not following it.
    pub fn kind_of(&self, name: &OsStr) -> io::Result<Kind> {
        let c_name = check_name(name)?;
        // SAFETY: stat is plain old data; all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `c_name` is NUL-terminated, `st` valid and writable, our descriptor open.
        check(unsafe {
            libc::fstatat(
                self.0.as_raw_fd(),
                c_name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })?;
        Ok(Kind::of_mode(st.st_mode))
    }

    /// This directory's device.
    pub fn dev(&self) -> io::Result<u64> {
        #[allow(clippy::unnecessary_cast)] // dev_t's width differs between targets
        Ok(stat_fd(self.0.as_raw_fd())?.st_dev as u64)
    }

    /// The filesystem type (`statfs.f_type`) this directory lives on.
    pub fn fs_type(&self) -> io::Result<i64> {
        // SAFETY: statfs is plain old data; all-zero bytes are a valid value.
        let mut info: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is valid and writable; our descriptor is open for the borrow.
        check(unsafe { libc::fstatfs(self.0.as_raw_fd(), &mut info) })?;
        #[allow(clippy::unnecessary_cast)] // f_type's integer type differs between targets
        Ok(info.f_type as i64)
    }

    /// Every entry but `.` and `..`, in the order the filesystem gives.
    pub fn entries(&self) -> io::Result<Vec<Entry>> {
        // fdopendir takes the descriptor over: hand it a duplicate, rewound.
        let dup = self.0.try_clone()?;
        // SAFETY: lseek has no memory effects; the duplicate shares our offset, reset here.
        check(unsafe { libc::lseek(dup.as_raw_fd(), 0, libc::SEEK_SET) } as libc::c_int)?;
        let raw = dup.as_raw_fd();
        // SAFETY: `raw` is an open directory descriptor; on success the stream owns it.
        let stream = unsafe { libc::fdopendir(raw) };
        if stream.is_null() {
            return Err(io::Error::last_os_error()); // `dup` still owns it and closes it
        }
        std::mem::forget(dup); // now the stream's, closed by closedir
        let mut entries = Vec::new();
        let result = loop {
            // SAFETY: errno is thread-local; clearing it tells the end from an error.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `stream` is a valid DIR* used by this thread only.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let err = io::Error::last_os_error();
                break if err.raw_os_error() == Some(0) {
                    Ok(())
                } else {
                    Err(err)
                };
            }
            // SAFETY: readdir returned a valid dirent, alive until the next readdir; d_name
            // is NUL-terminated.
            let (name, d_type) = unsafe {
                let entry = &*entry;
                (
                    CStr::from_ptr(entry.d_name.as_ptr()).to_bytes().to_vec(),
                    entry.d_type,
                )
            };
            if name == b"." || name == b".." {
                continue;
            }
            let name = OsString::from_vec(name);
            let kind = match d_type {
                libc::DT_REG => Kind::File,
                libc::DT_DIR => Kind::Dir,
                libc::DT_LNK => Kind::Symlink,
                libc::DT_UNKNOWN => match self.kind_of(&name) {
                    Ok(kind) => kind,
                    Err(_) => continue, // vanished meanwhile
                },
                _ => Kind::Other,
            };
            entries.push(Entry { name, kind });
        };
        // SAFETY: `stream` came from fdopendir and is closed exactly once.
        unsafe { libc::closedir(stream) };
        result.map(|()| entries)
    }
}

impl AsRawFd for Dir {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl From<OwnedFd> for Dir {
    /// A directory from an open descriptor (the caller checked it is one).
    fn from(fd: OwnedFd) -> Dir {
        Dir(fd)
    }
}

/// Changes the owner of what `fd` (an `O_PATH` descriptor or any other) refers to, never
/// following a link.
pub fn chown_fd(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let keep = u32::MAX; // -1: leave as is
    let (uid, gid) = (uid.unwrap_or(keep), gid.unwrap_or(keep));
    let empty = c"";
    // SAFETY: `empty` is NUL-terminated; AT_EMPTY_PATH makes fchownat act on `fd` itself.
    check(unsafe {
        libc::fchownat(
            fd,
            empty.as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// Changes the mode of what the `O_PATH` descriptor `fd` refers to, through its
/// `/proc/self/fd` entry (which names that very inode, whatever happens to its path).
pub fn chmod_fd(fd: RawFd, mode: u32) -> io::Result<()> {
    let magic = CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL in a number");
    // SAFETY: `magic` is NUL-terminated and outlives the call.
    check(unsafe { libc::chmod(magic.as_ptr(), mode as libc::mode_t) })?;
    Ok(())
}

/// `path` itself, whatever it is, not following its last component (the components before
/// it are followed: the caller named them): an `O_PATH` descriptor.
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c_path = c_name(path.as_os_str())?;
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `c_path` is NUL-terminated and outlives the call.
    let fd = check(unsafe { libc::open(c_path.as_ptr(), flags) })?;
    // SAFETY: open succeeded: `fd` is open and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Opens `path` (links followed: the caller named it) with `flags` plus `O_NONBLOCK`, so
/// that opening a FIFO or a device never waits (for a writer, a reader, a carrier). The
/// caller checks the kind of what it got. `mode` applies with `O_CREAT`.
pub fn open_nonblocking(path: &Path, flags: libc::c_int, mode: u32) -> io::Result<File> {
    let c_path = c_name(path.as_os_str())?;
    let flags = flags | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: `c_path` is NUL-terminated and outlives the call; the mode is a plain integer,
    // read only with O_CREAT.
    let fd = check(unsafe { libc::open(c_path.as_ptr(), flags, mode as libc::c_uint) })?;
    // SAFETY: open succeeded: `fd` is open and owned by nobody else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// The kind of what `fd` refers to.
pub fn kind_of_fd(fd: RawFd) -> io::Result<Kind> {
    Ok(Kind::of_mode(stat_fd(fd)?.st_mode))
}

/// Opens the directory an `O_PATH` descriptor refers to, for listing.
pub fn reopen_dir(fd: RawFd) -> io::Result<Dir> {
    let dot = c".";
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: `dot` is NUL-terminated; `fd` is open for the call.
    let dir = check(unsafe { libc::openat(fd, dot.as_ptr(), flags) })?;
    // SAFETY: openat succeeded: `dir` is open and owned by nobody else.
    Ok(Dir(unsafe { OwnedFd::from_raw_fd(dir) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_are_never_followed_below_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/f"), "x").unwrap();
        symlink(outside.path(), dir.path().join("out")).unwrap();
        symlink(dir.path().join("sub/f"), dir.path().join("lf")).unwrap();
        let root = Dir::open(dir.path()).unwrap();
        let mut names: Vec<(String, Kind)> = root
            .entries()
            .unwrap()
            .into_iter()
            .map(|e| (e.name.to_string_lossy().into_owned(), e.kind))
            .collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            names,
            [
                ("lf".into(), Kind::Symlink),
                ("out".into(), Kind::Symlink),
                ("sub".into(), Kind::Dir)
            ]
        );
        let err = |r: io::Result<Dir>| r.err().and_then(|e| e.raw_os_error());
        let refused = err(root.sub(OsStr::new("out")));
        assert!(
            matches!(refused, Some(libc::ELOOP | libc::ENOTDIR)),
            "{refused:?}"
        );
        assert!(root.open_file(OsStr::new("lf")).is_err());
        assert!(root.resolve(Path::new("sub")).is_ok());
        assert!(root.resolve(Path::new("out/x")).is_err());
        assert!(root.resolve(Path::new("../x")).is_err());
        assert!(root.sub(OsStr::new("a/b")).is_err());
        // Listing twice sees everything again.
        assert_eq!(root.entries().unwrap().len(), 3);
        let created = root.create_new(OsStr::new("new"), 0o600);
        assert!(created.is_ok());
        assert!(
            root.create_new(OsStr::new("lf"), 0o600).is_err(),
            "never through a link"
        );
        root.rename(OsStr::new("new"), OsStr::new("renamed"))
            .unwrap();
        root.unlink(OsStr::new("renamed")).unwrap();
        root.unlink(OsStr::new("lf")).unwrap();
        assert!(
            dir.path().join("sub/f").exists(),
            "a link is removed, not its target"
        );
    }
}
