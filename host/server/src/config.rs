//! One typed configuration: defaults, then `--config FILE` (TOML), then `CAPSTAN_*` environment
//! variables (nested keys with `__`, e.g. `CAPSTAN_RUNTIME__MEMORY_LIMIT_MIB`), then flags.
//! A bad value stops the process with the key, the value and what was expected.

use capstan_core::{Capability, CapabilityGrants};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// Sandbox limits of every activation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSettings {
    /// Largest linear memory of one activation, MiB.
    pub memory_limit_mib: u32,
    /// CPU budget of one activation, in fuel units (about one per wasm instruction).
    pub fuel_per_activation: u64,
    /// Largest wasm stack, KiB.
    pub max_stack_kib: u32,
    /// Cache compiled components under `<data_dir>/components`.
    pub cache_components: bool,
    /// Activations (workflow runs and booking steps) alive at once at most, each in a slot of
    /// the pooling allocator; more wait for a slot. 0: allocate each instance on demand.
    pub instance_pool: u32,
    /// The activation deadline and the bounds on what a guest hands the host (`[runtime.limits]`).
    #[serde(default)]
    pub limits: capstan_runtime::GuestLimits,
}

impl Default for RuntimeSettings {
    fn default() -> Self {
        Self {
            memory_limit_mib: 64,
            fuel_per_activation: 2_000_000_000,
            max_stack_kib: 1024,
            cache_components: true,
            instance_pool: 128,
            limits: capstan_runtime::GuestLimits::default(),
        }
    }
}

/// Everything `capstan` can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Main listener: the orchestration API and the production partner API.
    #[serde(deserialize_with = "socket_addr")]
    pub listen: SocketAddr,
    /// Sandbox listener (the partner API's sandbox environment).
    #[serde(deserialize_with = "socket_addr")]
    pub sandbox_listen: SocketAddr,
    /// A plain-HTTP listener that answers 301 to the HTTPS URL (with TLS only).
    #[serde(default, deserialize_with = "opt_socket_addr")]
    pub http_redirect_listen: Option<SocketAddr>,
    /// PEM certificate chain and private key: both listeners speak HTTPS (rustls).
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// `sqlite://PATH` (embedded, default) or `postgres://USER@HOST:PORT/DB` (several nodes on
    /// one database: docs/operating.md "Several nodes on PostgreSQL").
    pub database: String,
    /// Directory of workflow components (`*.wasm`).
    pub workflows: PathBuf,
    /// Where Capstan keeps its own files (component cache).
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub runtime: RuntimeSettings,
    /// Capabilities granted per workflow name: `onboard-domain = ["dns", "certificates"]`.
    pub grants: CapabilityGrants,
    /// Permissions per principal: `[principals.ops] permissions = ["workflows:hello"]`.
    pub principals: std::collections::BTreeMap<String, PrincipalSettings>,
    /// Worker tasks claiming runs on this node.
    pub workers: usize,
    /// How long a node's claim on a run lasts without renewal; a crashed node's runs are taken
    /// over after it.
    pub lease_ms: i64,
    /// Default API key lifetime.
    pub api_key_lifetime_days: i64,
    /// The simulated cloud.
    pub simulator: SimulatorSettings,
    /// Real providers per capability (`[providers.dns] kind = "rfc2136"`, docs/providers.md); a
    /// capability with no table is served by the simulated cloud.
    pub providers: std::collections::BTreeMap<Capability, capstan_adapters::ProviderSettings>,
    /// Per-capability retries of transient provider errors within one call, replacing the
    /// engine's default (4 attempts, 200 ms doubling to 5 s, 20 % jitter):
    /// `[provider_retry.maps] initial_ms = 500, max_ms = 10000, max_attempts = 6`.
    pub provider_retry: std::collections::BTreeMap<Capability, capstan_engine::Backoff>,
    /// Requests per API key: `[rate_limit] requests_per_second = 100, burst = 200` (0 = off).
    pub rate_limit: capstan_api::ratelimit::RateLimit,
    /// An internal HTTP service (a dashboard, say) that `GET /v1/admin/proxy/{*path}` forwards
    /// to, with the caller's principal in `X-Capstan-Principal`.
    pub admin_proxy_upstream: Option<String>,
    /// Open SSE connections this node accepts; one more is answered 503.
    pub stream_connections: usize,
    /// Open SSE connections of any one principal on this node; one more is answered 503.
    pub stream_connections_per_principal: usize,
    /// `[retention]`: how many days audit records, routed outbox events, finished journals and
    /// the simulator's answered tokens are kept (0 = forever).
    pub retention: capstan_store::retention::Retention,
    /// `[connections]`: every listener's connection cap and deadlines (docs/operating.md).
    pub connections: crate::listen::ConnectionLimits,
    /// Outbound webhooks.
    pub webhooks: WebhookSettings,
    /// The partner booking API.
    pub booking: BookingSettings,
}

