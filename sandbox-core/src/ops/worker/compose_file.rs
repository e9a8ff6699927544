//! What the adapter reads of iii Compose's own files: the `path://` workers a Compose file
//! (`worker-compose.yaml`) declares, and whether each one's manifest (`iii.worker.yaml`)
//! names a `runtime.base_image`, which makes it a worker VM whose directory is a host root.
//!
//! Read leniently: Compose validates its file, the adapter only looks for what it needs.
//! Unknown keys, entries that are not `path://` workers and manifests without a base image
//! are passed over; only a file that is not YAML at all (or whose `containers` is not a
//! mapping) is an error, and the caller then admits no declared directory. Both shapes of
//! the file are read: `containers:` at the top (Compose's v1 file) and
//! `stacks: {<name>: {containers: ...}}` (later versions).
//!
//! YAML is read with `yaml-rust2` (pure Rust, maintained). Its loader expands aliases by
//! copying, so every document first goes through a counting pass that refuses one whose
//! aliases would expand past [`MAX_NODES`] (a "billion laughs" file), and files over
//! [`MAX_FILE_BYTES`] are not read.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::Marker;
use yaml_rust2::{Yaml, YamlLoader};

/// The Compose file's name in its directory (iii Compose's `DEFAULT_COMPOSE_FILE`).
pub const DEFAULT_COMPOSE_FILE: &str = "worker-compose.yaml";
/// A worker directory's manifest.
pub const WORKER_MANIFEST: &str = "iii.worker.yaml";
/// Bigger Compose files or manifests are not read (Compose's own files are a few KiB).
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// A document whose nodes, aliases expanded, exceed this is refused.
pub const MAX_NODES: u64 = 100_000;
/// Deeper documents are refused (no Compose file nests more than a few levels).
const MAX_DEPTH: usize = 64;

/// One `path://` worker of a Compose file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredWorker {
    /// The container's key in the file.
    pub name: String,
    /// `path://DIR` resolved against the file's directory (`.` components dropped, `..`
    /// kept: symlinks decide what it means, and the roots canonicalise it).
    pub dir: PathBuf,
}

/// The `path://` workers `text` declares, in file order; `base_dir` is the directory
/// relative paths resolve against (the Compose file's). An error is the reason the text is
/// not a Compose file we can read.
pub fn declared_path_workers(text: &str, base_dir: &Path) -> Result<Vec<DeclaredWorker>, String> {
    let document = load(text)?;
    let mut workers = Vec::new();
    let mut add = |containers: &Yaml, stack: Option<&str>| -> Result<(), String> {
        let entries = match containers {
            Yaml::Hash(entries) => entries,
            Yaml::Null | Yaml::BadValue => return Ok(()),
            _ => {
                let place = stack.map_or(String::new(), |s| format!(" of stack `{s}`"));
                return Err(format!("`containers`{place} is not a mapping"));
            }
        };
        for (key, entry) in entries {
            let Some(name) = scalar_text(key) else {
                continue;
            };
            let Some(source) = entry["worker"].as_str() else {
                continue;
            };
            let Some(dir) = source.strip_prefix("path://") else {
                continue; // package://, catalog://: no directory on this host to admit
            };
            if dir.is_empty() {
                continue;
            }
            if dir.contains("${") {
                // Compose expands `${VAR}` from its own environment, which is not ours.
                tracing::warn!(
                    container = %name,
                    "a Compose file's path:// worker uses ${{...}} interpolation: not admitted \
                     as a host root (set III_COMPOSE_WORKER_DIRS)"
                );
                continue;
            }
            workers.push(DeclaredWorker {
                name,
                dir: resolve(base_dir, Path::new(dir)),
            });
        }
        Ok(())
    };
    add(&document["containers"], None)?;
    match &document["stacks"] {
        Yaml::Hash(stacks) => {
            for (name, stack) in stacks {
                let name = scalar_text(name).unwrap_or_default();
                add(&stack["containers"], Some(&name))?;
            }
        }
        Yaml::Null | Yaml::BadValue => {}
        _ => return Err("`stacks` is not a mapping".into()),
    }
    if !matches!(document, Yaml::Hash(_) | Yaml::Null | Yaml::BadValue) {
        return Err("the document is not a mapping".into());
    }
    Ok(workers)
}

