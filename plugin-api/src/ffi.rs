//! The FFI-safe root module. The only module that names `abi_stable` and `async-ffi` types.
//!
//! The root module is a prefix type: later versions may only append fields, and the loader
//! refuses a library whose layout or version does not match ours.

// The `sabi_trait` expansion implements foreign traits inside a const block; that is how
// abi_stable builds trait objects, not something we can move.
#![allow(non_local_definitions)]

use abi_stable::{
    declare_root_module_statics,
    library::RootModule,
    sabi_trait,
    sabi_types::VersionStrings,
    std_types::{RBox, RResult, RStr, RString},
    StableAbi,
};
use async_ffi::FfiFuture;

/// A running plugin instance, as seen across the boundary.
#[sabi_trait]
pub trait InstanceFfi: Send + Sync {
    /// Calls function `function` (the id suffix) with a JSON payload; resolves to the JSON
    /// result or a JSON [`crate::ErrorBody`].
    fn invoke(&self, function: RString, payload: RString) -> FfiFuture<RResult<RString, RString>>;

    /// Stops everything the instance runs; called once, before the shell exits.
    #[sabi(last_prefix_field)]
    fn shutdown(&self);
}

pub type InstanceBox = InstanceFfi_TO<'static, RBox<()>>;

/// What the shell offers its plugin, as seen across the boundary.
#[sabi_trait]
pub trait HostFfi: Send + Sync {
    /// The engine's WebSocket address (`ws://host:port`), for channel connections.
    fn engine_url(&self) -> RString;

    /// Calls `function_id` on the bus with a JSON payload; resolves to the JSON result or a
    /// one-line error.
    #[sabi(last_prefix_field)]
    fn invoke(
        &self,
        function_id: RString,
        payload: RString,
        timeout_ms: u64,
    ) -> FfiFuture<RResult<RString, RString>>;

    /// The state of the shell's connection to the engine as a JSON object, or empty when the
    /// shell does not say. Appended after the prefix: a host built before it has no such
    /// method, and the plugin then gets this default (empty) instead.
    fn bus_state(&self) -> RString {
        RString::new()
    }
}

pub type HostBox = HostFfi_TO<'static, RBox<()>>;

#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = PluginModRef)))]
#[sabi(missing_field(panic))]
pub struct PluginMod {
    /// The plugin's [`crate::Manifest`] as JSON.
    pub manifest: extern "C" fn() -> RString,
    /// Builds an instance from the configuration JSON and the shell's services, or returns a
    /// one-line reason.
    #[sabi(last_prefix_field)]
    pub init: extern "C" fn(config: RStr<'_>, host: HostBox) -> RResult<InstanceBox, RString>,
}

impl RootModule for PluginModRef {
    declare_root_module_statics! {PluginModRef}
    const BASE_NAME: &'static str = "sandbox_plugin";
    const NAME: &'static str = "sandbox_plugin";
    #[cfg(not(feature = "other-interface-version-for-tests"))]
    const VERSION_STRINGS: VersionStrings = abi_stable::package_version_strings!();
    /// Lets a test build a plugin "against another interface version" and check the refusal.
    #[cfg(feature = "other-interface-version-for-tests")]
    const VERSION_STRINGS: VersionStrings = VersionStrings::new("1.0.0");
}
