//! What a plugin declares about itself: its adapter name, the functions it serves, and the
//! functions it serves a second time under iii's sandbox family (`sandbox::provider::<name>::*`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Version of the bus contract a plugin implements (SPEC.md: `contract`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContractVersion {
    pub major: u32,
    pub minor: u32,
}

/// One function the plugin serves; the shell registers it as `<prefix>::<id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionSpec {
    /// Id suffix, e.g. `exec` or `fs::read`.
    pub id: String,
    pub description: String,
    /// JSON Schema of the request object.
    pub request_schema: Value,
    /// JSON Schema of the response object.
    pub response_schema: Value,
    /// When true the shell checks the request's `auth` against the worker token (S505) and
    /// removes `auth` before the plugin sees the call.
    pub token_guarded: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Adapter name; also the default function id prefix.
    pub adapter: String,
    pub adapter_version: String,
    pub contract: ContractVersion,
    pub functions: Vec<FunctionSpec>,
    /// The family surface: the shell registers each as `sandbox::provider::<name>::<id>`
    /// (see [`family_function_id`]) and calls the plugin with [`family_call`] of its id.
    /// Absent from a manifest written before the family existed: such a plugin has none.
    #[serde(default)]
    pub family: Vec<FunctionSpec>,
}

/// Where iii's `sandbox` router sends calls for the provider `<name>`: every id under
/// `sandbox::provider::<name>::`. The router owns the bare `sandbox::<leaf>` ids; an adapter
/// never registers one.
pub const FAMILY_PREFIX: &str = "sandbox::provider";

/// The environment variable naming this adapter among the family's providers.
pub const FAMILY_NAME_ENV: &str = "SANDBOX_LIBKRUN_FAMILY_NAME";

/// The provider name used when [`FAMILY_NAME_ENV`] is unset.
pub const DEFAULT_FAMILY_NAME: &str = "libkrun";

/// The name a plugin is called with for the family function `id` (`family::create`): apart
/// from its own functions, so a family `create` and the plugin's `create` never meet.
pub fn family_call(id: &str) -> String {
    format!("family::{id}")
}

/// The bus id of family function `id` for provider `name`.
pub fn family_function_id(name: &str, id: &str) -> String {
    format!("{FAMILY_PREFIX}::{name}::{id}")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "{FAMILY_NAME_ENV}={0:?} is not a provider name: 1 to 32 of a-z 0-9 _ -, starting with a \
     letter or digit (or empty, to serve no family functions)"
)]
pub struct BadFamilyName(pub String);

/// The provider name from the value of [`FAMILY_NAME_ENV`]: unset is [`DEFAULT_FAMILY_NAME`],
/// empty turns the family surface off (`None`), anything else must match
/// `[a-z0-9][a-z0-9_-]{0,31}`: one word of a function id, which the router builds from the
/// caller's `provider` field.
pub fn family_name(value: Option<&str>) -> Result<Option<String>, BadFamilyName> {
    let Some(value) = value else {
        return Ok(Some(DEFAULT_FAMILY_NAME.to_string()));
    };
    if value.is_empty() {
        return Ok(None);
    }
    let fits = value.len() <= 32
        && value
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if fits {
        Ok(Some(value.to_string()))
    } else {
        Err(BadFamilyName(value.to_string()))
    }
}

/// [`family_name`] of this process's environment. The shell (which registers the ids) and
/// the plugin (whose `adapter::info` shows the name) run in one process and read the one
/// variable through this one function, so they cannot disagree.
pub fn family_name_from_env() -> Result<Option<String>, BadFamilyName> {
    match std::env::var(FAMILY_NAME_ENV) {
        Ok(value) => family_name(Some(&value)),
        Err(std::env::VarError::NotPresent) => family_name(None),
        Err(std::env::VarError::NotUnicode(value)) => {
            Err(BadFamilyName(value.to_string_lossy().into_owned()))
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("the manifest has an empty adapter name")]
    EmptyAdapter,
    #[error("function id {0:?} is not valid (expected lower-case words joined by '::')")]
    BadFunctionId(String),
    #[error("function id {0:?} is declared twice")]
    DuplicateFunction(String),
    #[error("family function {0:?} is token-guarded; the family surface carries no token")]
    GuardedFamilyFunction(String),
}

impl Manifest {
    /// Checks what the shell relies on: a name, and unique, well-formed function ids.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.adapter.trim().is_empty() {
            return Err(ManifestError::EmptyAdapter);
        }
        for list in [&self.functions, &self.family] {
            let mut seen = std::collections::BTreeSet::new();
            for function in list {
                if !is_valid_function_id(&function.id) {
                    return Err(ManifestError::BadFunctionId(function.id.clone()));
                }
                if !seen.insert(function.id.as_str()) {
                    return Err(ManifestError::DuplicateFunction(function.id.clone()));
                }
            }
        }
        if let Some(guarded) = self.family.iter().find(|f| f.token_guarded) {
            return Err(ManifestError::GuardedFamilyFunction(guarded.id.clone()));
        }
        Ok(())
    }

    pub fn function(&self, id: &str) -> Option<&FunctionSpec> {
        self.functions.iter().find(|f| f.id == id)
    }
}

