//! What every AWS adapter's settings share, checked and turned into an SDK configuration once:
//! the region, another endpoint, the deadline of one call, and an access key of the adapter's
//! own instead of the standard credential chain.

use crate::SettingsError;
use capstan_core::Capability;
use std::path::PathBuf;
use std::time::Duration;

/// The AWS keys of a `[providers.<capability>]` table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access<'a> {
    pub capability: Capability,
    pub region: Option<&'a String>,
    /// The region when neither the settings nor the environment name one.
    pub default_region: &'static str,
    pub endpoint_url: Option<&'a String>,
    pub timeout_ms: u64,
    pub access_key_id: Option<&'a String>,
    pub secret_access_key_file: Option<&'a PathBuf>,
    pub secret_access_key_env: Option<&'a str>,
}

impl Access<'_> {
    /// The SDK configuration, or the key that stops start-up.
    pub(crate) async fn connect(self) -> Result<capstan_aws::Aws, SettingsError> {
        let c = self.capability;
        if self.timeout_ms == 0 {
            return Err(SettingsError::new(c, "timeout_ms", "must be above 0"));
        }
        if let Some(url) = self.endpoint_url
            && !(url.starts_with("https://") || url.starts_with("http://"))
        {
            return Err(SettingsError::new(
                c,
                "endpoint_url",
                format!("`{url}` is not an http(s) URL"),
            ));
        }
        let credentials = match self.access_key_id {
            Some(id) => Some(capstan_aws::StaticCredentials {
                access_key_id: id.clone(),
                secret_access_key: crate::secret::read(
                    c,
                    "secret_access_key",
                    self.secret_access_key_file,
                    self.secret_access_key_env,
                )?,
            }),
            None if self.secret_access_key_file.is_some()
                || self.secret_access_key_env.is_some() =>
            {
                return Err(SettingsError::new(
                    c,
                    "access_key_id",
                    "a secret access key needs its access_key_id",
                ));
            }
            None => None,
        };
        Ok(capstan_aws::Aws::connect(
            self.region.cloned(),
            self.default_region,
            self.endpoint_url.cloned(),
            credentials,
            Duration::from_millis(self.timeout_ms),
        )
        .await)
    }
}
