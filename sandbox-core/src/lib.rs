//! What every sandbox plugin shares: the contract (function table and schemas), the S-code
//! errors, the configuration and its rules, and the operations, written once over a
//! [`backend::Backend`] so each plugin only supplies the isolation technology.
//!
//! It is not a plugin itself and holds no FFI: plugins wrap [`plugin::SandboxPlugin`] with
//! `plugin_api::export_plugin!`.
//!
//! Where each part of SPEC.md lives:
//!
//! | SPEC.md | module |
//! |---|---|
//! | 2, function table and schemas | [`functions`] |
//! | 2, `adapter::info` | [`ops::info`] |
//! | 3, configuration | [`config`] |
//! | 4, errors | [`error`] |
//! | 2, `create` / `exec` / `stop` / `list` / `run` / `catalog::list` | `ops/<verb>.rs` |
//! | 2, request shapes (env, command, stdin) | [`request`] |
//! | 2, exec caps and limits | `registry.rs` |
//! | 5, host prerequisites | [`backend::Backend::probe`] |
//! | 7, no orphans, reconciliation | `layer.rs` |
//! | 7, idle reaping | `reaper.rs` |
//! | warm pool (`warm_pool`) | `warm_pool.rs` |
//! | 6, worker VMs (`worker::*`) | [`ops::worker`] |
//! | 3 and 8, sandboxes on the bus (`sandbox_bus_*`) | [`bus`] |
//! | 2, iii's sandbox family (`sandbox::provider::<name>::*`) | [`family`] |

#![forbid(unsafe_code)]

pub mod backend;
pub mod bus;
pub mod config;
pub mod error;
pub mod events;
pub mod family;
pub mod file_share;
pub mod functions;
mod images;
mod layer;
/// The egress policy (SPEC.md section 8), from the `egress` crate the starters share.
pub use egress::policy as network;
pub mod ops;
pub mod plugin;
pub mod proc_counters;
mod reaper;
mod registry;
pub mod remove_tree;
pub mod request;
pub mod snapshots;
pub mod subordinate;
mod warm_pool;

pub use backend::{
    helper_program, log_tails, state_in_layer_image, AgentReader, AgentWriter, Backend, BootSpec,
    Booted, ChildProcess, Counters, GuestMount, HostUnfit, Mount, SandboxProcess,
};
pub use config::Config;
pub use error::SandboxError;
pub use plugin::SandboxPlugin;
