//! A worker VM's state on disk: `<state_dir>/workers/<vm_id>/` holds `worker.json` (the
//! prepared spec, the last start's command and the last known state), `layer/` (the root
//! overlay's upper and work directories: persistent, so what the VM installs survives
//! restarts), `data/` (the guest's `/state`) and `logs/worker.log` (the program's output,
//! written by the adapter; no guest sees `logs/`). The worker token is never written here.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::SandboxError;

/// State of a worker VM as `worker::status` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerState {
    /// Prepared, never started.
    Prepared,
    /// Its program runs (or, on disk after an adapter died, should run again).
    Running,
    /// Stopped by `worker::stop`.
    Stopped,
    /// Its program ended by itself; `exit_code` says how.
    Exited,
    /// The VM did not boot, or died under its program.
    Failed,
}

/// `worker.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRecord {
    pub vm_id: String,
    pub image: String,
    /// As the caller gave it (checked against the roots again at each start).
    pub host_path: String,
    pub cpus: Option<u32>,
    pub memory_mb: Option<u32>,
    pub state: WorkerState,
    /// The last start's program, environment (already cleaned of the token) and directory:
    /// what a restart of the adapter runs again.
    #[serde(default)]
    pub command: Vec<String>,
    #[serde(default)]
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub started_at: Option<String>,
    pub exit_code: Option<i32>,
    /// Why the worker failed, when it did.
    pub error: Option<String>,
}

/// `vm_id`: chosen by the caller, `^[a-z0-9][a-z0-9_.-]{0,62}$`.
pub fn check_vm_id(vm_id: &str) -> Result<(), SandboxError> {
    let bytes = vm_id.as_bytes();
    let first_ok = bytes
        .first()
        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let rest_ok = bytes[1.min(bytes.len())..]
        .iter()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(b));
    if first_ok && rest_ok && bytes.len() <= 63 {
        return Ok(());
    }
    // Not echoed: a refused id may be anything a caller sent, a secret included.
    Err(SandboxError::InvalidRequest(format!(
        "`vm_id` ({} bytes) must match ^[a-z0-9][a-z0-9_.-]{{0,62}}$",
        vm_id.len()
    )))
}

/// The `workers/` directory and the layout of each worker's directory in it.
#[derive(Debug, Clone)]
pub struct WorkerDirs {
    root: PathBuf,
}

const RECORD_FILE: &str = "worker.json";

impl WorkerDirs {
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        let root = state_dir.join("workers");
        std::fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    pub fn dir(&self, vm_id: &str) -> PathBuf {
        self.root.join(vm_id)
    }

    pub fn layer(&self, vm_id: &str) -> PathBuf {
        self.dir(vm_id).join("layer")
    }

    pub fn data(&self, vm_id: &str) -> PathBuf {
        self.dir(vm_id).join("data")
    }

    pub fn logs(&self, vm_id: &str) -> PathBuf {
        self.dir(vm_id).join("logs")
    }

    pub fn log_file(&self, vm_id: &str) -> PathBuf {
        self.logs(vm_id).join("worker.log")
    }

    /// Creates the directories of a worker (kept if they exist).
    pub fn create(&self, vm_id: &str) -> io::Result<()> {
        for dir in [self.layer(vm_id), self.data(vm_id), self.logs(vm_id)] {
            std::fs::create_dir_all(dir)?;
        }
        Ok(())
    }

    pub fn load(&self, vm_id: &str) -> io::Result<Option<WorkerRecord>> {
        match std::fs::read(self.dir(vm_id).join(RECORD_FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes `worker.json` whole (a temporary file renamed over it), never half.
    pub fn save(&self, record: &WorkerRecord) -> io::Result<()> {
        let dir = self.dir(&record.vm_id);
        let json = serde_json::to_vec_pretty(record).map_err(io::Error::other)?;
        let temporary = dir.join(format!("{RECORD_FILE}.tmp"));
        // Owner-only (the guest environment may hold the project's other secrets), and always
        // a new file: a leftover would keep its old mode, a link would be written through.
        super::safe_fs::write_new(&temporary, &json)?;
        std::fs::rename(&temporary, dir.join(RECORD_FILE))
    }

    /// The ids of every worker with a record.
    pub fn ids(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str().map(String::from))
            .filter(|id| check_vm_id(id).is_ok() && self.dir(id).join(RECORD_FILE).is_file())
            .collect();
        ids.sort();
        ids
    }

    /// Deletes the worker's directory with `remove_tree` (the backend's: its guest wrote in
    /// it); `false` when there was none.
    pub fn remove(
        &self,
        vm_id: &str,
        remove_tree: impl FnOnce(&Path) -> io::Result<()>,
    ) -> io::Result<bool> {
        let dir = self.dir(vm_id);
        if !dir.exists() {
            return Ok(false);
        }
        remove_tree(&dir).map(|()| true)
    }
}

/// Now as RFC 3339 UTC with seconds (`2026-01-02T03:04:05Z`).
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

fn rfc3339(unix_secs: u64) -> String {
    let days = (unix_secs / 86_400) as i64;
    let secs = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_ids_follow_the_pattern() {
        for good in ["a", "0", "api-1", "w.x_y", &"a".repeat(63)] {
            assert!(check_vm_id(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "_a",
            "A",
            "a/b",
            "..",
            "a b",
            &"a".repeat(64),
            "é",
        ] {
            assert_eq!(check_vm_id(bad).unwrap_err().code(), "S001", "{bad}");
        }
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_767_323_045), "2026-01-02T03:04:05Z");
    }

    #[test]
    fn records_round_trip_and_are_listed() {
        let dir = tempfile::tempdir().unwrap();
        let dirs = WorkerDirs::open(dir.path()).unwrap();
        assert_eq!(dirs.load("w1").unwrap(), None);
        dirs.create("w1").unwrap();
        let record = WorkerRecord {
            vm_id: "w1".into(),
            image: "python".into(),
            host_path: "/p".into(),
            cpus: Some(1),
            memory_mb: None,
            state: WorkerState::Prepared,
            command: vec!["x".into()],
            env: vec![("A".into(), "1".into())],
            workdir: None,
            started_at: None,
            exit_code: None,
            error: None,
        };
        dirs.save(&record).unwrap();
        assert_eq!(dirs.load("w1").unwrap(), Some(record));
        let mode = std::fs::metadata(dirs.dir("w1").join(RECORD_FILE))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        assert_eq!(dirs.ids(), vec!["w1".to_string()]);
        let remove = crate::remove_tree::remove_tree;
        assert!(dirs.remove("w1", remove).unwrap());
        assert!(!dirs.remove("w1", remove).unwrap());
    }
}