/// `[booking]`: the partner booking API (docs/partner-api.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BookingSettings {
    /// How long a new booking holds its seats waiting for capture.
    pub capture_window_ms: i64,
    /// Catalog loaded into an empty database at start-up (skipped when the file is missing).
    pub catalog_file: Option<PathBuf>,
    /// Base of the voucher URLs of new bookings.
    pub voucher_base_url: String,
    /// Directory of fulfilment step components (`*.wasm`, world `fulfilment-step`).
    pub steps: PathBuf,
    /// Steps per product type: `[booking.fulfilment] default = [...]`, `by_product_type.EVENT = [...]`.
    pub fulfilment: capstan_booking::fulfilment::Pipelines,
    /// Variant ids the simulated supplier rejects (a permanent failure, for demos and tests).
    pub supplier_rejects: Vec<String>,
    /// How long the simulated supplier, admission and voucher services take to answer once
    /// they have made an effect (0: at once). A slow answer is the window in which a crash
    /// loses an effect's answer but not the effect, for demos and the crash tests.
    pub simulated_answer_ms: u64,
    /// Waits before booking-webhook retries (documented: 5, 10, 20, 20 s).
    pub webhook_retry_waits_ms: Vec<i64>,
    /// Time a booking-webhook receiver has to answer (documented: 45 s).
    pub webhook_timeout_ms: u64,
    /// Requests per partner key: `[booking.rate_limit] requests_per_second = 50, burst = 100`
    /// (0 = off); one more is 429 `E_RATE_LIMITED` with `Retry-After`.
    pub rate_limit: capstan_api::ratelimit::RateLimit,
    /// How long a node holds a fulfilment job it works on without renewing it (it renews every
    /// third of this while a step runs): after a crash, another pass takes the job over once
    /// it lapses.
    pub fulfilment_lease_ms: i64,
    /// The URL partners reach the production partner API at (`https://api.example.com`):
    /// the base of `nextUrl`/`prevUrl`. Unset, the request's `Host` is used.
    pub public_base_url: Option<String>,
    /// The same for the sandbox listener.
    pub sandbox_public_base_url: Option<String>,
}

impl Default for BookingSettings {
    fn default() -> Self {
        let policy = capstan_api::partner::delivery::BookingWebhookPolicy::default();
        Self {
            capture_window_ms: 3_600_000,
            catalog_file: Some(PathBuf::from("examples/catalog/demo.json")),
            voucher_base_url: capstan_booking::BookingConfig::default().voucher_base_url,
            steps: PathBuf::from("./target/steps"),
            fulfilment: capstan_booking::fulfilment::Pipelines::default(),
            supplier_rejects: Vec::new(),
            simulated_answer_ms: 0,
            webhook_retry_waits_ms: policy.retry_waits_ms,
            webhook_timeout_ms: policy.timeout_ms,
            rate_limit: capstan_api::ratelimit::RateLimit {
                requests_per_second: 50.0,
                burst: 100,
            },
            fulfilment_lease_ms: 10_000,
            public_base_url: None,
            sandbox_public_base_url: None,
        }
    }
}

