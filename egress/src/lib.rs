//! A sandbox's network, shared by every backend: the egress policy and its configuration
//! rules ([`policy`], read by sandbox-core), what a sandbox's starter needs to give it a
//! network namespace of its own ([`network`]: the nftables ruleset, pasta's arguments, the
//! resolver proxy's set-up, computed by the adapter), and the starter's side ([`netns`]: the
//! namespace made, the policy loaded, pasta attached; [`dns`]: the resolver proxy;
//! [`host_watch`]: the host's addresses, followed into the rules while a sandbox runs).
//!
//! Its own crate so that both starters use one implementation: the bwrap launcher
//! (`sandbox-bwrap-launch`) and the libkrun VM runner (`sandbox-libkrun-vm`, which links
//! neither sandbox-core nor a plugin).

#![deny(unsafe_code)]

// The starter's side is Linux-only (network namespaces, nftables, netlink, pasta); the policy
// and the set-up the adapter computes are plain data and compile everywhere (macOS too).
#[cfg(target_os = "linux")]
pub mod dns;
#[cfg(target_os = "linux")]
pub mod forward;
#[cfg(target_os = "linux")]
pub mod gate;
#[cfg(target_os = "linux")]
pub mod host_watch;
#[cfg(target_os = "linux")]
pub mod netns;
pub mod network;
pub mod policy;
#[cfg(target_os = "linux")]
mod privilege;
#[cfg(target_os = "linux")]
mod rtnetlink;

#[cfg(target_os = "linux")]
pub use privilege::keep_capabilities;

/// The starter's program name, which its children's messages begin with (they reach the
/// sandbox's log through the starter's stderr).
#[cfg(target_os = "linux")]
pub(crate) fn program() -> String {
    std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "egress".into())
}
