//! Where `host_path` may point (SPEC.md section 6, "Host roots"), read once at start-up from
//! the environment Compose gives the adapter and from Compose's own file, and what no guest
//! may see (the Compose file, Compose's state directory), decided at each VM start.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::compose_file::{self, DEFAULT_COMPOSE_FILE};
use crate::error::SandboxError;

/// The project's Compose directory.
pub const COMPOSE_DIR_ENV: &str = "III_COMPOSE_DIR";
/// Compose's state directory; its `packages/` is the package cache.
pub const COMPOSE_STATE_DIR_ENV: &str = "III_COMPOSE_STATE_DIR";
/// Colon-separated directories of the declared `path://` workers: when set, it replaces
/// what the Compose file declares.
pub const WORKER_DIRS_ENV: &str = "III_COMPOSE_WORKER_DIRS";
/// The Compose file itself; default `worker-compose.yaml` in the Compose directory.
pub const COMPOSE_FILE_ENV: &str = "III_COMPOSE_FILE";
/// Names hidden directly in the Compose directory, whatever `$III_COMPOSE_FILE` says:
/// Compose's file name, and the names earlier versions of the adapter hid.
pub const COMPOSE_FILE_NAMES: &[&str] = &[
    DEFAULT_COMPOSE_FILE,
    "worker-compose.yml",
    "iii.yaml",
    "iii.yml",
    "iii-compose.yaml",
    "iii-compose.yml",
    "compose.yaml",
];
/// Compose's state directory inside the Compose directory (its project state and token).
pub const COMPOSE_STATE_DIR_NAME: &str = ".iii";

/// What the roots are made of (absolute paths; relative or missing ones are dropped).
#[derive(Debug, Clone, Default)]
pub struct RootSources {
    pub compose_dir: Option<PathBuf>,
    pub compose_state_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
    /// The declared worker VM directories (from the Compose file, or the override).
    pub worker_dirs: Vec<PathBuf>,
    /// The Compose file, when it is not `worker-compose.yaml` in the Compose directory.
    pub compose_file: Option<PathBuf>,
}

/// The accepted roots and the paths no guest may see.
#[derive(Debug, Clone, Default)]
pub struct HostRoots {
    roots: Vec<PathBuf>,
    /// The package cache (canonical), a root inside Compose's state directory maybe.
    packages: Option<PathBuf>,
    /// Hidden paths as configured, resolved (links, existence) each time they are asked for.
    hidden: Vec<PathBuf>,
}

impl HostRoots {
    /// Reads the roots from the process environment and the Compose file.
    pub fn from_env() -> Self {
        Self::from_vars(|name| std::env::var_os(name))
    }

    /// Reads the roots from `var` (the environment) and the Compose file it leads to:
    /// `$III_COMPOSE_FILE`, else `worker-compose.yaml` in `$III_COMPOSE_DIR`. The Compose
    /// directory is `$III_COMPOSE_DIR`, else the Compose file's directory.
    /// `$III_COMPOSE_WORKER_DIRS`, when set, replaces the directories the file declares.
    pub fn from_vars(var: impl Fn(&str) -> Option<OsString>) -> Self {
        let var = |name: &str| var(name).filter(|v| !v.is_empty());
        let named_file = var(COMPOSE_FILE_ENV).map(PathBuf::from);
        let compose_dir = var(COMPOSE_DIR_ENV).map(PathBuf::from).or_else(|| {
            named_file
                .as_ref()
                .filter(|f| f.is_absolute())
                .and_then(|f| f.parent().map(Path::to_path_buf))
        });
        let named_file = named_file.map(|file| match &compose_dir {
            Some(dir) if file.is_relative() => dir.join(file),
            _ => file,
        });
        let file = named_file
            .clone()
            .or_else(|| compose_dir.as_ref().map(|d| d.join(DEFAULT_COMPOSE_FILE)));
        let worker_dirs = match var(WORKER_DIRS_ENV) {
            Some(dirs) => {
                tracing::info!(
                    "{WORKER_DIRS_ENV} is set: it replaces the worker directories the Compose file declares"
                );
                std::env::split_paths(&dirs).collect()
            }
            None => file
                .as_deref()
                .filter(|f| f.is_absolute())
                .map(compose_file::worker_vm_dirs)
                .unwrap_or_default(),
        };
        let roots = Self::new(RootSources {
            compose_dir,
            compose_state_dir: var(COMPOSE_STATE_DIR_ENV).map(PathBuf::from),
            home: var("HOME").map(PathBuf::from),
            worker_dirs,
            compose_file: named_file,
        });
        tracing::info!(roots = %roots.describe(), "worker VM host roots");
        roots
    }