/// `[webhooks]`: delivery behaviour. The two `allow_*` switches exist for tests against a local
/// receiver and are off by default; production never needs them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookSettings {
    /// Delay before each retry, milliseconds (its length bounds the attempts: one more).
    pub retry_schedule_ms: Vec<i64>,
    pub timeout_ms: u64,
    /// Accept loopback callback addresses (tests only).
    pub allow_loopback: bool,
    /// Accept http:// callbacks (tests only).
    pub allow_http: bool,
    /// A CA certificate (PEM file) trusted for callbacks besides the web PKI (tests only).
    pub extra_root_ca: Option<PathBuf>,
    /// Subscriptions one principal may hold (deleted ones do not count); also the most delivery
    /// attempts of one principal in flight, since each subscription has at most one.
    pub max_subscriptions_per_owner: usize,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            retry_schedule_ms: capstan_api::webhooks::DEFAULT_SCHEDULE_MS.to_vec(),
            timeout_ms: 10_000,
            allow_loopback: false,
            allow_http: false,
            extra_root_ca: None,
            max_subscriptions_per_owner: 50,
        }
    }
}

/// A principal's permissions from the config (grants made with `capstan principals grant` add to them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalSettings {
    pub permissions: Vec<String>,
}

/// How the simulated cloud behaves (docs/simulator.md).
pub type SimulatorSettings = capstan_providers::SimulationSettings;

impl Default for Settings {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            sandbox_listen: SocketAddr::from(([127, 0, 0, 1], 8081)),
            http_redirect_listen: None,
            tls_cert: None,
            tls_key: None,
            database: "sqlite://./data/capstan.db".to_owned(),
            workflows: PathBuf::from("./target/workflows"),
            data_dir: PathBuf::from("./data"),
            log_format: LogFormat::Text,
            runtime: RuntimeSettings::default(),
            grants: default_grants(),
            principals: std::collections::BTreeMap::new(),
            workers: 4,
            lease_ms: 30_000,
            api_key_lifetime_days: 90,
            simulator: SimulatorSettings::default(),
            providers: std::collections::BTreeMap::new(),
            provider_retry: std::collections::BTreeMap::new(),
            rate_limit: capstan_api::ratelimit::RateLimit::default(),
            admin_proxy_upstream: None,
            stream_connections: 1_000,
            stream_connections_per_principal: 100,
            retention: capstan_store::retention::Retention::default(),
            connections: crate::listen::ConnectionLimits::default(),
            webhooks: WebhookSettings::default(),
            booking: BookingSettings::default(),
        }
    }
}

fn opt_socket_addr<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<SocketAddr>, D::Error> {
    #[derive(Deserialize)]
    struct Wrapped(#[serde(deserialize_with = "socket_addr")] SocketAddr);
    Ok(Option::<Wrapped>::deserialize(deserializer)?.map(|Wrapped(a)| a))
}

/// A socket address whose parse error repeats the value and shows the expected form.
fn socket_addr<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
    let text = String::deserialize(deserializer)?;
    text.parse().map_err(|_| {
        serde::de::Error::invalid_value(
            serde::de::Unexpected::Str(&text),
            &"an IP address and port such as 127.0.0.1:8080",
        )
    })
}

/// The grants of the workflows Capstan ships; an operator's config replaces an entry it names.
pub fn default_grants() -> CapabilityGrants {
    use Capability::*;
    let entries: [(&str, &[Capability]); 5] = [
        (
            "onboard-domain",
            &[
                Dns,
                Registrar,
                Certificates,
                Cdn,
                Maps,
                Ticketing,
                Convergence,
            ],
        ),
        ("add-certificate", &[Dns, Certificates, Convergence]),
        ("add-domain", &[Dns, Certificates, Cdn, Convergence]),
        ("add-subdomain", &[Dns, Convergence]),
        ("update-function-version", &[Functions]),
    ];
    entries
        .into_iter()
        .map(|(name, caps)| {
            (
                name.to_owned(),
                caps.iter().copied().collect::<BTreeSet<_>>(),
            )
        })
        .collect()
}

