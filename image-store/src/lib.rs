//! image-store: the sandbox image catalog, OCI pulls, verified layer unpacking and the local
//! image cache of sandbox-libkrun.
//!
//! It turns a catalog name (`python`, `node`, or a configured custom image) into a read-only,
//! flattened root filesystem on disk ([`PreparedImage::rootfs`]). It is not a container
//! runtime: it never boots anything, and it never gives a sandbox a writable view (callers put
//! their own writable layer on top; **the cached root must be treated as read-only**).
//!
//! | concern | file |
//! |---|---|
//! | settings, presets | `settings.rs` |
//! | catalog (`catalog::list`) | `catalog.rs` |
//! | S-codes | `error.rs` |
//! | manifests, platform choice | `manifest.rs` |
//! | registry access (oci-client) | `pull.rs`, `auth.rs`, `reference.rs` |
//! | cache layout, locks | `cache.rs`, `lock.rs` |
//! | roots iii 0.25 left in its cache (read-only, checked) | `legacy.rs` |
//! | unpack: entries, whiteouts, diff_id | `unpack/mod.rs`, `unpack/entry.rs` |
//! | unpack: safe path resolution | `unpack/resolve.rs` |
//! | unpack: inflate thread, parallel writers, PAX | `unpack/pipe.rs`, `unpack/writers.rs`, `unpack/pax.rs` |
//! | progress | `progress.rs` |
//! | the facade: catalog, `ensure`, cached lookups | `store.rs` |
//! | installing: resolve, lock, download, unpack, rename | `install.rs` |

mod auth;
mod cache;
mod catalog;
mod digest;
mod error;
mod install;
mod legacy;
mod lock;
mod manifest;
mod progress;
mod pull;
mod reference;
mod settings;
mod store;
pub mod unpack;

pub use catalog::{CatalogEntry, ImageKind};
pub use digest::Digest;
pub use error::ImageError;
pub use manifest::ImageRuntimeConfig;
pub use progress::{NoProgress, PullProgress, TracingProgress};
pub use pull::PullError;
pub use settings::{default_cache_dir, default_docker_config, ImageSettings, PRESETS};
pub use store::{ImageSource, ImageStore, PreparedImage};
