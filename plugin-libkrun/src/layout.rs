//! What a libkrun sandbox keeps in its layer directory: the overlay's upper and work
//! directories, the mount point of the merged root, a private copy of the agent (shared
//! read-only with the guest), the agent's socket, the runner's specification and logs.

use std::io;
use std::path::{Path, PathBuf};

/// The guest directory holding the agent (a read-only virtio-fs share).
pub const AGENT_GUEST_DIR: &str = "/.iii-agent";
/// The agent's file name, in the share and in the guest.
pub const AGENT_FILE: &str = "sandbox-agent";

pub struct Layout {
    pub upper: PathBuf,
    pub work: PathBuf,
    pub root: PathBuf,
    pub agent_dir: PathBuf,
    pub socket: PathBuf,
    pub spec: PathBuf,
    pub console_log: PathBuf,
    pub runner_log: PathBuf,
}

impl Layout {
    pub fn new(layer_dir: &Path) -> Self {
        Self {
            upper: layer_dir.join("upper"),
            work: layer_dir.join("work"),
            root: layer_dir.join("root"),
            agent_dir: layer_dir.join("agent"),
            socket: layer_dir.join("agent.sock"),
            spec: layer_dir.join("vm.json"),
            console_log: layer_dir.join("console.log"),
            runner_log: layer_dir.join("runner.log"),
        }
    }

    /// Creates the directories and puts the agent in its share: a hard link when the state
    /// directory is on the agent's filesystem, else a copy (never the agent's own directory,
    /// which holds the adapter's other files).
    pub fn prepare(&self, agent: &Path) -> io::Result<()> {
        for dir in [&self.upper, &self.work, &self.root, &self.agent_dir] {
            std::fs::create_dir(dir)?;
        }
        let target = self.agent_dir.join(AGENT_FILE);
        if std::fs::hard_link(agent, &target).is_err() {
            std::fs::copy(agent, &target)?;
        }
        Ok(())
    }
}

/// The agent's path inside the guest.
pub fn agent_in_guest() -> String {
    format!("{AGENT_GUEST_DIR}/{AGENT_FILE}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepare_makes_the_directories_and_a_runnable_agent_copy() {
        let dir = tempfile::tempdir().unwrap();
        let agent = dir.path().join("the-agent");
        std::fs::write(&agent, b"\x7fELF not really").unwrap();
        let layer = dir.path().join("layer");
        std::fs::create_dir(&layer).unwrap();
        let layout = Layout::new(&layer);
        layout.prepare(&agent).unwrap();
        for d in [&layout.upper, &layout.work, &layout.root] {
            assert!(d.is_dir(), "{}", d.display());
        }
        assert_eq!(
            std::fs::read(layout.agent_dir.join(AGENT_FILE)).unwrap(),
            b"\x7fELF not really"
        );
        assert!(layout.prepare(&agent).is_err(), "a layer is prepared once");
    }
}
