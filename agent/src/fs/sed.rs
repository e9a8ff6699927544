//! `fs::sed`: replaces a pattern in files, each rewritten atomically (a temporary file in the
//! same directory, then rename) with its mode and owner kept. The pattern runs over the whole
//! file with `^`/`$` matching at line boundaries, so it may span lines (`\n`). A file without
//! a match is not rewritten. Per-file failures go in that file's result, never fail the call.
//!
//! Choices: named files (`files[]`) are taken as given, and a symbolic link among them is a
//! per-file failure (rewriting it would replace the link by a file); a walk (`path`) skips
//! links and binary files (NUL in the first 8 KiB) and does not report them. A rename makes
//! a new inode: hard links to the old file keep the old content. Extended attributes are not
//! copied. Files over `SED_MAX_FILE_BYTES` are refused (the file is held in memory twice).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use agent_proto::fs::{SedFileResult, SedTarget, SED_MAX_FILES};
use agent_proto::{FsError, FsErrorCode, FsResponse};
use regex::bytes::Regex;

use super::grep::{is_binary, BINARY_PROBE};
use super::pattern::{self, Filter};
use super::walk;
use super::wire::{json_str_len, truncate_text, REPLY_BUDGET};

/// Largest file sed rewrites.
pub const SED_MAX_FILE_BYTES: u64 = 32 * 1024 * 1024;
/// Longest per-file error message, so that every result's size is known in advance.
const ERROR_MAX: usize = 120;
/// JSON of one result besides its path: the other fields and the longest error.
const RESULT_OVERHEAD: usize = 80 + ERROR_MAX + 2;

/// One `fs::sed` request, as the agent receives it.
pub struct Query<'a> {
    pub pattern: &'a str,
    pub replacement: &'a str,
    pub regex: bool,
    pub first_only: bool,
    pub ignore_case: bool,
    pub recursive: bool,
    pub include_glob: &'a [String],
    pub exclude_glob: &'a [String],
}

/// A compiled replacement.
pub struct Edit {
    regex: Regex,
    replacement: Vec<u8>,
    /// `$1` / `${name}` are expanded (regex mode); otherwise the replacement is literal.
    expand: bool,
    first_only: bool,
}

pub fn sed(target: &SedTarget, query: &Query) -> Result<FsResponse, FsError> {
    let edit = Edit::new(query)?;
    let (files, walked) = match target {
        SedTarget::Files(files) => (files.iter().map(PathBuf::from).collect(), false),
        SedTarget::Tree(root) => (walk_files(Path::new(root), query)?, true),
    };
    check_fits(&files)?;
    let mut results = Vec::with_capacity(files.len());
    let mut total = 0;
    for path in files {
        let shown = path.to_string_lossy().into_owned();
        let result = match rewrite(&path, &edit, walked) {
            Ok(None) => continue, // a binary file met by a walk
            Ok(Some(replacements)) => {
                total += replacements;
                SedFileResult {
                    path: shown,
                    replacements,
                    success: true,
                    error: None,
                }
            }
            Err(error) => SedFileResult {
                path: shown,
                replacements: 0,
                success: false,
                error: Some(truncate_text(error, ERROR_MAX)),
            },
        };
        results.push(result);
    }
    Ok(FsResponse::Replaced {
        results,
        total_replacements: total,
    })
}

impl Edit {
    pub fn new(query: &Query) -> Result<Edit, FsError> {
        Ok(Edit {
            regex: pattern::regex(query.pattern, !query.regex, query.ignore_case, true)?,
            replacement: query.replacement.as_bytes().to_vec(),
            expand: query.regex,
            first_only: query.first_only,
        })
    }

    /// The edited bytes and the number of replacements; `None` when nothing matched.
    pub fn apply(&self, data: &[u8]) -> Option<(Vec<u8>, u64)> {
        let mut out = Vec::new();
        let mut last = 0;
        let mut count = 0u64;
        for caps in self.regex.captures_iter(data) {
            let Some(found) = caps.get(0) else { continue };
            out.extend_from_slice(&data[last..found.start()]);
            if self.expand {
                caps.expand(&self.replacement, &mut out);
            } else {
                out.extend_from_slice(&self.replacement);
            }
            last = found.end();
            count += 1;
            if self.first_only {
                break;
            }
        }
        if count == 0 {
            return None;
        }
        out.extend_from_slice(&data[last..]);
        Some((out, count))
    }
}

