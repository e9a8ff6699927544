//! `fs::sed`: replaces a pattern in files, each rewritten atomically (a temporary file in the
//! same directory, then rename) with its mode and owner kept. The pattern runs over the whole
//! file with `^`/`$` matching at line boundaries, so it may span lines (`\n`). A file without
//! a match is not rewritten. Per-file failures go in that file's result, never fail the call.
//!
//! Choices: named files (`files[]`) are taken as given, and a symbolic link among them is a
//! per-file failure (rewriting it would replace the link by a file); a walk (`path`) skips
//! links and binary files (NUL in the first 8 KiB) and does not report them. A walked file
//! is read, and its temporary made and renamed, relative to its directory's descriptor,
//! reached from the root's one `O_NOFOLLOW` step at a time: a directory swapped for a link
//! between the walk and the rewrite fails that file and touches nothing outside `path`. A rename makes
//! a new inode: hard links to the old file keep the old content. Extended attributes are not
//! copied.
//!
//! Memory stays bounded whatever the request: the file is held once (at most
//! `SED_MAX_FILE_BYTES`, taken from the agent's buffer budget, waiting for room within the
//! call's deadline) while its result streams to the temporary file; a replacement is at most
//! `SED_MAX_REPLACEMENT_BYTES` (S210 past it) and a result past `SED_MAX_FILE_BYTES` fails
//! that file, leaving it as it was.

use std::ffi::{OsStr, OsString};
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use agent_proto::fs::{
    SedFileResult, SedTarget, SED_MAX_FILES, SED_MAX_FILE_BYTES, SED_MAX_REPLACEMENT_BYTES,
};
use agent_proto::{FsError, FsErrorCode, FsResponse};
use regex::bytes::Regex;

use super::at::Dir;
use super::budget;
use super::call::{self, Cancel};
use super::grep::{is_binary, BINARY_PROBE};
use super::pattern::{self, Filter};
use super::template::Template;
use super::walk;
use super::wire::{json_str_len, truncate_text, REPLY_BUDGET};

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
    /// `$1` / `${name}` are expanded (regex mode); otherwise the replacement is literal.
    replacement: Template,
    first_only: bool,
    cancel: Cancel,
}

pub fn sed(target: &SedTarget, query: &Query) -> Result<FsResponse, FsError> {
    sed_with(target, query, &mut || {})
}

/// One file to rewrite: named by the caller (its parent directory followed, the file itself
/// never), or met by a walk (below the walk's root, every step opened `O_NOFOLLOW` from it).
enum Place {
    Named(PathBuf),
    Walked(PathBuf),
}