    /// Canonicalises every root that exists; relative or missing roots are dropped (nothing
    /// can be under a directory that is not there).
    pub fn new(sources: RootSources) -> Self {
        let canonical_dir = |p: &PathBuf| {
            Some(p)
                .filter(|p| p.is_absolute())
                .and_then(|p| p.canonicalize().ok())
                .filter(|p| p.is_dir())
        };
        let packages = sources
            .compose_state_dir
            .as_ref()
            .map(|dir| dir.join("packages"))
            .or_else(|| {
                sources
                    .home
                    .as_ref()
                    .map(|h| h.join(".iii/compose/packages"))
            });
        let mut roots: Vec<PathBuf> = Vec::new();
        for root in sources
            .compose_dir
            .iter()
            .chain(packages.iter())
            .chain(sources.worker_dirs.iter())
            .filter_map(canonical_dir)
        {
            if !roots.contains(&root) {
                roots.push(root);
            }
        }
        // A root inside another adds nothing (`path://./app` in the Compose directory).
        let all = roots.clone();
        roots.retain(|root| {
            !all.iter()
                .any(|other| other != root && root.starts_with(other))
        });
        let mut hidden: Vec<PathBuf> = sources.compose_file.into_iter().collect();
        if let Some(dir) = &sources.compose_dir {
            hidden.extend(COMPOSE_FILE_NAMES.iter().map(|n| dir.join(n)));
            hidden.push(dir.join(COMPOSE_STATE_DIR_NAME));
        }
        hidden.extend(sources.compose_state_dir);
        hidden.retain(|p| p.is_absolute());
        Self {
            roots,
            packages: packages.as_ref().and_then(canonical_dir),
            hidden,
        }
    }

