//! Snapshots: named templates of a sandbox's files, kept on disk under
//! `<state_dir>/snapshots/` so they outlive the adapter:
//!
//! ```text
//! layers/<id>/        one captured writable layer, never written again once complete
//! layers/<id>.json    {"size_bytes": N}, written once the copy is complete
//! index/<name>.json   {name, image, image_digest, layers (top-most first), size_bytes, created_at}
//! ```
//!
//! A snapshot of a sandbox that itself came from a snapshot stacks the parent's layers under
//! its own, so a layer may serve several snapshots. A layer stays while a snapshot names it or
//! a live sandbox stacks it (a pin, held in memory: sandboxes do not outlive their adapter),
//! and is removed as soon as neither holds; `fork`'s layer is named by no snapshot, so it goes
//! with the last of its sandboxes. At start, every layer no snapshot names, and every layer
//! whose copy never completed, is removed.
//!
//! The budget (`max_snapshot_disk_mb`) counts every layer on disk once. Captures run one at a
//! time, each given what the budget has left, so two of them never overrun it together.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::error::SandboxError;

/// At most this many layers under a sandbox's own: overlayfs stacks many more, but each is a
/// lookup on every path miss.
pub const MAX_DEPTH: usize = 16;

/// What a snapshot is (its index file, and what `snapshot::list` shows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub name: String,
    pub image: String,
    /// The manifest the image was unpacked from when the snapshot was taken: a create from
    /// the snapshot over another version of the image is refused (S603).
    pub image_digest: String,
    /// Layer ids, the top-most first.
    pub layers: Vec<String>,
    /// What its layers hold together.
    pub size_bytes: u64,
    /// RFC 3339, UTC.
    pub created_at: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct LayerMeta {
    size_bytes: u64,
}

#[derive(Default)]
struct State {
    named: BTreeMap<String, Snapshot>,
    /// Every complete layer on disk and its size.
    sizes: HashMap<String, u64>,
    /// Live sandboxes stacking each layer.
    pins: HashMap<String, usize>,
}

pub struct Snapshots {
    dir: PathBuf,
    budget_bytes: u64,
    state: Mutex<State>,
    /// One capture at a time (see the module).
    capturing: tokio::sync::Mutex<()>,
}

/// A layer being captured: removed on drop unless [`Snapshots::complete`] took it.
pub struct PendingLayer<'a> {
    store: &'a Snapshots,
    pub id: String,
    pub path: PathBuf,
    /// What the budget has left for it.
    pub room: u64,
    _turn: tokio::sync::MutexGuard<'a, ()>,
    backend: &'a dyn Backend,
    done: bool,
}

impl Drop for PendingLayer<'_> {
    fn drop(&mut self) {
        if !self.done {
            remove_layer_files(self.backend, &self.store.layers_dir(), &self.id);
        }
    }
}