/// The files a `path` walk finds; more than `SED_MAX_FILES` is refused before any change.
fn walk_files(root: &Path, query: &Query) -> Result<Vec<PathBuf>, FsError> {
    let filter = Filter::new(query.include_glob, query.exclude_glob)?;
    let mut files = Vec::new();
    walk::files(root, query.recursive, &filter, &mut |path| {
        files.push(path.to_path_buf());
        if files.len() > SED_MAX_FILES {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })?;
    Ok(files)
}

/// All results must fit one reply frame: refuse up front rather than after rewriting.
fn check_fits(files: &[PathBuf]) -> Result<(), FsError> {
    let size: usize = files
        .iter()
        .map(|p| json_str_len(&p.to_string_lossy()) + RESULT_OVERHEAD)
        .sum();
    if files.len() > SED_MAX_FILES || size > REPLY_BUDGET {
        return Err(FsError::new(
            FsErrorCode::BadRequest,
            format!(
                "too many files for one fs::sed call (at most {SED_MAX_FILES}, and their \
                 results must fit 1 MiB): narrow it with include_glob / exclude_glob"
            ),
        ));
    }
    Ok(())
}

/// Rewrites one file: `Ok(Some(n))` replacements made (0: left untouched), `Ok(None)` a
/// binary file skipped (only when `skip_binary`), `Err` the reason it failed.
fn rewrite(path: &Path, edit: &Edit, skip_binary: bool) -> Result<Option<u64>, String> {
    if !path.is_absolute() {
        return Err("expected an absolute path".into());
    }
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => "is a symbolic link: name its target".to_string(),
            _ => e.to_string(),
        })?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > SED_MAX_FILE_BYTES {
        return Err(format!(
            "larger than {} MiB: edit it with exec",
            SED_MAX_FILE_BYTES >> 20
        ));
    }
    let mut data = Vec::new();
    (&mut file)
        .take(SED_MAX_FILE_BYTES + 1)
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    if data.len() as u64 > SED_MAX_FILE_BYTES {
        return Err("grew too large while being read".into());
    }
    if skip_binary && is_binary(&data[..data.len().min(BINARY_PROBE)]) {
        return Ok(None);
    }
    let Some((edited, count)) = edit.apply(&data) else {
        return Ok(Some(0));
    };
    replace_atomically(path, &edited, &meta).map_err(|e| e.to_string())?;
    Ok(Some(count))
}

/// Distinguishes temporary files of concurrent calls.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Writes `data` to a temporary file beside `path` with `meta`'s mode and owner, then renames
/// it over `path`: readers see the old file or the new one, never a mix.
fn replace_atomically(path: &Path, data: &[u8], meta: &std::fs::Metadata) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let temp = dir.join(format!(".sed-{}-{n}.tmp", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&temp)?;
    let written = fill(&mut file, data, meta);
    let renamed = written.and_then(|()| std::fs::rename(&temp, path));
    if renamed.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    renamed
}

