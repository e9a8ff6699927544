//! Filesystem messages: one request per SPEC `fs::*` row, results in the SPEC's shapes.
//! File bytes never travel inside JSON: a write's body and a read's result are raw
//! `Data` frames with the request's id.

use serde::{Deserialize, Serialize};

/// A filesystem operation (frame `FsRequest`). Paths are absolute paths of the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FsRequest {
    Ls {
        path: String,
    },
    Stat {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
        parents: bool,
    },
    /// Body: the `data` field, sent as `Data` frames (not in the JSON).
    Write {
        path: String,
        mode: u32,
        parents: bool,
        append: bool,
        #[serde(skip)]
        data: Vec<u8>,
    },
    /// Reads at most `max_bytes` from `offset`; the host pages through large files.
    Read {
        path: String,
        offset: u64,
        max_bytes: u64,
    },
    Rm {
        path: String,
        recursive: bool,
    },
    Chmod {
        path: String,
        mode: u32,
        uid: Option<u32>,
        gid: Option<u32>,
        recursive: bool,
    },
    Mv {
        src: String,
        dst: String,
        overwrite: bool,
    },
    /// Lines of regular files matching `pattern` (see `GREP_*` for the bounds). Globs without
    /// `/` match a file's name, globs with `/` its path relative to `path`; `exclude_glob`
    /// also prunes directories. `path` itself may be a file or a link; links met while
    /// walking are never followed.
    Grep {
        path: String,
        pattern: String,
        recursive: bool,
        ignore_case: bool,
        include_glob: Vec<String>,
        exclude_glob: Vec<String>,
        max_matches: u64,
        max_line_bytes: u64,
    },
    /// Replaces `pattern` in each file of `target`, every file rewritten atomically. With
    /// `regex`, `replacement` uses the regex crate's `$1` / `${name}` syntax; without it both
    /// are literal. `recursive` and the globs only filter a `Tree` walk.
    Sed {
        target: SedTarget,
        pattern: String,
        replacement: String,
        regex: bool,
        first_only: bool,
        ignore_case: bool,
        recursive: bool,
        include_glob: Vec<String>,
        exclude_glob: Vec<String>,
    },
}

/// What `fs::sed` rewrites: the files named, or the files under (or at) a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SedTarget {
    Files(Vec<String>),
    Tree(String),
}

/// `fs::grep`'s default and largest `max_matches`.
pub const GREP_DEFAULT_MATCHES: u64 = 10_000;
pub const GREP_MAX_MATCHES: u64 = 100_000;
/// `fs::grep`'s default and largest `max_line_bytes`.
pub const GREP_DEFAULT_LINE_BYTES: u64 = 4096;
pub const GREP_MAX_LINE_BYTES: u64 = 65_536;
/// Longest `fs::sed` replacement: every match writes it out, so it bounds how fast a result
/// grows (a result over `SED_MAX_FILE_BYTES` fails that file).
pub const SED_MAX_REPLACEMENT_BYTES: usize = 64 * 1024;
/// Largest file `fs::sed` rewrites, before and after the edit: the agent holds the file in
/// memory while it writes the result out.
pub const SED_MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Every fs request ends within this time in the agent: past it the agent answers S216 (the
/// work is cancelled at its next check), and the host stops waiting a little later.
pub const FS_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Most files one `fs::sed` call may rewrite (named or found by its walk): every file gets a
/// result, and all results travel in one frame.
pub const SED_MAX_FILES: usize = 4_000;

/// One `fs::grep` hit: `line` counts from 1, `content` is the line without its newline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    pub path: String,
    pub line: u64,
    pub content: String,
}

/// One file's outcome in `fs::sed`; `error` is set exactly when `success` is false.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SedFileResult {
    pub path: String,
    pub replacements: u64,
    pub success: bool,
    pub error: Option<String>,
}

/// One directory entry, as `fs::ls` and `fs::stat` report it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEntry {
    pub name: String,
    pub is_dir: bool,
    pub is_symlink: bool,
    pub size: u64,
    /// Permission bits (and setuid/setgid/sticky), e.g. 0o755.
    pub mode: u32,
    /// Seconds since the Unix epoch.
    pub mtime: i64,
}

impl FsEntry {
    /// The SPEC's rendering of `mode`: four octal digits, e.g. "0755".
    pub fn mode_octal(&self) -> String {
        format!("{:04o}", self.mode & 0o7777)
    }
}

/// A successful result (frame `FsResponse`, `ok` arm).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum FsResponse {
    Entries {
        entries: Vec<FsEntry>,
    },
    Entry {
        entry: FsEntry,
    },
    Created {
        created: bool,
    },
    Written {
        bytes_written: u64,
        path: String,
    },
    /// `data` arrives as `Data` frames before the response.
    Read {
        size: u64,
        mode: u32,
        mtime: i64,
        #[serde(skip)]
        data: Vec<u8>,
    },
    Removed {
        removed: bool,
    },
    Updated {
        updated: u64,
    },
    Moved {
        moved: bool,
    },
    /// `truncated`: more matches exist than were sent (`max_matches` or the frame size).
    Matches {
        matches: Vec<GrepMatch>,
        truncated: bool,
    },
    Replaced {
        results: Vec<SedFileResult>,
        total_replacements: u64,
    },
}

/// SPEC section 4's S210..S219.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsErrorCode {
    BadRequest,
    NotFound,
    WrongType,
    Exists,
    NotEmpty,
    Permission,
    Io,
    BadRegex,
    StreamAborted,
    Unsupported,
}

impl FsErrorCode {
    /// The S-code the adapter reports for this failure.
    pub fn s_code(self) -> &'static str {
        match self {
            FsErrorCode::BadRequest => "S210",
            FsErrorCode::NotFound => "S211",
            FsErrorCode::WrongType => "S212",
            FsErrorCode::Exists => "S213",
            FsErrorCode::NotEmpty => "S214",
            FsErrorCode::Permission => "S215",
            FsErrorCode::Io => "S216",
            FsErrorCode::BadRegex => "S217",
            FsErrorCode::StreamAborted => "S218",
            FsErrorCode::Unsupported => "S219",
        }
    }
}

/// A failed filesystem operation (frame `FsResponse`, `err` arm).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{} {message}", code.s_code())]
pub struct FsError {
    pub code: FsErrorCode,
    pub message: String,
}

impl FsError {
    pub fn new(code: FsErrorCode, message: impl Into<String>) -> FsError {
        FsError {
            code,
            message: message.into(),
        }
    }
}

/// The `FsResponse` frame's payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsReply {
    Ok(FsResponse),
    Err(FsError),
}