impl Snapshots {
    /// Opens (or makes) the store and removes what no snapshot needs (see the module).
    pub fn open(state_dir: &Path, budget_mb: u64, backend: &dyn Backend) -> std::io::Result<Self> {
        let dir = state_dir.join("snapshots");
        for sub in ["layers", "index"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let store = Self {
            budget_bytes: budget_mb.saturating_mul(1024 * 1024),
            state: Mutex::new(State::default()),
            capturing: tokio::sync::Mutex::new(()),
            dir,
        };
        store.load(backend)?;
        Ok(store)
    }

    fn layers_dir(&self) -> PathBuf {
        self.dir.join("layers")
    }

    fn index_dir(&self) -> PathBuf {
        self.dir.join("index")
    }

    /// The directory of layer `id`, for a boot to stack.
    pub fn layer_path(&self, id: &str) -> PathBuf {
        self.layers_dir().join(id)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn load(&self, backend: &dyn Backend) -> std::io::Result<()> {
        let mut state = self.state();
        for entry in std::fs::read_dir(self.index_dir())?.flatten() {
            let path = entry.path();
            let read = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Snapshot>(&bytes).ok());
            match read {
                Some(snapshot) if path.file_stem() == Some(snapshot.name.as_ref()) => {
                    state.named.insert(snapshot.name.clone(), snapshot);
                }
                _ => {
                    tracing::warn!(file = %path.display(), "removing an unreadable snapshot index entry");
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let mut on_disk = Vec::new();
        for entry in std::fs::read_dir(self.layers_dir())?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_suffix(".json") {
                let meta = std::fs::read(entry.path())
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<LayerMeta>(&bytes).ok());
                if let Some(meta) = meta {
                    state.sizes.insert(id.to_string(), meta.size_bytes);
                }
            } else {
                on_disk.push(name);
            }
        }
        // A snapshot whose layers are not all complete cannot be used.
        let broken: Vec<String> = state
            .named
            .values()
            .filter(|s| s.layers.iter().any(|l| !state.sizes.contains_key(l)))
            .map(|s| s.name.clone())
            .collect();
        for name in broken {
            tracing::warn!(snapshot = %name, "removing a snapshot whose files are incomplete");
            state.named.remove(&name);
            let _ = std::fs::remove_file(self.index_dir().join(format!("{name}.json")));
        }
        let keep: std::collections::HashSet<String> = state
            .named
            .values()
            .flat_map(|s| s.layers.iter().cloned())
            .collect();
        // A complete layer is both a directory and its size record: each id once.
        let ids: std::collections::BTreeSet<String> = on_disk
            .into_iter()
            .chain(state.sizes.keys().cloned())
            .collect();
        let mut removed = 0;
        for id in ids.into_iter().filter(|id| !keep.contains(id)) {
            remove_layer_files(backend, &self.layers_dir(), &id);
            state.sizes.remove(&id);
            removed += 1;
        }
        if removed > 0 {
            tracing::info!(removed, "removed snapshot layers no snapshot names");
        }
        Ok(())
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// What every layer on disk takes.
    pub fn used_bytes(&self) -> u64 {
        self.state().sizes.values().sum()
    }

    /// Starts capturing a layer: waits for any capture under way, then makes its directory.
    /// S400 when the budget has nothing left.
    pub async fn begin<'a>(
        &'a self,
        backend: &'a dyn Backend,
    ) -> Result<PendingLayer<'a>, SandboxError> {
        let turn = self.capturing.lock().await;
        let room = self.budget_bytes.saturating_sub(self.used_bytes());
        if room == 0 {
            return Err(SandboxError::ResourceLimit(format!(
                "snapshots use all of `max_snapshot_disk_mb` ({} MiB); delete one first",
                self.budget_bytes / (1024 * 1024)
            )));
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = self.layer_path(&id);
        std::fs::create_dir(&path).map_err(|e| {
            SandboxError::Internal(format!("cannot make a snapshot layer's directory: {e}"))
        })?;
        Ok(PendingLayer {
            store: self,
            id,
            path,
            room,
            _turn: turn,
            backend,
            done: false,
        })
    }

    /// Records a captured layer as complete, pinned `pins` times (by the sandboxes about to
    /// stack it; 0 for a named snapshot's, which its index entry keeps).
    pub fn complete(
        &self,
        mut pending: PendingLayer<'_>,
        size_bytes: u64,
        pins: usize,
    ) -> Result<String, SandboxError> {
        let meta = serde_json::to_vec(&LayerMeta { size_bytes }).unwrap_or_default();
        write_atomically(&self.layers_dir(), &format!("{}.json", pending.id), &meta)
            .map_err(|e| SandboxError::Internal(format!("cannot record a snapshot layer: {e}")))?;
        pending.done = true;
        let mut state = self.state();
        state.sizes.insert(pending.id.clone(), size_bytes);
        if pins > 0 {
            state.pins.insert(pending.id.clone(), pins);
        }
        Ok(pending.id.clone())
    }

    /// Names a snapshot (its layers complete). S602 if the name is taken.
    pub fn add(&self, snapshot: Snapshot) -> Result<(), SandboxError> {
        let mut state = self.state();
        if state.named.contains_key(&snapshot.name) {
            return Err(SandboxError::SnapshotExists(snapshot.name));
        }
        let bytes = serde_json::to_vec_pretty(&snapshot).unwrap_or_default();
        write_atomically(
            &self.index_dir(),
            &format!("{}.json", snapshot.name),
            &bytes,
        )
        .map_err(|e| SandboxError::Internal(format!("cannot record the snapshot: {e}")))?;
        state.named.insert(snapshot.name.clone(), snapshot);
        Ok(())
    }

    /// Whether a snapshot of that name exists.
    pub fn exists(&self, name: &str) -> bool {
        self.state().named.contains_key(name)
    }

    /// The snapshot `name` with its layers pinned for a sandbox about to stack them (S601
    /// when there is none); [`Snapshots::unpin`] releases them.
    pub fn take(&self, name: &str) -> Result<Snapshot, SandboxError> {
        let mut state = self.state();
        let snapshot = state
            .named
            .get(name)
            .cloned()
            .ok_or_else(|| SandboxError::SnapshotNotFound(name.to_string()))?;
        for layer in &snapshot.layers {
            *state.pins.entry(layer.clone()).or_default() += 1;
        }
        Ok(snapshot)
    }

    /// Pins `layers` `times` more (sandboxes about to stack the layers of another).
    pub fn pin_times(&self, layers: &[String], times: usize) {
        let mut state = self.state();
        for layer in layers {
            *state.pins.entry(layer.clone()).or_default() += times;
        }
    }

    /// What `layers` hold together.
    pub fn size_of(&self, layers: &[String]) -> u64 {
        let state = self.state();
        layers.iter().filter_map(|l| state.sizes.get(l)).sum()
    }

    /// Releases one pin of each of `layers` (a sandbox stacking them stopped, or never
    /// started) and removes those now unneeded.
    pub fn unpin(&self, backend: &dyn Backend, layers: &[String]) {
        if layers.is_empty() {
            return;
        }
        {
            let mut state = self.state();
            for layer in layers {
                if let Some(count) = state.pins.get_mut(layer) {
                    *count = count.saturating_sub(1);
                    if *count == 0 {
                        state.pins.remove(layer);
                    }
                }
            }
        }
        self.collect(backend);
    }

    /// Every snapshot, by name.
    pub fn list(&self) -> Vec<Snapshot> {
        self.state().named.values().cloned().collect()
    }

    /// Removes the snapshot `name` (S601 when there is none); its layers go unless another
    /// snapshot or a live sandbox still stacks them.
    pub fn delete(&self, backend: &dyn Backend, name: &str) -> Result<Snapshot, SandboxError> {
        let snapshot = {
            let mut state = self.state();
            let snapshot = state
                .named
                .remove(name)
                .ok_or_else(|| SandboxError::SnapshotNotFound(name.to_string()))?;
            if let Err(e) = std::fs::remove_file(self.index_dir().join(format!("{name}.json"))) {
                state.named.insert(name.to_string(), snapshot);
                return Err(SandboxError::Internal(format!(
                    "cannot remove the snapshot's index entry: {e}"
                )));
            }
            snapshot
        };
        self.collect(backend);
        Ok(snapshot)
    }

    /// Removes every complete layer no snapshot names and no sandbox stacks.
    fn collect(&self, backend: &dyn Backend) {
        let unneeded: Vec<String> = {
            let mut state = self.state();
            let named: std::collections::HashSet<&String> =
                state.named.values().flat_map(|s| s.layers.iter()).collect();
            let unneeded: Vec<String> = state
                .sizes
                .keys()
                .filter(|id| !named.contains(id) && !state.pins.contains_key(*id))
                .cloned()
                .collect();
            for id in &unneeded {
                state.sizes.remove(id);
            }
            unneeded
        };
        for id in unneeded {
            remove_layer_files(backend, &self.layers_dir(), &id);
        }
    }
}

/// Removes a layer's directory (as the ids that wrote it, where the adapter's user cannot)
/// and its size record.
fn remove_layer_files(backend: &dyn Backend, layers: &Path, id: &str) {
    let dir = layers.join(id);
    if std::fs::symlink_metadata(&dir).is_ok() {
        if let Err(e) = backend.remove_guest_tree(&dir) {
            tracing::warn!(layer = %id, error = %e, "cannot remove a snapshot layer");
            return;
        }
    }
    let _ = std::fs::remove_file(layers.join(format!("{id}.json")));
}

/// Writes `dir/name` whole or not at all (a temporary file renamed over it).
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let temporary = dir.join(format!(".{name}.tmp"));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, dir.join(name))
}

/// A snapshot name: 1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with a dot (it names a
/// file of the index).
pub fn check_name(name: &str) -> Result<(), SandboxError> {
    let fits = (1..=64).contains(&name.len())
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if fits {
        Ok(())
    } else {
        Err(SandboxError::InvalidRequest(format!(
            "snapshot name {name:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ - and not start with '.'"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_safe_file_names() {
        for good in ["a", "py-deps_1.2", &"x".repeat(64)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in ["", ".hidden", "..", "a/b", "a b", "é", &"x".repeat(65)] {
            assert_eq!(check_name(bad).unwrap_err().code(), "S001", "{bad}");
        }
    }
}