fn fill(file: &mut File, data: &[u8], meta: &std::fs::Metadata) -> std::io::Result<()> {
    file.write_all(data)?;
    let mine = file.metadata()?;
    if (mine.uid(), mine.gid()) != (meta.uid(), meta.gid()) {
        std::os::unix::fs::fchown(&*file, Some(meta.uid()), Some(meta.gid()))?;
    }
    // After chown, which clears setuid/setgid bits.
    file.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query<'a>(pattern: &'a str, replacement: &'a str) -> Query<'a> {
        Query {
            pattern,
            replacement,
            regex: true,
            first_only: false,
            ignore_case: false,
            recursive: true,
            include_glob: &[],
            exclude_glob: &[],
        }
    }

    fn edit(q: &Query, text: &str) -> Option<(String, u64)> {
        let (out, n) = Edit::new(q).unwrap().apply(text.as_bytes())?;
        Some((String::from_utf8(out).unwrap(), n))
    }

    #[test]
    fn regex_literal_first_only_and_case() {
        let q = query(r"(\w+)@(\w+)", "$2 at ${1}");
        assert_eq!(
            edit(&q, "a@b c@d").unwrap(),
            ("b at a d at c".to_string(), 2)
        );
        let mut literal = query("a.c", "$1");
        literal.regex = false;
        assert_eq!(
            edit(&literal, "abc a.c").unwrap(),
            ("abc $1".to_string(), 1)
        );
        let mut first = query("x", "y");
        first.first_only = true;
        assert_eq!(edit(&first, "x\nx\n").unwrap(), ("y\nx\n".to_string(), 1));
        let mut caseless = query("hello", "bye");
        caseless.ignore_case = true;
        assert_eq!(edit(&caseless, "HeLLo").unwrap(), ("bye".to_string(), 1));
        let lines = query("^#.*\n", "");
        assert_eq!(edit(&lines, "#a\nb\n#c\n").unwrap(), ("b\n".to_string(), 2));
        assert_eq!(edit(&query("zzz", "y"), "abc"), None);
        assert!(Edit::new(&query("(", "")).is_err());
    }

    fn results(response: FsResponse) -> (Vec<SedFileResult>, u64) {
        let FsResponse::Replaced {
            results,
            total_replacements,
        } = response
        else {
            panic!("{response:?}")
        };
        (results, total_replacements)
    }

    #[test]
    fn rewrites_atomically_keeping_mode_and_leaves_unmatched_files_alone() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        let other = dir.path().join("other.txt");
        std::fs::write(&script, "echo old; echo old\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o751)).unwrap();
        std::fs::write(&other, "nothing here\n").unwrap();
        // As root, give the file another owner so that keeping it is a real check.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&script, Some(1234), Some(2345)).unwrap();
        } else {
            eprintln!("not root: the owner kept by sed is only the test's own (not chowned)");
        }
        let before = std::fs::metadata(&script).unwrap();
        let other_inode = std::fs::metadata(&other).unwrap().ino();
        let target = SedTarget::Tree(dir.path().to_string_lossy().into_owned());
        let (rows, total) = results(sed(&target, &query("old", "new")).unwrap());
        assert_eq!(total, 2);
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.success && r.error.is_none()));
        assert_eq!(
            std::fs::read_to_string(&script).unwrap(),
            "echo new; echo new\n"
        );
        let after = std::fs::metadata(&script).unwrap();
        assert_eq!(after.mode() & 0o7777, 0o751);
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
        assert_ne!(after.ino(), before.ino(), "replaced by rename");
        assert_eq!(std::fs::metadata(&other).unwrap().ino(), other_inode);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn per_file_failures_do_not_fail_the_call() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good");
        std::fs::write(&good, "aaa").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let files = vec![
            good.to_string_lossy().into_owned(),
            dir.path().join("missing").to_string_lossy().into_owned(),
            link.to_string_lossy().into_owned(),
            dir.path().to_string_lossy().into_owned(),
            "relative".into(),
        ];
        let (rows, total) =
            results(sed(&SedTarget::Files(files.clone()), &query("a", "b")).unwrap());
        assert_eq!(total, 3);
        assert_eq!(std::fs::read_to_string(&good).unwrap(), "bbb");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        let paths: Vec<_> = rows.iter().map(|r| r.path.clone()).collect();
        assert_eq!(paths, files);
        assert!(rows[0].success);
        for row in &rows[1..] {
            assert!(!row.success && row.error.is_some(), "{row:?}");
            assert_eq!(row.replacements, 0);
        }
    }

    #[test]
    fn walks_skip_binary_files_and_links_and_refuse_huge_trees() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bin"), b"a\0a").unwrap();
        std::fs::write(dir.path().join("text"), "a").unwrap();
        std::os::unix::fs::symlink(dir.path().join("text"), dir.path().join("l")).unwrap();
        let target = SedTarget::Tree(dir.path().to_string_lossy().into_owned());
        let (rows, total) = results(sed(&target, &query("a", "b")).unwrap());
        assert_eq!((rows.len(), total), (1, 1));
        assert_eq!(std::fs::read(dir.path().join("bin")).unwrap(), b"a\0a");

        let many: Vec<String> = (0..=SED_MAX_FILES).map(|i| format!("/f{i}")).collect();
        let refused = sed(&SedTarget::Files(many), &query("a", "b")).unwrap_err();
        assert_eq!(refused.code, FsErrorCode::BadRequest);
        let missing = SedTarget::Tree(dir.path().join("nope").to_string_lossy().into_owned());
        assert_eq!(
            sed(&missing, &query("a", "b")).unwrap_err().code,
            FsErrorCode::NotFound
        );
    }
}