    /// `host_path` with symlinks and `..` resolved, if it lies in a root and not in a hidden
    /// directory (Compose's state directory; its package cache excepted); S501 otherwise
    /// (also for a path that does not exist), naming the roots.
    pub fn check(&self, host_path: &str) -> Result<PathBuf, SandboxError> {
        if self.roots.is_empty() {
            return Err(SandboxError::HostPathOutside(format!(
                "host_path {host_path:?} refused: no host roots are configured (set \
                 {COMPOSE_DIR_ENV}, {COMPOSE_STATE_DIR_ENV} or {WORKER_DIRS_ENV})"
            )));
        }
        let path = Path::new(host_path);
        let resolved = if path.is_absolute() {
            path.canonicalize().ok()
        } else {
            None
        };
        let Some(resolved) = resolved.filter(|p| p.is_dir()) else {
            return Err(SandboxError::HostPathOutside(format!(
                "host_path {host_path:?} is not an existing absolute directory; allowed roots: {}",
                self.describe()
            )));
        };
        if !self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Err(SandboxError::HostPathOutside(format!(
                "host_path {host_path:?} (resolved to {}) is outside the allowed roots: {}",
                resolved.display(),
                self.describe()
            )));
        }
        let in_packages = self
            .packages
            .as_ref()
            .is_some_and(|p| resolved.starts_with(p));
        // A hidden directory holding a root of its own (a state directory set above the
        // Compose directory) would refuse that whole root: it only hides what is below it.
        let holds_a_root = |h: &PathBuf| {
            self.roots
                .iter()
                .any(|r| Some(r) != self.packages.as_ref() && r.starts_with(h))
        };
        if let Some(hidden) = self
            .hidden()
            .into_iter()
            .find(|h| resolved.starts_with(h) && !in_packages && !holds_a_root(h))
        {
            return Err(SandboxError::HostPathOutside(format!(
                "host_path {host_path:?} (resolved to {}) lies in {}, which no guest may see; \
                 allowed roots: {}",
                resolved.display(),
                hidden.display(),
                self.describe()
            )));
        }
        Ok(resolved)
    }

    /// Paths no guest may see, as they are now: each configured name in its (resolved)
    /// directory whether or not it exists yet, and what it points to when it is a link. Asked
    /// at each VM start, so a Compose file written after the adapter started is hidden too.
    pub fn hidden(&self) -> Vec<PathBuf> {
        let mut names = Vec::new();
        for path in &self.hidden {
            for name in hidden_names(path) {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names
    }

    /// The roots, canonical.
    pub fn roots(&self) -> &[PathBuf] {
        &self.roots
    }

    fn describe(&self) -> String {
        let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        roots.join(", ")
    }
}

/// The names under which `file` appears: its own name in its (resolved) directory, if that
/// directory exists, and, when it is a link, what it points to.
fn hidden_names(file: &Path) -> Vec<PathBuf> {
    let mut names = Vec::new();
    if let (Some(parent), Some(name)) = (file.parent(), file.file_name()) {
        if let Ok(parent) = parent.canonicalize() {
            names.push(parent.join(name));
        }
    }
    if let Ok(target) = file.canonicalize() {
        if !names.contains(&target) {
            names.push(target);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn compose_dir_only(dir: &Path) -> HostRoots {
        HostRoots::new(RootSources {
            compose_dir: Some(dir.to_path_buf()),
            ..RootSources::default()
        })
    }

    /// The roots `vars` lead to, the Compose file read as at start-up.
    fn from(vars: &[(&str, &Path)]) -> HostRoots {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_os_str().to_owned()))
            .collect();
        HostRoots::from_vars(|name| vars.get(name).cloned())
    }

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures/compose-project")
            .canonicalize()
            .unwrap()
    }

    #[test]
    fn paths_under_a_root_pass_and_escapes_are_s501_naming_the_roots() {
        let base = tempfile::tempdir().unwrap();
        let compose = base.path().join("project");
        let other = base.path().join("elsewhere");
        std::fs::create_dir_all(compose.join("svc")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(compose.join("iii.yaml"), "x").unwrap();
        std::os::unix::fs::symlink(&other, compose.join("out")).unwrap();
        let roots = compose_dir_only(&compose);

        let svc = compose.join("svc");
        assert_eq!(
            roots.check(svc.to_str().unwrap()).unwrap(),
            svc.canonicalize().unwrap()
        );
        assert!(roots.check(compose.to_str().unwrap()).is_ok());
        let root_name = compose.canonicalize().unwrap().display().to_string();
        for bad in [
            other.clone(),
            compose.join("svc/../../elsewhere"),
            compose.join("out"),
            compose.join("missing"),
            PathBuf::from("relative/dir"),
        ] {
            let error = roots.check(bad.to_str().unwrap()).unwrap_err();
            assert_eq!(error.code(), "S501", "{}", bad.display());
            assert!(error.to_string().contains(&root_name), "{error}");
        }
    }

    #[test]
    fn without_roots_every_path_is_refused_naming_the_variables() {
        let dir = tempfile::tempdir().unwrap();
        let error = HostRoots::default()
            .check(dir.path().to_str().unwrap())
            .unwrap_err();
        assert_eq!(error.code(), "S501");
        assert!(error.to_string().contains(COMPOSE_DIR_ENV), "{error}");
    }

    #[test]
    fn packages_and_worker_dirs_are_roots() {
        let base = tempfile::tempdir().unwrap();
        let state = base.path().join("state");
        let worker = base.path().join("w");
        std::fs::create_dir_all(state.join("packages/p1")).unwrap();
        std::fs::create_dir_all(&worker).unwrap();
        let roots = HostRoots::new(RootSources {
            compose_state_dir: Some(state.clone()),
            worker_dirs: vec![worker.clone()],
            ..RootSources::default()
        });
        assert!(roots
            .check(state.join("packages/p1").to_str().unwrap())
            .is_ok());
        assert!(roots.check(worker.to_str().unwrap()).is_ok());
        assert!(roots.check(state.to_str().unwrap()).is_err());
    }

    #[test]
    fn the_compose_file_declares_the_worker_vm_roots() {
        let fixture = fixture();
        let project = fixture.join("project");
        let roots = from(&[(COMPOSE_DIR_ENV, &project)]);
        // The Compose dir and ../shared (a manifest with runtime.base_image); ./app is one
        // too but lies in the Compose dir already; ./plain (no base image) is no root of its
        // own, nor ../bare (no manifest).
        assert_eq!(roots.roots(), &[project.clone(), fixture.join("shared")]);
        for ok in [
            fixture.join("shared"),
            project.join("app"),
            project.join("plain"),
        ] {
            assert!(
                roots.check(ok.to_str().unwrap()).is_ok(),
                "{}",
                ok.display()
            );
        }
        let error = roots
            .check(fixture.join("bare").to_str().unwrap())
            .unwrap_err();
        assert_eq!(error.code(), "S501");

        // The same file named by III_COMPOSE_FILE alone: its directory is the Compose dir.
        let by_file = from(&[(COMPOSE_FILE_ENV, &project.join("worker-compose.yaml"))]);
        assert_eq!(by_file.roots(), roots.roots());

        // III_COMPOSE_WORKER_DIRS replaces what the file declares.
        let replaced = from(&[
            (COMPOSE_DIR_ENV, &project),
            (WORKER_DIRS_ENV, &fixture.join("bare")),
        ]);
        assert_eq!(replaced.roots(), &[project.clone(), fixture.join("bare")]);
        assert!(replaced
            .check(fixture.join("shared").to_str().unwrap())
            .is_err());
    }

    #[test]
    fn a_compose_file_that_does_not_parse_adds_no_roots() {
        let base = tempfile::tempdir().unwrap();
        let project = base.path().join("project");
        let shared = base.path().join("shared");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::write(
            shared.join("iii.worker.yaml"),
            "runtime: {base_image: node}\n",
        )
        .unwrap();
        let file = project.join("worker-compose.yaml");
        std::fs::write(&file, "containers: {s: {worker: 'path://../shared'}}\n").unwrap();
        let roots = from(&[(COMPOSE_DIR_ENV, &project)]);
        assert_eq!(roots.roots().len(), 2);
        std::fs::write(&file, "containers: {s: {worker: 'path://../shared'}\n").unwrap();
        let roots = from(&[(COMPOSE_DIR_ENV, &project)]);
        assert_eq!(roots.roots(), &[project.canonicalize().unwrap()]);
        // A named file that is missing declares nothing either.
        let roots = from(&[
            (COMPOSE_DIR_ENV, &project),
            (COMPOSE_FILE_ENV, Path::new("other.yaml")),
        ]);
        assert_eq!(roots.roots().len(), 1);
    }

    #[test]
    fn hidden_paths_are_decided_when_asked_and_cover_files_written_later() {
        let base = tempfile::tempdir().unwrap();
        let compose = base.path().join("project");
        let state = base.path().join("state");
        std::fs::create_dir_all(&compose).unwrap();
        std::fs::create_dir_all(state.join("packages")).unwrap();
        let compose = compose.canonicalize().unwrap();
        let roots = HostRoots::new(RootSources {
            compose_dir: Some(compose.clone()),
            compose_state_dir: Some(state.clone()),
            compose_file: Some(compose.join("custom.yml")),
            ..RootSources::default()
        });
        let hidden = roots.hidden();
        for name in [
            "custom.yml",
            "worker-compose.yaml",
            "worker-compose.yml",
            "iii.yaml",
            "compose.yaml",
            ".iii",
        ] {
            assert!(hidden.contains(&compose.join(name)), "{name}: {hidden:?}");
        }
        assert!(
            hidden.contains(&state.canonicalize().unwrap()),
            "{hidden:?}"
        );

        // A Compose file that is a link, written after the roots were read: its target too.
        let secret = base.path().join("secret.yaml");
        std::fs::write(&secret, "token").unwrap();
        std::os::unix::fs::symlink(&secret, compose.join("worker-compose.yaml")).unwrap();
        assert!(roots.hidden().contains(&secret.canonicalize().unwrap()));
    }

    #[test]
    fn host_paths_inside_composes_state_directory_are_refused_but_its_packages() {
        let base = tempfile::tempdir().unwrap();
        let compose = base.path().join("project");
        std::fs::create_dir_all(compose.join(".iii/packages/p1")).unwrap();
        std::fs::create_dir_all(compose.join(".iii/run")).unwrap();
        let roots = HostRoots::new(RootSources {
            compose_dir: Some(compose.clone()),
            compose_state_dir: Some(compose.join(".iii")),
            ..RootSources::default()
        });
        for bad in [compose.join(".iii"), compose.join(".iii/run")] {
            let error = roots.check(bad.to_str().unwrap()).unwrap_err();
            assert_eq!(error.code(), "S501");
            assert!(error.to_string().contains("no guest may see"), "{error}");
        }
        assert!(roots
            .check(compose.join(".iii/packages/p1").to_str().unwrap())
            .is_ok());
        assert!(roots.check(compose.to_str().unwrap()).is_ok());

        // A state directory above the Compose directory does not refuse the project.
        let roots = HostRoots::new(RootSources {
            compose_dir: Some(compose.clone()),
            compose_state_dir: Some(base.path().to_path_buf()),
            ..RootSources::default()
        });
        assert!(roots
            .check(compose.join(".iii/run").to_str().unwrap())
            .is_err());
        assert!(roots.check(compose.to_str().unwrap()).is_ok());
    }
}
