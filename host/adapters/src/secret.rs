//! Secrets from a file (`*_file`, e.g. a systemd credential) or from a named environment variable
//! (`*_env`), never inline in the configuration. Values are trimmed of surrounding whitespace.

use crate::SettingsError;
use capstan_core::Capability;
use std::path::PathBuf;

/// Reads the secret that `file` or `env` points at; exactly one must be given.
pub fn read(
    capability: Capability,
    key: &str,
    file: Option<&PathBuf>,
    env: Option<&str>,
) -> Result<String, SettingsError> {
    let value = match (file, env) {
        (Some(path), None) => std::fs::read_to_string(path).map_err(|e| {
            SettingsError::new(
                capability,
                &format!("{key}_file"),
                format!("cannot read {}: {e}", path.display()),
            )
        })?,
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            SettingsError::new(
                capability,
                &format!("{key}_env"),
                format!("the environment variable {var} is not set"),
            )
        })?,
        (Some(_), Some(_)) => {
            return Err(SettingsError::new(
                capability,
                key,
                format!("give {key}_file or {key}_env, not both"),
            ));
        }
        (None, None) => {
            return Err(SettingsError::new(
                capability,
                &format!("{key}_file"),
                format!("is required (or {key}_env naming an environment variable)"),
            ));
        }
    };
    let value = value.trim().to_owned();
    if value.is_empty() {
        return Err(SettingsError::new(capability, key, "the secret is empty"));
    }
    Ok(value)
}