fn is_valid_function_id(id: &str) -> bool {
    id.split("::").all(|word| {
        !word.is_empty()
            && word
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(id: &str) -> FunctionSpec {
        FunctionSpec {
            id: id.to_string(),
            description: String::new(),
            request_schema: json!({}),
            response_schema: json!({}),
            token_guarded: false,
        }
    }

    fn manifest(ids: &[&str]) -> Manifest {
        Manifest {
            adapter: "a".into(),
            adapter_version: "0".into(),
            contract: ContractVersion { major: 1, minor: 1 },
            functions: ids.iter().map(|id| spec(id)).collect(),
            family: Vec::new(),
        }
    }

    #[test]
    fn accepts_nested_ids() {
        assert_eq!(
            manifest(&["exec", "fs::read", "adapter::info"]).validate(),
            Ok(())
        );
    }

    #[test]
    fn refuses_bad_and_duplicate_ids() {
        assert!(matches!(
            manifest(&["Exec"]).validate(),
            Err(ManifestError::BadFunctionId(_))
        ));
        assert!(matches!(
            manifest(&["fs::"]).validate(),
            Err(ManifestError::BadFunctionId(_))
        ));
        assert!(matches!(
            manifest(&["exec", "exec"]).validate(),
            Err(ManifestError::DuplicateFunction(_))
        ));
    }

    #[test]
    fn the_family_list_is_checked_on_its_own() {
        let mut both = manifest(&["create", "exec"]);
        both.family = vec![spec("create"), spec("fs::read")];
        assert_eq!(both.validate(), Ok(()), "the same id in both lists is fine");
        both.family.push(spec("create"));
        assert_eq!(
            both.validate(),
            Err(ManifestError::DuplicateFunction("create".into()))
        );
        let mut guarded = manifest(&["exec"]);
        guarded.family = vec![FunctionSpec {
            token_guarded: true,
            ..spec("worker::start")
        }];
        assert!(matches!(
            guarded.validate(),
            Err(ManifestError::GuardedFamilyFunction(_))
        ));
    }

    #[test]
    fn a_manifest_without_a_family_list_reads_as_none() {
        let text = r#"{"adapter":"a","adapter_version":"0","contract":{"major":1,"minor":1},"functions":[]}"#;
        let read: Manifest = serde_json::from_str(text).unwrap();
        assert!(read.family.is_empty());
    }

    #[test]
    fn family_names_unset_default_empty_off_else_one_id_word() {
        assert_eq!(family_name(None), Ok(Some("libkrun".into())));
        assert_eq!(family_name(Some("")), Ok(None));
        for good in ["local", "libkrun", "a", "0", "my_vm-2", &"x".repeat(32)] {
            assert_eq!(
                family_name(Some(good)),
                Ok(Some(good.to_string())),
                "{good}"
            );
        }
        for bad in [
            "Local",
            "-a",
            "_a",
            "a b",
            "a::b",
            "a.b",
            "é",
            &"x".repeat(33),
        ] {
            assert_eq!(
                family_name(Some(bad)),
                Err(BadFamilyName(bad.to_string())),
                "{bad}"
            );
        }
        assert_eq!(
            family_function_id("local", "fs::read"),
            "sandbox::provider::local::fs::read"
        );
        assert_eq!(family_call("fs::read"), "family::fs::read");
    }
}
