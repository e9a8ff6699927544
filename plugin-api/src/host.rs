//! The shell side: loading a plugin library and calling it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::library::{lib_header_from_path, LibraryError};
use abi_stable::std_types::{RResult, RString};
use serde_json::Value;

use crate::ffi::{InstanceBox, PluginModRef};
use crate::manifest::ManifestError;
use crate::{ErrorBody, HostServices, Manifest};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot load plugin {path}: {reason}")]
    Library { path: PathBuf, reason: String },
    #[error("plugin {path} has an unreadable manifest: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error("plugin {path} has an invalid manifest: {source}")]
    InvalidManifest {
        path: PathBuf,
        source: ManifestError,
    },
}

/// A loaded plugin library. The library stays mapped for the life of the process.
pub struct PluginLibrary {
    module: PluginModRef,
    manifest: Manifest,
}

impl PluginLibrary {
    /// Loads `path`; a library that is not a plugin, or was built against another version of
    /// this interface, is refused with the reason.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let library_error = |e: LibraryError| LoadError::Library {
            path: path.to_path_buf(),
            reason: describe_library_error(e),
        };
        // dlopen of a truncated library dies with SIGBUS instead of failing: look first.
        crate::elf_check::check(path).map_err(|e| LoadError::Library {
            path: path.to_path_buf(),
            reason: format!("not a sandbox plugin library: {e}"),
        })?;
        let header = lib_header_from_path(path).map_err(library_error)?;
        let module = header
            .init_root_module::<PluginModRef>()
            .map_err(library_error)?;
        let text = (module.manifest())();
        let manifest: Manifest =
            serde_json::from_str(text.as_str()).map_err(|e| LoadError::Manifest {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        manifest
            .validate()
            .map_err(|source| LoadError::InvalidManifest {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Self { module, manifest })
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Starts an instance with `config` and the shell's `services` (whose calls run on the
    /// current tokio runtime); on refusal returns the plugin's one-line reason.
    pub fn init(
        &self,
        config: &Value,
        services: Arc<dyn HostServices>,
    ) -> Result<PluginInstance, String> {
        let host = crate::services::to_ffi(services, tokio::runtime::Handle::current());
        match (self.module.init())(config.to_string().as_str().into(), host) {
            RResult::ROk(instance) => Ok(PluginInstance(Arc::new(instance))),
            RResult::RErr(reason) => Err(reason.into_string()),
        }
    }
}

fn describe_library_error(error: LibraryError) -> String {
    // abi_stable's messages span several lines; the shell prints one.
    let one_line = |text: String| text.split_whitespace().collect::<Vec<_>>().join(" ");
    match error {
        LibraryError::OpenError { err, .. } => {
            format!(
                "not a sandbox plugin library (the loader refused it: {})",
                one_line(err.to_string())
            )
        }
        LibraryError::GetSymbolError { err, .. } => format!(
            "not a sandbox plugin library (it exports no plugin root module: {})",
            one_line(err.to_string())
        ),
        LibraryError::IncompatibleVersionNumber { .. } | LibraryError::AbiInstability(_) => {
            format!(
                "built against another plugin interface version ({})",
                one_line(error.to_string())
            )
        }
        other => one_line(other.to_string()),
    }
}

/// A running plugin; cheap to clone, shared by every call in flight.
#[derive(Clone)]
pub struct PluginInstance(Arc<InstanceBox>);

impl PluginInstance {
    /// Calls `function` with `payload`, which is serialised and dropped before the call: a
    /// large request is held once as JSON text while the plugin runs, not also as a `Value`.
    pub async fn invoke(&self, function: &str, payload: Value) -> Result<Value, ErrorBody> {
        let text = payload.to_string();
        drop(payload);
        self.invoke_json(function, text).await
    }

    /// Calls `function` with a payload already serialised; the text crosses the boundary
    /// without a copy (the plugin parses it and frees it before serving the call).
    pub async fn invoke_json(&self, function: &str, payload: String) -> Result<Value, ErrorBody> {
        let outcome = self
            .0
            .invoke(RString::from(function), RString::from(payload))
            .await;
        match outcome {
            RResult::ROk(text) => serde_json::from_str(text.as_str())
                .map_err(|e| ErrorBody::internal(format!("plugin answered with bad JSON: {e}"))),
            RResult::RErr(text) => Err(ErrorBody::from_json(text.as_str())),
        }
    }

    /// Stops the plugin and its runtime; blocks until done, so call it off the async runtime.
    pub fn shutdown(&self) {
        self.0.shutdown();
    }
}
