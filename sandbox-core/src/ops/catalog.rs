//! `catalog::list`: presets first, then custom images sorted by name.

use serde_json::{json, Value};

use crate::backend::Backend;
use crate::plugin::SandboxPlugin;

pub fn list<B: Backend>(plugin: &SandboxPlugin<B>) -> Value {
    json!({ "images": plugin.images.catalog() })
}
