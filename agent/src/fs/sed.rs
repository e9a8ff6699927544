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
//! copied. Files over `SED_MAX_FILE_BYTES` are refused (the file is held in memory twice).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use agent_proto::fs::{SedFileResult, SedTarget, SED_MAX_FILES};
use agent_proto::{FsError, FsErrorCode, FsResponse};
use regex::bytes::Regex;

use super::at::Dir;
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
    replace_atomically(dir, name, &edited, &meta).map_err(|e| e.to_string())?;
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

/// Writes `data` to a temporary file beside `name` in `dir` with `meta`'s mode and owner,
/// then renames it over `name`: readers see the old file or the new one, never a mix. Both
/// steps are relative to `dir`, so they happen in the directory the file was read from.
fn replace_atomically(
    dir: &Dir,
    name: &OsStr,
    data: &[u8],
    meta: &std::fs::Metadata,
) -> std::io::Result<()> {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut temp = Temp {
        dir,
        name: OsString::from(format!(".sed-{}-{n}.tmp", std::process::id())),
        renamed: false,
    };
    let mut file = dir.create_new(&temp.name, 0o600)?;
    fill(&mut file, data, meta)?;
    drop(file);
    dir.rename(&temp.name, name)?;
    temp.renamed = true;
    Ok(())
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
        let failed = replace_atomically(&opened, OsStr::new("taken"), b"new", &meta);
        assert!(failed.is_err());
        assert!(sed_files_under(dir.path()).is_empty(), "no temporary left");
    }
}
