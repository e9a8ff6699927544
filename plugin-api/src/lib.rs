//! The stable boundary between the `sandbox-libkrun` shell and its plugins.
//!
//! A plugin is a `cdylib` that exports one root module (through [`export_plugin!`]); the shell
//! loads it with [`host::PluginLibrary::load`]. Across the boundary only JSON text travels:
//! the [`Manifest`], the configuration, each call's payload and result, and the S-code
//! [`ErrorBody`]. Every `abi_stable` and `async-ffi` type stays inside this crate (module
//! `ffi`), so a later move to another ABI crate touches nothing else.
//!
//! This crate is not the sandbox contract: it knows nothing about sandboxes.

mod elf_check;
pub mod error;
pub mod export;
mod ffi;
pub mod host;
pub mod manifest;
pub mod services;

pub use error::ErrorBody;
pub use export::{Plugin, PluginFuture};
pub use manifest::{ContractVersion, FunctionSpec, Manifest};
pub use services::{Host, HostServices};

/// Items the [`export_plugin!`] macro expands to; not for direct use.
#[doc(hidden)]
pub mod __private {
    pub use crate::export::{init_entry, manifest_entry};
    pub use crate::ffi::{HostBox, InstanceBox, PluginMod, PluginModRef};
    pub use abi_stable::export_root_module;
    pub use abi_stable::prefix_type::PrefixTypeTrait;
    pub use abi_stable::std_types::{RResult, RStr, RString};
}

/// Exports the plugin's root module.
///
/// `$manifest` is a `fn() -> Manifest`; `$init` is a
/// `fn(&serde_json::Value, Host) -> Result<Arc<dyn Plugin>, String>` that runs inside the
/// plugin's own tokio runtime (so it may spawn tasks) and returns a one-line configuration
/// error on failure.
#[macro_export]
macro_rules! export_plugin {
    ($manifest:path, $init:path) => {
        extern "C" fn __sandbox_plugin_manifest() -> $crate::__private::RString {
            $crate::__private::manifest_entry($manifest)
        }

        extern "C" fn __sandbox_plugin_init(
            config: $crate::__private::RStr<'_>,
            host: $crate::__private::HostBox,
        ) -> $crate::__private::RResult<$crate::__private::InstanceBox, $crate::__private::RString>
        {
            $crate::__private::init_entry(config, host, $init)
        }

        #[$crate::__private::export_root_module]
        fn __sandbox_plugin_root_module() -> $crate::__private::PluginModRef {
            use $crate::__private::PrefixTypeTrait;
            $crate::__private::PluginMod {
                manifest: __sandbox_plugin_manifest,
                init: __sandbox_plugin_init,
            }
            .leak_into_prefix()
        }
    };
}