/// Flags given on the command line; `None` leaves the lower layers' value.
#[derive(Debug, Default, Serialize)]
pub struct Overrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_redirect_listen: Option<SocketAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflows: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_format: Option<LogFormat>,
}

/// Keys the environment may set (`CAPSTAN_<KEY>`); other `CAPSTAN_*` variables are not settings.
const ENV_KEYS: [&str; 25] = [
    "listen",
    "sandbox_listen",
    "http_redirect_listen",
    "tls_cert",
    "tls_key",
    "database",
    "workflows",
    "data_dir",
    "log_format",
    "runtime",
    "grants",
    "principals",
    "workers",
    "lease_ms",
    "api_key_lifetime_days",
    "simulator",
    "provider_retry",
    "rate_limit",
    "admin_proxy_upstream",
    "stream_connections",
    "stream_connections_per_principal",
    "retention",
    "connections",
    "webhooks",
    "booking",
];

/// The implementation of a capability the host serves itself (convergence, booking, …).
pub const HOST_SERVED: &str = "host";

impl Settings {
    /// What serves `capability`: the kind of its `[providers.*]` table, the simulated cloud for
    /// an infrastructure capability without one, the host for the rest.
    pub fn implementation(&self, capability: Capability) -> &'static str {
        match self.providers.get(&capability) {
            Some(table) => table.kind(),
            None if capstan_providers::INFRASTRUCTURE.contains(&capability) => "simulated",
            None => HOST_SERVED,
        }
    }

    /// Layers defaults, the file, the environment and the flags.
    pub fn load(
        file: Option<&std::path::Path>,
        overrides: &Overrides,
    ) -> Result<Self, Box<figment::Error>> {
        let mut figment = Figment::from(Serialized::defaults(Settings::default()));
        if let Some(file) = file {
            if !file.is_file() {
                return Err(Box::new(figment::Error::from(format!(
                    "config file {} does not exist",
                    file.display()
                ))));
            }
            figment = figment.merge(Toml::file(file));
        }
        let mut from_files = serde_json::Map::new();
        if let Some(url) = secret_var("CAPSTAN_DATABASE").map_err(|e| Box::new(e.into()))? {
            from_files.insert("database".to_owned(), url.into());
        }
        figment
            .merge(
                Env::prefixed("CAPSTAN_")
                    .split("__")
                    .filter(|k| {
                        let key = k.as_str().to_ascii_lowercase();
                        let top = key.split('.').next().unwrap_or_default();
                        ENV_KEYS.contains(&top)
                    })
                    // Read above, from the variable or its file.
                    .ignore(&["database"]),
            )
            .merge(Serialized::defaults(from_files))
            .merge(Serialized::defaults(overrides))
            .extract()
            .map_err(Box::new)
    }
}

/// A secret from the environment: `NAME`, or the contents of the file `NAME_FILE` names (a
/// systemd credential, a container secret), trimmed. Both set, or an unreadable file, is an
/// error naming them; neither is `None`.
pub fn secret_var(name: &str) -> Result<Option<String>, String> {
    let file_var = format!("{name}_FILE");
    match (std::env::var(name), std::env::var_os(&file_var)) {
        (Ok(_), Some(_)) => Err(format!("set {name} or {file_var}, not both")),
        (Ok(value), None) => Ok(Some(value)),
        (Err(_), Some(path)) => std::fs::read_to_string(&path)
            .map(|text| Some(text.trim().to_owned()))
            .map_err(|e| format!("{file_var}: cannot read {}: {e}", path.to_string_lossy())),
        (Err(_), None) => Ok(None),
    }
}

#[cfg(test)]
#[cfg(test)]
#[allow(clippy::result_large_err)]
mod tests {
    use super::*;