/// The `runtime.base_image` of the manifest in `dir`, if it names one (a non-empty string);
/// `Ok(None)` when there is no manifest or it names none.
pub fn manifest_base_image(dir: &Path) -> Result<Option<String>, String> {
    let path = dir.join(WORKER_MANIFEST);
    let text = match read_limited(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let document = load(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(document["runtime"]["base_image"]
        .as_str()
        .map(str::trim)
        .filter(|image| !image.is_empty())
        .map(String::from))
}

/// The directories of the workers that the Compose file at `file` declares with a manifest
/// naming `runtime.base_image`: the worker VMs' directories, to be host roots. A missing
/// file declares nothing; one that cannot be read or parsed is logged with its reason and
/// declares nothing either (Compose validates its file, the adapter still starts).
pub fn worker_vm_dirs(file: &Path) -> Vec<PathBuf> {
    let text = match read_limited(file) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(file = %file.display(), "no Compose file: no declared worker directories");
            return Vec::new();
        }
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cannot read the Compose file: no declared worker directory is a host root");
            return Vec::new();
        }
    };
    // Relative paths resolve against the file's own directory, links resolved (as Compose
    // canonicalises the file's path before it reads it).
    let base = file
        .canonicalize()
        .ok()
        .and_then(|f| f.parent().map(Path::to_path_buf))
        .or_else(|| file.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let declared = match declared_path_workers(&text, &base) {
        Ok(declared) => declared,
        Err(reason) => {
            tracing::warn!(file = %file.display(), %reason, "the Compose file does not parse: no declared worker directory is a host root");
            return Vec::new();
        }
    };
    let mut dirs = Vec::new();
    for worker in declared {
        match manifest_base_image(&worker.dir) {
            Ok(Some(image)) => {
                tracing::info!(container = %worker.name, dir = %worker.dir.display(), %image, "declared worker VM directory: a host root");
                dirs.push(worker.dir);
            }
            Ok(None) => {
                tracing::debug!(container = %worker.name, dir = %worker.dir.display(), "declared path:// worker without runtime.base_image: not a host root of its own");
            }
            Err(reason) => {
                tracing::warn!(container = %worker.name, %reason, "a declared worker's manifest does not parse: not a host root of its own");
            }
        }
    }
    dirs
}

/// Reads a file of at most [`MAX_FILE_BYTES`] as UTF-8.
fn read_limited(path: &Path) -> std::io::Result<String> {
    let file = std::fs::File::open(path)?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "larger than {MAX_FILE_BYTES} bytes"
        )));
    }
    Ok(text)
}

/// The first YAML document of `text` (`Null` for an empty text), after checking that it
/// stays within [`MAX_NODES`] and [`MAX_DEPTH`].
fn load(text: &str) -> Result<Yaml, String> {
    let mut budget = Budget::default();
    Parser::new_from_str(text)
        .load(&mut budget, true)
        .map_err(|e| e.to_string())?;
    if let Some(error) = budget.error {
        return Err(error);
    }
    let mut documents = YamlLoader::load_from_str(text).map_err(|e| e.to_string())?;
    Ok(if documents.is_empty() {
        Yaml::Null
    } else {
        documents.swap_remove(0)
    })
}

/// Counts the nodes a document would have once its aliases are expanded, without building
/// it; notes the first limit crossed.
#[derive(Default)]
struct Budget {
    /// Node counts of the collections being read, innermost last, with their anchors.
    open: Vec<(usize, u64)>,
    anchors: HashMap<usize, u64>,
    total: u64,
    error: Option<String>,
}

impl Budget {
    fn add(&mut self, anchor: usize, nodes: u64) {
        if anchor > 0 {
            self.anchors.insert(anchor, nodes);
        }
        match self.open.last_mut() {
            Some((_, parent)) => *parent = parent.saturating_add(nodes),
            None => self.total = self.total.saturating_add(nodes),
        }
        let pending: u64 = self.open.iter().map(|(_, n)| *n).sum();
        if self.error.is_none() && self.total.saturating_add(pending) > MAX_NODES {
            self.error = Some(format!(
                "more than {MAX_NODES} nodes once aliases are expanded"
            ));
        }
    }
}

impl MarkedEventReceiver for Budget {
    fn on_event(&mut self, event: Event, _mark: Marker) {
        match event {
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                self.open.push((anchor, 1));
                if self.error.is_none() && self.open.len() > MAX_DEPTH {
                    self.error = Some(format!("nested deeper than {MAX_DEPTH} levels"));
                }
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((anchor, nodes)) = self.open.pop() {
                    self.add(anchor, nodes);
                }
            }
            Event::Scalar(_, _, anchor, _) => self.add(anchor, 1),
            Event::Alias(anchor) => {
                let nodes = self.anchors.get(&anchor).copied().unwrap_or(1);
                self.add(0, nodes);
            }
            _ => {}
        }
    }
}

