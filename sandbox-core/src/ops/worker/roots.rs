//! Where `host_path` may point (SPEC.md section 6, "Host roots"), read once at start-up from
//! the environment Compose gives the adapter, and which file is the Compose file.

use std::path::{Path, PathBuf};

use crate::error::SandboxError;

/// The project's Compose directory.
pub const COMPOSE_DIR_ENV: &str = "III_COMPOSE_DIR";
/// Compose's state directory; its `packages/` is the package cache.
pub const COMPOSE_STATE_DIR_ENV: &str = "III_COMPOSE_STATE_DIR";
/// Colon-separated directories of the declared `path://` workers.
pub const WORKER_DIRS_ENV: &str = "III_COMPOSE_WORKER_DIRS";
/// The Compose file itself; default: the first of [`COMPOSE_FILE_NAMES`] in the Compose dir.
pub const COMPOSE_FILE_ENV: &str = "III_COMPOSE_FILE";
/// File names taken for the Compose file, directly in `$III_COMPOSE_DIR`, when
/// `$III_COMPOSE_FILE` is not set. Every one present is hidden.
pub const COMPOSE_FILE_NAMES: &[&str] = &[
    "iii.yaml",
    "iii.yml",
    "iii-compose.yaml",
    "iii-compose.yml",
    "compose.yaml",
];

/// The accepted roots and the files no guest may see.
#[derive(Debug, Clone, Default)]
pub struct HostRoots {
    roots: Vec<PathBuf>,
    hidden: Vec<PathBuf>,
}

impl HostRoots {
    /// Reads the roots from the process environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let home = var("HOME").map(PathBuf::from);
        Self::new(
            var(COMPOSE_DIR_ENV).map(PathBuf::from),
            var(COMPOSE_STATE_DIR_ENV).map(PathBuf::from),
            home.as_deref(),
            var(WORKER_DIRS_ENV)
                .map(|dirs| std::env::split_paths(&dirs).collect())
                .unwrap_or_default(),
            var(COMPOSE_FILE_ENV).map(PathBuf::from),
        )
    }

    /// Canonicalises every root that exists; relative or missing roots are dropped (nothing
    /// can be under a directory that is not there).
    pub fn new(
        compose_dir: Option<PathBuf>,
        compose_state_dir: Option<PathBuf>,
        home: Option<&Path>,
        worker_dirs: Vec<PathBuf>,
        compose_file: Option<PathBuf>,
    ) -> Self {
        let packages = compose_state_dir
            .map(|dir| dir.join("packages"))
            .or_else(|| home.map(|h| h.join(".iii/compose/packages")));
        let roots = compose_dir
            .iter()
            .chain(packages.iter())
            .chain(worker_dirs.iter())
            .filter(|p| p.is_absolute())
            .filter_map(|p| p.canonicalize().ok())
            .filter(|p| p.is_dir())
            .collect();
        let hidden = match (compose_file, &compose_dir) {
            (Some(file), _) => vec![file],
            (None, Some(dir)) => COMPOSE_FILE_NAMES.iter().map(|n| dir.join(n)).collect(),
            (None, None) => Vec::new(),
        };
        Self {
            roots,
            hidden: hidden.iter().flat_map(|p| hidden_names(p)).collect(),
        }
    }

    /// `host_path` with symlinks and `..` resolved, if it lies in a root; S501 otherwise
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
        if self.roots.iter().any(|root| resolved.starts_with(root)) {
            return Ok(resolved);
        }
        Err(SandboxError::HostPathOutside(format!(
            "host_path {host_path:?} (resolved to {}) is outside the allowed roots: {}",
            resolved.display(),
            self.describe()
        )))
    }

    /// Files no guest may see (canonical paths).
    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    fn describe(&self) -> String {
        let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
        roots.join(", ")
    }
}

/// The names under which `file` appears, if it exists: its own name in its (resolved)
/// directory, and, when it is a symlink, the file it points to.
fn hidden_names(file: &Path) -> Vec<PathBuf> {
    if file.symlink_metadata().is_err() {
        return Vec::new();
    }
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

    #[test]
    fn paths_under_a_root_pass_and_escapes_are_s501_naming_the_roots() {
        let base = tempfile::tempdir().unwrap();
        let compose = base.path().join("project");
        let other = base.path().join("elsewhere");
        std::fs::create_dir_all(compose.join("svc")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(compose.join("iii.yaml"), "x").unwrap();
        std::os::unix::fs::symlink(&other, compose.join("out")).unwrap();
        let roots = HostRoots::new(Some(compose.clone()), None, None, vec![], None);

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
        assert_eq!(
            roots.hidden(),
            &[compose.join("iii.yaml").canonicalize().unwrap()]
        );
    }

    #[test]
    fn without_roots_every_path_is_refused_naming_the_variables() {
        let dir = tempfile::tempdir().unwrap();
        let error = HostRoots::new(None, None, None, vec![], None)
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
        let roots = HostRoots::new(None, Some(state.clone()), None, vec![worker.clone()], None);
        assert!(roots
            .check(state.join("packages/p1").to_str().unwrap())
            .is_ok());
        assert!(roots.check(worker.to_str().unwrap()).is_ok());
        assert!(roots.check(state.to_str().unwrap()).is_err());
    }
}