    #[test]
    fn per_capability_retry_policies_and_simulator_faults_parse_and_unknown_names_are_refused() {
        figment::Jail::expect_with(|jail| {
            jail.create_file(
                "capstan.toml",
                "[provider_retry.maps]\ninitial_ms = 500\nmax_ms = 10000\nmax_attempts = 6\n[[simulator.faults]]\nop = \"maps.*\"\nerror = \"transient\"\ntimes = 2\n",
            )?;
            let s = Settings::load(
                Some(std::path::Path::new("capstan.toml")),
                &Overrides::default(),
            )
            .map_err(|e| e.to_string())?;
            assert_eq!(s.provider_retry[&Capability::Maps].max_attempts, 6);
            assert_eq!(s.simulator.faults[0].times, Some(2));
            jail.create_file(
                "bad.toml",
                "[provider_retry.teleport]\ninitial_ms = 1\nmax_ms = 1\nmax_attempts = 1\n",
            )?;
            let e = Settings::load(
                Some(std::path::Path::new("bad.toml")),
                &Overrides::default(),
            )
            .unwrap_err();
            assert!(e.to_string().contains("teleport"), "{e}");
            Ok(())
        });
    }

    #[test]
    fn layers_file_then_env_then_flags() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("capstan.toml", "listen = \"127.0.0.1:9000\"\ndatabase = \"sqlite://file.db\"\n[runtime]\nmemory_limit_mib = 16\n[grants]\nhello = [\"dns\"]\n")?;
            jail.set_env("CAPSTAN_DATABASE", "sqlite://env.db");
            jail.set_env("CAPSTAN_RUNTIME__MAX_STACK_KIB", "256");
            jail.set_env("CAPSTAN_PEPPERS", "1:not-a-setting-here");
            let overrides = Overrides {
                workflows: Some("/flag".into()),
                ..Overrides::default()
            };
            let s = Settings::load(Some(std::path::Path::new("capstan.toml")), &overrides)
                .map_err(|e| e.to_string())?;
            assert_eq!(s.listen.port(), 9000);
            assert_eq!(s.database, "sqlite://env.db");
            assert_eq!(s.workflows, PathBuf::from("/flag"));
            assert_eq!(s.runtime.memory_limit_mib, 16);
            assert_eq!(s.runtime.max_stack_kib, 256);
            assert!(s.grants["hello"].contains(&Capability::Dns));
            assert!(
                s.grants.contains_key("onboard-domain"),
                "defaults stay for workflows the file does not name"
            );
            Ok(())
        });
    }

    #[test]
    fn the_database_url_may_come_from_the_file_its_file_variable_names() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("database_url", "postgres://capstan:s3cret@db/capstan\n")?;
            jail.set_env("CAPSTAN_DATABASE_FILE", "database_url");
            let s = Settings::load(None, &Overrides::default()).map_err(|e| e.to_string())?;
            assert_eq!(s.database, "postgres://capstan:s3cret@db/capstan");
            jail.set_env("CAPSTAN_DATABASE", "sqlite://env.db");
            let both = Settings::load(None, &Overrides::default()).unwrap_err();
            assert!(both.to_string().contains("not both"), "{both}");
            Ok(())
        });
    }

    #[test]
    fn a_bad_value_names_the_key_the_value_and_the_expectation() {
        figment::Jail::expect_with(|jail| {
            jail.create_file("bad.toml", "listen = \"not-an-address\"\n")?;
            let err = Settings::load(
                Some(std::path::Path::new("bad.toml")),
                &Overrides::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("listen") && err.contains("not-an-address"),
                "{err}"
            );
            jail.create_file("grant.toml", "[grants]\nhello = [\"dnz\"]\n")?;
            let err = Settings::load(
                Some(std::path::Path::new("grant.toml")),
                &Overrides::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("dnz") && err.contains("grants"), "{err}");
            jail.create_file("typo.toml", "lisen = \"127.0.0.1:1\"\n")?;
            let err = Settings::load(
                Some(std::path::Path::new("typo.toml")),
                &Overrides::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains("lisen"), "{err}");
            Ok(())
        });
    }
}
