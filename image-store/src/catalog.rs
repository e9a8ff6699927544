//! The image catalog: presets and custom images, with allowlist and install state.

use serde::{Deserialize, Serialize};

use crate::settings::{ImageSettings, PRESETS};

/// Where a catalog entry comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageKind {
    Preset,
    Custom,
}

/// One entry of `catalog::list`, serialised exactly as SPEC.md shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    pub name: String,
    pub oci_ref: String,
    pub kind: ImageKind,
    pub installed: bool,
    pub allowed: bool,
}

/// A catalog entry before install state is known.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    pub name: String,
    pub oci_ref: String,
    pub kind: ImageKind,
    pub allowed: bool,
}

/// Presets first (in PRESETS order), then custom images sorted by name (BTreeMap order).
/// A custom entry reusing a preset name is ignored here; sandbox-core rejects it at start-up.
pub(crate) fn known_images(settings: &ImageSettings) -> Vec<Known> {
    let allowed = |name: &str| settings.image_allowlist.iter().any(|a| a == name);
    let presets = PRESETS.iter().map(|(name, oci_ref)| Known {
        name: name.to_string(),
        oci_ref: oci_ref.to_string(),
        kind: ImageKind::Preset,
        allowed: allowed(name),
    });
    let custom = settings
        .custom_images
        .iter()
        .filter(|(name, _)| !PRESETS.iter().any(|(p, _)| p == name))
        .map(|(name, oci_ref)| Known {
            name: name.clone(),
            oci_ref: oci_ref.clone(),
            kind: ImageKind::Custom,
            allowed: allowed(name),
        });
    presets.chain(custom).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_first_then_custom_sorted_and_serialised_as_spec() {
        let mut s = ImageSettings::with_defaults();
        s.image_allowlist = vec!["python".into(), "zeta".into()];
        s.custom_images
            .insert("zeta".into(), "example.org/z:1".into());
        s.custom_images
            .insert("alpha".into(), "example.org/a:1".into());
        s.custom_images
            .insert("node".into(), "example.org/evil:1".into());
        let names: Vec<_> = known_images(&s)
            .into_iter()
            .map(|k| (k.name, k.allowed))
            .collect();
        assert_eq!(
            names,
            vec![
                ("python".to_string(), true),
                ("node".to_string(), false),
                ("alpha".to_string(), false),
                ("zeta".to_string(), true)
            ]
        );
        let entry = CatalogEntry {
            name: "python".into(),
            oci_ref: "docker.io/library/python:3.12-slim".into(),
            kind: ImageKind::Preset,
            installed: false,
            allowed: true,
        };
        assert_eq!(
            serde_json::to_value(&entry).unwrap(),
            serde_json::json!({"name":"python","oci_ref":"docker.io/library/python:3.12-slim",
                               "kind":"preset","installed":false,"allowed":true})
        );
    }
}