/// A mapping key as text (YAML keys may be numbers or booleans).
fn scalar_text(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(s) | Yaml::Real(s) => Some(s.clone()),
        Yaml::Integer(i) => Some(i.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `path` against `base` unless absolute, without its `.` components.
fn resolve(base: &Path, path: &Path) -> PathBuf {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        base.join(path)
    };
    joined
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_and_dirs(text: &str) -> Vec<(String, PathBuf)> {
        declared_path_workers(text, Path::new("/p/compose"))
            .unwrap()
            .into_iter()
            .map(|w| (w.name, w.dir))
            .collect()
    }

    #[test]
    fn path_workers_of_both_shapes_resolve_against_the_file_directory() {
        let v1 = "\
namespace: demo
unknown_key: {whatever: [1, 2]}
containers:
  app:
    worker: path://./app
    depends_on: [db]
    scripts: {run: python main.py}
  shared: {worker: 'path://../shared'}
  here: {worker: path://.}
  abs: {worker: path:///srv/abs/./w}
  db: {worker: package://api.workers.iii.dev/db, version: 1.0.0}
  cat: {worker: catalog://x}
  empty: {worker: 'path://'}
  nothing: {}
  7: {worker: path://seven}
";
        assert_eq!(
            names_and_dirs(v1),
            vec![
                ("app".into(), PathBuf::from("/p/compose/app")),
                ("shared".into(), PathBuf::from("/p/compose/../shared")),
                ("here".into(), PathBuf::from("/p/compose")),
                ("abs".into(), PathBuf::from("/srv/abs/w")),
                ("7".into(), PathBuf::from("/p/compose/seven")),
            ]
        );
        let stacks = "\
workers: {}
stacks:
  default:
    namespace: app
    containers:
      api: {worker: path://api, start_after: []}
  other:
    namespace: b
    containers:
      ui: {worker: path://./ui}
";
        assert_eq!(
            names_and_dirs(stacks),
            vec![
                ("api".into(), PathBuf::from("/p/compose/api")),
                ("ui".into(), PathBuf::from("/p/compose/ui")),
            ]
        );
        assert_eq!(names_and_dirs(""), vec![]);
        assert_eq!(names_and_dirs("containers:\n"), vec![]);
        assert_eq!(
            names_and_dirs("containers: {x: {worker: 'path://${HOME}/w'}}"),
            vec![]
        );
    }

    #[test]
    fn text_that_is_not_a_compose_file_says_why() {
        for (text, reason) in [
            ("containers: [a, b]", "`containers` is not a mapping"),
            (
                "stacks: {s: {containers: 3}}",
                "`containers` of stack `s` is not a mapping",
            ),
            ("stacks: [1]", "`stacks` is not a mapping"),
            ("- a\n- b\n", "not a mapping"),
            ("containers: {a: 1, a: 2}", "duplicated key"),
            ("containers:\n  app: [\n", "while parsing"),
        ] {
            let error = declared_path_workers(text, Path::new("/p")).unwrap_err();
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn aliases_that_expand_past_the_budget_are_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..8 {
            let prev = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        text.push_str("containers: {app: {worker: path://app}}\n");
        let error = declared_path_workers(&text, Path::new("/p")).unwrap_err();
        assert!(error.contains("aliases"), "{error}");
        // A few honest aliases are fine.
        let text = "base: &w {worker: path://app}\ncontainers: {a: *w, b: *w}\n";
        assert_eq!(
            declared_path_workers(text, Path::new("/p")).unwrap().len(),
            2
        );
        let deep = format!("{}x{}", "[".repeat(100), "]".repeat(100));
        let error = declared_path_workers(&deep, Path::new("/p")).unwrap_err();
        assert!(error.contains("deeper"), "{error}");
    }

    #[test]
    fn a_manifest_names_a_base_image_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join(WORKER_MANIFEST);
        assert_eq!(manifest_base_image(dir.path()), Ok(None));
        for (text, expected) in [
            (
                "name: w\nruntime: {language: python, base_image: python}\n",
                Some("python"),
            ),
            ("runtime:\n  base_image: ' node '\n", Some("node")),
            ("runtime: {base_image: ''}\n", None),
            ("runtime: {base_image: 3}\n", None),
            ("runtime: {language: python}\nscripts: {start: x}\n", None),
            ("name: plain\n", None),
            ("", None),
        ] {
            std::fs::write(&manifest, text).unwrap();
            assert_eq!(
                manifest_base_image(dir.path()),
                Ok(expected.map(String::from)),
                "{text:?}"
            );
        }
        std::fs::write(&manifest, "runtime: [").unwrap();
        assert!(manifest_base_image(dir.path()).is_err());
        std::fs::write(&manifest, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
        let error = manifest_base_image(dir.path()).unwrap_err();
        assert!(error.contains("larger than"), "{error}");
    }
}