/// [`sed`], with `between` run after the files are chosen and before any is rewritten (the
/// tests' hook for a tree changed meanwhile).
fn sed_with(
    target: &SedTarget,
    query: &Query,
    between: &mut dyn FnMut(),
) -> Result<FsResponse, FsError> {
    let edit = Edit::new(query)?;
    let (places, tree, walked) = match target {
        SedTarget::Files(files) => {
            let places = files
                .iter()
                .map(|f| Place::Named(PathBuf::from(f)))
                .collect();
            (places, None, false)
        }
        SedTarget::Tree(root) => {
            let root = Path::new(root);
            match walk::start(root)? {
                walk::Start::File => (vec![Place::Named(root.to_path_buf())], None, true),
                walk::Start::Dir(dir) => {
                    let places = walk_files(&dir, root, query)?;
                    (places, Some((dir, root)), true)
                }
            }
        }
    };
    let shown: Vec<PathBuf> = places
        .iter()
        .map(|place| match (place, &tree) {
            (Place::Walked(rel), Some((_, root))) => root.join(rel),
            (Place::Named(path) | Place::Walked(path), _) => path.clone(),
        })
        .collect();
    check_fits(&shown)?;
    between();
    let mut results = Vec::with_capacity(places.len());
    let mut total = 0;
    // The directory of the previous walked file: files come grouped by directory.
    let mut last_dir: Option<(PathBuf, Dir)> = None;
    for (place, shown) in places.iter().zip(shown) {
        edit.cancel.check()?;
        let shown = shown.to_string_lossy().into_owned();
        let outcome = match (place, &tree) {
            (Place::Walked(rel), Some((root_dir, _))) => {
                rewrite_walked(root_dir, rel, &mut last_dir, &edit)
            }
            (Place::Named(path) | Place::Walked(path), _) => rewrite_named(path, &edit, walked),
        };
        let result = match outcome {
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

/// A file the caller named: its directory as the path says, the file itself not followed.
fn rewrite_named(path: &Path, edit: &Edit, skip_binary: bool) -> Result<Option<u64>, String> {
    if !path.is_absolute() {
        return Err("expected an absolute path".into());
    }
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err("not a regular file".into());
    };
    let dir = Dir::open(parent).map_err(|e| e.to_string())?;
    rewrite(&dir, name, edit, skip_binary)
}

/// A file a walk met, `rel` below the walk's root: its directory is reached again from the
/// root's descriptor, one `O_NOFOLLOW` step at a time, so a directory on the way swapped for
/// a link since the walk fails this file instead of leading out of the tree.
fn rewrite_walked(
    root: &Dir,
    rel: &Path,
    last_dir: &mut Option<(PathBuf, Dir)>,
    edit: &Edit,
) -> Result<Option<u64>, String> {
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err("not a regular file".into());
    };
    if last_dir.as_ref().is_none_or(|(held, _)| held != parent) {
        let dir = root
            .resolve(parent)
            .map_err(|e| format!("a directory on its way changed since the walk ({e})"))?;
        *last_dir = Some((parent.to_path_buf(), dir));
    }
    let Some((_, dir)) = last_dir.as_ref() else {
        return Err("not a regular file".into());
    };
    rewrite(dir, name, edit, true)
}

/// Why an edit's result was not written.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("the result would be larger than {} MiB: edit it with exec", SED_MAX_FILE_BYTES >> 20)]
    TooLarge,
    #[error("{0}")]
    Write(#[from] std::io::Error),
}

impl Edit {
    pub fn new(query: &Query) -> Result<Edit, FsError> {
        if query.replacement.len() > SED_MAX_REPLACEMENT_BYTES {
            return Err(FsError::new(
                FsErrorCode::BadRequest,
                format!(
                    "`replacement` is {} bytes, over the most of {} KiB: write larger text \
                     with fs::write",
                    query.replacement.len(),
                    SED_MAX_REPLACEMENT_BYTES >> 10
                ),
            ));
        }
        let regex = pattern::regex(query.pattern, !query.regex, query.ignore_case, true)?;
        let replacement = if query.regex {
            Template::parse(query.replacement.as_bytes(), &regex)
        } else {
            Template::literal(query.replacement.as_bytes())
        };
        Ok(Edit {
            regex,
            replacement,
            first_only: query.first_only,
            cancel: call::current(),
        })
    }

    /// Writes the edited `data` to `out`, at most `cap` bytes of it; the number of
    /// replacements. Check [`Edit::matches`] first: without a match the result is `data`.
    pub fn apply_to(&self, data: &[u8], out: &mut dyn Write, cap: u64) -> Result<u64, ApplyError> {
        let mut written = 0u64;
        let mut put =
            |bytes: u64,
             out: &mut dyn Write,
             write: &dyn Fn(&mut dyn Write) -> std::io::Result<()>| {
                written += bytes;
                if written > cap {
                    return Err(ApplyError::TooLarge);
                }
                write(out)?;
                Ok(())
            };
        let mut last = 0;
        let mut count = 0u64;
        for caps in self.regex.captures_iter(data) {
            let Some(found) = caps.get(0) else { continue };
            let before = &data[last..found.start()];
            put(before.len() as u64, out, &|out| out.write_all(before))?;
            put(self.replacement.size(&caps), out, &|out| {
                self.replacement.write(&caps, out)
            })?;
            last = found.end();
            count += 1;
            if self.first_only {
                break;
            }
        }
        let rest = &data[last..];
        put(rest.len() as u64, out, &|out| out.write_all(rest))?;
        Ok(count)
    }

    pub fn matches(&self, data: &[u8]) -> bool {
        self.regex.is_match(data)
    }

    /// The edited bytes and the number of replacements; `None` when nothing matched.
    #[cfg(test)]
    pub fn apply(&self, data: &[u8]) -> Option<(Vec<u8>, u64)> {
        if !self.matches(data) {
            return None;
        }
        let mut out = Vec::new();
        let count = self.apply_to(data, &mut out, u64::MAX).ok()?;
        Some((out, count))
    }
}

/// The files a `path` walk finds, relative to its root; more than `SED_MAX_FILES` is refused
/// before any change.
fn walk_files(dir: &Dir, root: &Path, query: &Query) -> Result<Vec<Place>, FsError> {
    let filter = Filter::new(query.include_glob, query.exclude_glob)?;
    let mut files = Vec::new();
    walk::files(dir, root, query.recursive, &filter, &mut |found| {
        files.push(Place::Walked(found.rel.to_path_buf()));
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

/// Rewrites the file `name` of `dir`: `Ok(Some(n))` replacements made (0: left untouched),
/// `Ok(None)` a binary file skipped (only when `skip_binary`), `Err` the reason it failed.
fn rewrite(dir: &Dir, name: &OsStr, edit: &Edit, skip_binary: bool) -> Result<Option<u64>, String> {
    let mut file = dir.open_file(name).map_err(|e| match e.raw_os_error() {
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
    // Held while the file is in memory: waits for room other calls hold (the deadline
    // answers a call that waits too long).
    let Some(_room) = budget::take(meta.len() as usize, &edit.cancel) else {
        return Err("timed out waiting for memory".into());
    };
    let mut data = Vec::with_capacity(meta.len() as usize);
    (&mut file)
        .take(meta.len() + 1)
        .read_to_end(&mut data)
        .map_err(|e| e.to_string())?;
    if data.len() as u64 > meta.len() {
        return Err("grew while being read".into());
    }
    if skip_binary && is_binary(&data[..data.len().min(BINARY_PROBE)]) {
        return Ok(None);
    }
    if !edit.matches(&data) {
        return Ok(Some(0));
    }
    let count = replace_atomically(dir, name, &meta, &mut |out| {
        edit.apply_to(&data, out, SED_MAX_FILE_BYTES)
    })
    .map_err(|e| e.to_string())?;
    Ok(Some(count))
}

/// Distinguishes temporary files of concurrent calls.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A temporary file of `replace_atomically`, removed (from the directory it was made in)
/// unless it was renamed into place: on every failure, and on a panic.
struct Temp<'a> {
    dir: &'a Dir,
    name: OsString,
    renamed: bool,
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if !self.renamed {
            let _ = self.dir.unlink(&self.name);
        }
    }
}

/// Writes what `fill` produces to a temporary file beside `name` in `dir` with `meta`'s mode
/// and owner, then renames it over `name`: readers see the old file or the new one, never a
/// mix, and a failed `fill` leaves the old one. Both steps are relative to `dir`, so they
/// happen in the directory the file was read from.
fn replace_atomically<T>(
    dir: &Dir,
    name: &OsStr,
    meta: &std::fs::Metadata,
    fill: &mut dyn FnMut(&mut dyn Write) -> Result<T, ApplyError>,
) -> Result<T, ApplyError> {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut temp = Temp {
        dir,
        name: OsString::from(format!(".sed-{}-{n}.tmp", std::process::id())),
        renamed: false,
    };
    let file = dir.create_new(&temp.name, 0o600)?;
    let mut out = BufWriter::with_capacity(64 * 1024, file);
    let value = fill(&mut out)?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    finish(&file, meta)?;
    drop(file);
    dir.rename(&temp.name, name)?;
    temp.renamed = true;
    Ok(value)
}

/// The temporary's owner and mode as the old file's, and its bytes on disk.
fn finish(file: &std::fs::File, meta: &std::fs::Metadata) -> std::io::Result<()> {
    let mine = file.metadata()?;
    if (mine.uid(), mine.gid()) != (meta.uid(), meta.gid()) {
        std::os::unix::fs::fchown(file, Some(meta.uid()), Some(meta.gid()))?;
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

    #[test]
    fn replacements_and_results_are_bounded() {
        let most = "r".repeat(SED_MAX_REPLACEMENT_BYTES);
        assert!(Edit::new(&query("a", &most)).is_ok());
        let over = "r".repeat(SED_MAX_REPLACEMENT_BYTES + 1);
        let refused = Edit::new(&query("a", &over)).err().expect("refused");
        assert_eq!(refused.code, FsErrorCode::BadRequest);
        // A result past the cap stops being written at the cap, whatever the references.
        let references = "$1".repeat(1000);
        let edit = Edit::new(&query("(a+)", &references)).unwrap();
        let mut out = Vec::new();
        let failed = edit.apply_to(&[b'a'; 10_000], &mut out, 64 * 1024);
        assert!(matches!(failed, Err(ApplyError::TooLarge)), "{failed:?}");
        assert!(out.len() <= 64 * 1024, "{}", out.len());
        // The same edit in a file: it fails, and the file is left as it was.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "a".repeat(40_000)).unwrap();
        let bomb = query("(a+)", &references); // 40 MB of result
        let files = SedTarget::Files(vec![file.to_string_lossy().into_owned()]);
        let (rows, total) = results(sed(&files, &bomb).unwrap());
        assert_eq!(total, 0);
        assert!(!rows[0].success, "{rows:?}");
        assert!(
            rows[0].error.as_deref().unwrap_or("").contains("MiB"),
            "{rows:?}"
        );
        assert_eq!(std::fs::read(&file).unwrap(), "a".repeat(40_000).as_bytes());
        assert!(sed_files_under(dir.path()).is_empty(), "no temporary left");
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

    fn sed_files_under(dir: &Path) -> Vec<PathBuf> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if std::fs::symlink_metadata(&path).unwrap().is_dir() {
                found.extend(sed_files_under(&path));
            } else if path.to_string_lossy().contains(".sed-") {
                found.push(path);
            }
        }
        found
    }

    #[test]
    fn a_directory_swapped_for_a_link_after_the_walk_edits_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("x.txt"), "old").unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/x.txt"), "old").unwrap();
        std::fs::write(root.join("a.txt"), "old").unwrap();
        let target = SedTarget::Tree(root.to_string_lossy().into_owned());
        let (rows, total) = results(
            sed_with(&target, &query("old", "new"), &mut || {
                std::fs::rename(root.join("sub"), root.join("moved")).unwrap();
                std::os::unix::fs::symlink(outside.path(), root.join("sub")).unwrap();
            })
            .unwrap(),
        );
        assert_eq!(
            std::fs::read_to_string(outside.path().join("x.txt")).unwrap(),
            "old"
        );
        assert_eq!(
            std::fs::read_to_string(root.join("moved/x.txt")).unwrap(),
            "old"
        );
        assert_eq!(std::fs::read_to_string(root.join("a.txt")).unwrap(), "new");
        assert_eq!(total, 1, "{rows:?}");
        let failed: Vec<_> = rows.iter().filter(|r| !r.success).collect();
        assert_eq!(failed.len(), 1, "{rows:?}");
        assert!(failed[0].path.ends_with("sub/x.txt"), "{rows:?}");
        assert!(
            failed[0]
                .error
                .as_deref()
                .unwrap_or("")
                .contains("changed since the walk"),
            "{rows:?}"
        );
        assert!(sed_files_under(root).is_empty());
        assert!(sed_files_under(outside.path()).is_empty());
    }

    #[test]
    fn the_temporary_is_removed_when_the_rename_fails() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("taken")).unwrap();
        std::fs::write(dir.path().join("taken/inside"), "x").unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let meta = std::fs::metadata(dir.path().join("f")).unwrap();
        let opened = Dir::open(dir.path()).unwrap();
        // Renaming a file over a non-empty directory fails after the temporary is written.
        let failed = replace_atomically(&opened, OsStr::new("taken"), &meta, &mut |out| {
            out.write_all(b"new")?;
            Ok(())
        });
        assert!(failed.is_err());
        assert!(sed_files_under(dir.path()).is_empty(), "no temporary left");
    }
}
