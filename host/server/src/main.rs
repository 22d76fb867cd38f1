//! `capstan`: the command line. Every subcommand takes the same `--config`, `--database` and
//! `--workflows` as `serve`, so operators can script it.

use capstan_server::config::{LogFormat, Overrides, Settings};
use capstan_server::registry::Registry;
use capstan_server::{client, serve, telemetry};
use clap::{CommandFactory as _, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: an execution allocates and frees many small values across
/// threads (JSON, statements, futures), where glibc's arenas spent ~10 % of the workers' time
/// (`malloc_consolidate`, `_int_free` in a profile; BENCHMARKS.md). Called as `host/alloc`
/// explains, not through the `mimalloc` crate's allocator.
#[global_allocator]
static ALLOCATOR: capstan_alloc::Allocator = capstan_alloc::Allocator;

#[derive(Debug, Parser)]
#[command(
    name = "capstan",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("CAPSTAN_COMMIT"), ")"),
    about = "A durable host for infrastructure workflows written as WebAssembly components"
)]
struct Cli {
    /// TOML configuration file (layered over the defaults, under CAPSTAN_* env vars and flags).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Database URL: sqlite://PATH (default sqlite://./data/capstan.db) or postgres://USER@HOST/DB.
    #[arg(long, global = true, value_name = "URL")]
    database: Option<String>,
    /// Directory of workflow components (default ./target/workflows).
    #[arg(long, global = true, value_name = "DIR")]
    workflows: Option<PathBuf>,
    /// Directory for Capstan's own files, such as the compiled-component cache (default ./data).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the APIs.
    Serve {
        /// Main listener (default 127.0.0.1:8080).
        #[arg(long, value_name = "ADDR")]
        listen: Option<SocketAddr>,
        /// Sandbox listener (default 127.0.0.1:8081).
        #[arg(long, value_name = "ADDR")]
        sandbox_listen: Option<SocketAddr>,
        /// PEM certificate chain: both listeners speak HTTPS (with --tls-key).
        #[arg(long, value_name = "FILE")]
        tls_cert: Option<PathBuf>,
        /// PEM private key of --tls-cert.
        #[arg(long, value_name = "FILE")]
        tls_key: Option<PathBuf>,
        /// A plain-HTTP listener answering 301 to the HTTPS URL (with TLS).
        #[arg(long, value_name = "ADDR")]
        http_redirect_listen: Option<SocketAddr>,
    },
    /// Run pending database migrations and exit.
    Migrate,
    /// Mint, list and revoke API keys.
    ApiKeys {
        #[command(subcommand)]
        command: ApiKeysCommand,
    },
    /// Grant, revoke and show principals' permissions.
    Principals {
        #[command(subcommand)]
        command: PrincipalsCommand,
    },
    /// Inspect workflow components.
    Workflows {
        #[command(subcommand)]
        command: WorkflowsCommand,
    },
    /// Create, list and revoke partners of the booking API (docs/partner-api.md).
    Partners {
        #[command(subcommand)]
        command: PartnersCommand,
    },
    /// Load the partner catalog (docs/catalog-format.md).
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
    /// Seed and inspect the simulated cloud (docs/simulator.md).
    Simulator {
        #[command(subcommand)]
        command: SimulatorCommand,
    },
    /// Certificates the ACME provider obtained (docs/providers.md).
    Certificates {
        #[command(subcommand)]
        command: CertificatesCommand,
    },
    /// Executions on a running server, through its /v1 API (an API key, not the database).
    Executions {
        #[command(flatten)]
        remote: client::RemoteArgs,
        #[command(subcommand)]
        command: ExecutionsCommand,
    },
    /// Trigger a workflow on a running server; with --wait, follow it to its end (the exit
    /// status tells how it ended: 0 succeeded, 3 failed, 4 canceled or rolled back, 5 paused or
    /// waiting).
    Trigger {
        #[command(flatten)]
        remote: client::RemoteArgs,
        /// The workflow, as loaded by the server (`capstan workflows list`).
        workflow: String,
        /// The trigger body: a JSON file, or - for standard input.
        #[arg(long, value_name = "FILE")]
        input: PathBuf,
        /// Makes the trigger safe to retry: the same key and body answer the same execution
        /// (default: a new key, so every run of the command is a new execution).
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Follow the execution, stage by stage, until it ends, waits or pauses.
        #[arg(long)]
        wait: bool,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to standard output.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) to standard output: `capstan man | man -l -`.
    Man,
}

#[derive(Debug, Subcommand)]
enum ExecutionsCommand {
    /// Executions newest first, of the workflows the key may use.
    List {
        /// Only this workflow.
        #[arg(long)]
        workflow: Option<String>,
        /// Only this status (queued, running, waiting, paused, succeeded, failed, canceled,
        /// rolled_back).
        #[arg(long)]
        status: Option<String>,
        /// Only executions requested by this principal.
        #[arg(long)]
        principal: Option<String>,
        /// At most this many (1-100).
        #[arg(long, default_value_t = 20)]
        limit: u32,
    },
    /// One execution: its status, stages and outcome.
    Show {
        /// The execution id.
        id: String,
    },
    /// Follow an execution stage by stage until it ends, waits or pauses (exit status as for
    /// `trigger --wait`).
    Watch {
        /// The execution id.
        id: String,
    },
    /// The execution's events, in order.
    Events {
        /// The execution id.
        id: String,
    },
    /// Cancel an execution (or request its cancellation, when a worker holds it).
    Cancel {
        /// The execution id.
        id: String,
    },
    /// Resume a paused execution from the call that failed.
    Resume {
        /// The execution id.
        id: String,
    },
    /// Roll an execution back: compensate what it did, newest first.
    Rollback {
        /// The execution id.
        id: String,
    },
    /// Approve the plan an execution waits on (add-subdomain).
    Approve {
        /// The execution id.
        id: String,
        /// The hash of the plan you reviewed (`GET /v1/executions/{id}/plan`): a plan that
        /// changed since is refused.
        #[arg(long)]
        plan_hash: String,
    },
}

#[derive(Debug, Subcommand)]
enum CertificatesCommand {
    /// Write an issued certificate's chain (`fullchain.pem`) and private key (`privkey.pem`, mode
    /// 0600) into DIR: the one way a key leaves Capstan's sealed store.
    Export {
        /// The certificate's arn (its ACME order URL).
        arn: String,
        /// Directory to write into (created if missing).
        #[arg(long)]
        out: std::path::PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum SimulatorCommand {
    /// Add the zones, records, domains, certificates, maps keys, tickets and functions of a seed
    /// file (JSON) to the simulation.
    Seed { file: std::path::PathBuf },
    /// Print the simulated state as JSON.
    Show,
}

#[derive(Debug, Subcommand)]
enum PartnersCommand {
    /// Create a partner; prints only its key on stdout (shown once): `pk_…` production, `tk_…` sandbox.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long = "type", value_parser = ["affiliate", "booking"])]
        partner_type: String,
        #[arg(long, value_parser = ["production", "sandbox"])]
        environment: String,
    },
    /// List partners (no keys).
    List,
    /// Revoke a partner's key; effective for the next request.
    Revoke { partner_id: String },
}

#[derive(Debug, Subcommand)]
enum CatalogCommand {
    /// Validate a catalog file and replace the served catalog with it (all problems are listed;
    /// nothing changes when there is one). Running servers pick it up within a second.
    Import {
        file: PathBuf,
        /// Only validate.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
enum ApiKeysCommand {
    /// Mint a key; prints only the plaintext key on stdout (shown once).
    Mint {
        #[arg(long)]
        principal: String,
        #[arg(long)]
        expires_in_days: Option<i64>,
    },
    /// List a principal's keys (metadata only).
    List {
        #[arg(long)]
        principal: String,
    },
    /// Revoke a key by id; effective for the next request.
    Revoke { api_key_id: String },
}

#[derive(Debug, Subcommand)]
enum PrincipalsCommand {
    /// Grant a permission (e.g. workflows:onboard-domain, principals:manage, audit:read).
    Grant {
        principal: String,
        permission: String,
    },
    /// Revoke a granted permission.
    Revoke {
        principal: String,
        permission: String,
    },
    /// Show a principal's permissions (config and grants).
    Show { principal: String },
}

#[derive(Debug, Subcommand)]
enum WorkflowsCommand {
    /// List the components of the workflows directory: name, version, digest, stages, capabilities,
    /// and the files that failed to load with the reason.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Replay the journals of the runs in flight against the candidate builds in DIR and report
    /// which runs each candidate could adopt and which would diverge (exit status 4 if any).
    Check {
        dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (listen, sandbox_listen, tls_cert, tls_key, http_redirect_listen) = match &cli.command {
        Command::Serve {
            listen,
            sandbox_listen,
            tls_cert,
            tls_key,
            http_redirect_listen,
        } => (
            *listen,
            *sandbox_listen,
            tls_cert.clone(),
            tls_key.clone(),
            *http_redirect_listen,
        ),
        _ => (None, None, None, None, None),
    };
    let overrides = Overrides {
        listen,
        sandbox_listen,
        tls_cert,
        tls_key,
        http_redirect_listen,
        database: cli.database.clone(),
        workflows: cli.workflows.clone(),
        data_dir: cli.data_dir.clone(),
        log_format: cli.log_format,
    };
    let settings = match Settings::load(cli.config.as_deref(), &overrides) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("capstan: invalid configuration: {error}");
            return ExitCode::from(2);
        }
    };
    let telemetry = telemetry::init(settings.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("capstan: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(run(cli.command, settings)) {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("capstan: {error:#}");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

fn valid_permission(p: &str) -> bool {
    matches!(
        p,
        "subscriptions:manage" | "principals:manage" | "audit:read" | "admin:read" | "admin:write"
    ) || p.strip_prefix("workflows:").is_some_and(|w| {
        !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    })
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { .. } => {
            let app = serve::App::start(&settings, serve::peppers()?).await?;
            let listener = tokio::net::TcpListener::bind(settings.listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
            let sandbox = tokio::net::TcpListener::bind(settings.sandbox_listen)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("cannot listen on {}: {e}", settings.sandbox_listen)
                })?;
            let redirect = match settings.http_redirect_listen {
                Some(addr) => {
                    anyhow::ensure!(
                        app.tls.is_some(),
                        "--http-redirect-listen needs TLS (--tls-cert and --tls-key)"
                    );
                    Some(
                        tokio::net::TcpListener::bind(addr)
                            .await
                            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?,
                    )
                }
                None => None,
            };
            serve::serve(app, listener, sandbox, redirect, serve::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Executions { remote, command } => {
            executions(&client::Remote::new(&remote)?, command).await
        }
        Command::Trigger {
            remote,
            workflow,
            input,
            idempotency_key,
            wait,
        } => {
            let remote = client::Remote::new(&remote)?;
            let body = client::read_input(&input)?;
            let key = idempotency_key.unwrap_or_else(capstan_core::ids::new_id);
            let answer = remote
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/workflows/{workflow}"),
                    Some(&body),
                    &[("Idempotency-Key", key.as_str())],
                )
                .await?;
            let id = answer["executionId"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if !wait {
                remote.print(&answer, |a| {
                    format!(
                        "{id}: {} ({})",
                        a["status"].as_str().unwrap_or_default(),
                        a["workflow"].as_str().unwrap_or_default()
                    )
                });
                return Ok(ExitCode::SUCCESS);
            }
            if !remote.json {
                println!("{id}: triggered ({workflow})");
            }
            let end = client::watch(&remote, &id).await?;
            Ok(client::exit_for(end["status"].as_str().unwrap_or_default()))
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "capstan",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let store = capstan_store::Store::open(&settings.database).await?;
            capstan_booking::migrate(&store).await?;
            let applied = store.applied_migrations().await?;
            let booking = capstan_booking::applied_migrations(&store).await?;
            println!(
                "database {} is at migration {} (booking {})",
                settings.database,
                applied.last().copied().unwrap_or(0),
                booking.last().copied().unwrap_or(0)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::ApiKeys { command } => {
            let store = capstan_store::Store::open(&settings.database).await?;
            let now = capstan_core::Clock::now_millis(&capstan_core::SystemClock) as i64;
            match command {
                ApiKeysCommand::Mint {
                    principal,
                    expires_in_days,
                } => {
                    let config = capstan_api::ApiConfig {
                        peppers: serve::peppers()?,
                        principals: Default::default(),
                        key_lifetime_days: settings.api_key_lifetime_days,
                        rate_limit: settings.rate_limit,
                    };
                    let minted = capstan_api::mint_key(
                        &store,
                        &config,
                        now,
                        &principal,
                        expires_in_days,
                        None,
                    )
                    .await?;
                    println!("{}", minted.plaintext);
                }
                ApiKeysCommand::List { principal } => {
                    for k in store.api_keys_of(&principal).await? {
                        let state = if k.revoked_ms.is_some() {
                            "revoked"
                        } else if k.expires_ms <= now {
                            "expired"
                        } else {
                            "active"
                        };
                        println!(
                            "{}  {}  {}  expires {}  {state}",
                            k.id,
                            k.prefix,
                            k.principal_id,
                            capstan_api::views::rfc3339(k.expires_ms)
                        );
                    }
                }
                ApiKeysCommand::Revoke { api_key_id } => {
                    anyhow::ensure!(
                        store.revoke_api_key(&api_key_id, now).await?,
                        "no API key {api_key_id}"
                    );
                    eprintln!("revoked {api_key_id}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Principals { command } => {
            let store = capstan_store::Store::open(&settings.database).await?;
            match command {
                PrincipalsCommand::Grant {
                    principal,
                    permission,
                } => {
                    anyhow::ensure!(
                        capstan_api::auth::valid_principal(&principal),
                        "`{principal}` is not a valid principal id"
                    );
                    anyhow::ensure!(
                        valid_permission(&permission),
                        "unknown permission `{permission}` (workflows:<name>, subscriptions:manage, principals:manage, audit:read, admin:read, admin:write)"
                    );
                    store.grant(&principal, &permission).await?;
                    eprintln!("granted {permission} to {principal}");
                }
                PrincipalsCommand::Revoke {
                    principal,
                    permission,
                } => {
                    anyhow::ensure!(
                        store.revoke_grant(&principal, &permission).await?,
                        "{principal} has no grant {permission}"
                    );
                    eprintln!("revoked {permission} from {principal}");
                }
                PrincipalsCommand::Show { principal } => {
                    let configured = settings
                        .principals
                        .get(&principal)
                        .map(|p| p.permissions.clone())
                        .unwrap_or_default();
                    for p in configured {
                        println!("{p}\tconfig");
                    }
                    for p in store.grants_of(&principal).await? {
                        println!("{p}\tgrant");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Partners { command } => {
            let store = capstan_store::Store::open(&settings.database).await?;
            let bookings = capstan_booking::Bookings::open(
                store,
                std::sync::Arc::new(capstan_core::SystemClock),
                capstan_booking::BookingConfig::default(),
            )
            .await?;
            match command {
                PartnersCommand::Create {
                    name,
                    partner_type,
                    environment,
                } => {
                    let partner_type = capstan_booking::partners::PartnerType::parse(&partner_type)
                        .ok_or_else(|| anyhow::anyhow!("--type must be affiliate or booking"))?;
                    let environment = capstan_booking::Environment::parse(&environment)
                        .ok_or_else(|| {
                            anyhow::anyhow!("--environment must be production or sandbox")
                        })?;
                    let (record, key) = capstan_api::partner::create_partner(
                        &bookings,
                        &serve::peppers()?,
                        &name,
                        partner_type,
                        environment,
                    )
                    .await?;
                    eprintln!(
                        "created {} partner {} ({}) in {}",
                        record.partner_type.as_str(),
                        record.id,
                        record.name,
                        record.environment.as_str()
                    );
                    println!("{key}");
                }
                PartnersCommand::List => {
                    for p in bookings
                        .list_partners()
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?
                    {
                        println!(
                            "{}  {}  {}  {}  {}  {}",
                            p.id,
                            p.key_prefix,
                            p.partner_type.as_str(),
                            p.environment.as_str(),
                            if p.revoked_ms.is_some() {
                                "revoked"
                            } else {
                                "active"
                            },
                            p.name
                        );
                    }
                }
                PartnersCommand::Revoke { partner_id } => {
                    anyhow::ensure!(
                        bookings
                            .revoke_partner(&partner_id)
                            .await
                            .map_err(|e| anyhow::anyhow!("{e}"))?,
                        "no active partner {partner_id}"
                    );
                    eprintln!("revoked partner {partner_id}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Catalog {
            command: CatalogCommand::Import { file, dry_run },
        } => {
            let text = std::fs::read_to_string(&file)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            if dry_run {
                return match capstan_booking::catalog::Catalog::parse(&text) {
                    Ok(c) => {
                        println!(
                            "{}: valid ({} products)",
                            file.display(),
                            c.file.products.len()
                        );
                        Ok(ExitCode::SUCCESS)
                    }
                    Err(e) => {
                        eprintln!("capstan: {}: {e}", file.display());
                        Ok(ExitCode::from(3))
                    }
                };
            }
            let store = capstan_store::Store::open(&settings.database).await?;
            let bookings = capstan_booking::Bookings::open(
                store,
                std::sync::Arc::new(capstan_core::SystemClock),
                capstan_booking::BookingConfig::default(),
            )
            .await?;
            match bookings.import_catalog(&text).await {
                Ok(imported) => {
                    println!(
                        "imported {}: {} products, {} variants (digest {}{})",
                        file.display(),
                        imported.products,
                        imported.variants,
                        &imported.digest[..12],
                        if imported.unchanged {
                            ", unchanged"
                        } else {
                            ""
                        }
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("capstan: {}: {e}", file.display());
                    Ok(ExitCode::from(3))
                }
            }
        }
        Command::Simulator { command } => {
            let store = capstan_store::Store::open(&settings.database).await?;
            let cloud = capstan_providers::SimulatedCloud::new(
                &store,
                std::sync::Arc::new(capstan_core::SystemClock),
                settings.simulator.clone(),
            )
            .await?;
            if let SimulatorCommand::Seed { file } = &command {
                cloud.seed(&capstan_providers::Seed::read(file)?).await?;
                eprintln!("seeded the simulated cloud from {}", file.display());
            }
            println!(
                "{}",
                serde_json::to_string_pretty(&cloud.snapshot().await?)?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Certificates {
            command: CertificatesCommand::Export { arn, out },
        } => {
            let store = capstan_store::Store::open(&settings.database).await?;
            let keyring = capstan_server::serve::secret_keys()?;
            let (chain, key) = capstan_adapters::acme::export(&store, &keyring, &arn)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            std::fs::create_dir_all(&out)?;
            std::fs::write(out.join("fullchain.pem"), chain)?;
            let key_path = out.join("privkey.pem");
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                options.mode(0o600);
            }
            std::io::Write::write_all(&mut options.open(&key_path)?, key.as_bytes())?;
            eprintln!(
                "wrote {} and {}",
                out.join("fullchain.pem").display(),
                key_path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Workflows {
            command: WorkflowsCommand::Check { dir, json },
        } => {
            let candidates = Registry::load(&Settings {
                workflows: dir.clone(),
                ..settings.clone()
            })
            .await?;
            for f in &candidates.failures {
                eprintln!("FAILED {}: {}", f.file, f.error);
            }
            let store = capstan_store::Store::open(&settings.database).await?;
            let engine = capstan_engine::Engine::new(
                std::sync::Arc::new(store),
                candidates.runtime.clone(),
                std::sync::Arc::new(capstan_providers::ProviderSet::default()),
                std::sync::Arc::new(capstan_core::SystemClock),
                capstan_engine::EngineConfig::default(),
            );
            let mut report = Vec::new();
            for candidate in candidates.workflows.values() {
                for check in engine.check_candidate(candidate.clone()).await? {
                    report.push((candidate.descriptor.name.clone(), check));
                }
            }
            let diverging = report
                .iter()
                .filter(|(_, c)| c.verdict == "diverges")
                .count();
            if json {
                let runs: Vec<_> = report
                    .iter()
                    .map(|(w, c)| serde_json::json!({"workflow": w, "check": c}))
                    .collect();
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &serde_json::json!({"runs": runs, "diverging": diverging})
                    )?
                );
            } else {
                println!(
                    "{:<26} {:<38} {:<9} {:<9} VERDICT",
                    "WORKFLOW", "EXECUTION", "STATUS", "REPLAYED"
                );
                for (w, c) in &report {
                    println!(
                        "{:<26} {:<38} {:<9} {:<9} {}{}",
                        w,
                        c.execution_id,
                        c.status.as_str(),
                        format!("{}/{}", c.replayed, c.journal_length),
                        c.verdict,
                        c.detail
                            .as_ref()
                            .map(|d| format!(": {d}"))
                            .unwrap_or_default()
                    );
                }
                println!("{} run(s) checked, {diverging} would diverge", report.len());
            }
            Ok(if diverging == 0 && candidates.failures.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(4)
            })
        }
        Command::Workflows {
            command: WorkflowsCommand::List { json },
        } => {
            let registry = Registry::load(&settings).await?;
            let summaries = registry.summaries(|c| settings.implementation(c));
            if json {
                let body = serde_json::json!({"workflows": summaries, "failedWorkflows": registry.failures});
                println!("{}", serde_json::to_string_pretty(&body)?);
            } else {
                println!(
                    "{:<26} {:<9} {:<14} {:<60} STAGES",
                    "NAME", "VERSION", "DIGEST", "CAPABILITIES (IMPLEMENTATION)"
                );
                for w in &summaries {
                    let grants: Vec<String> = w
                        .capabilities
                        .iter()
                        .map(|g| format!("{}={}", g.name, g.implementation))
                        .collect();
                    println!(
                        "{:<26} {:<9} {:<14} {:<60} {}",
                        w.name,
                        w.version,
                        &w.digest[..12],
                        if grants.is_empty() {
                            "-".to_owned()
                        } else {
                            grants.join(",")
                        },
                        w.stages.join(" → ")
                    );
                }
                for f in &registry.failures {
                    println!("FAILED {}: {}", f.file, f.error);
                }
            }
            Ok(if registry.failures.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(3)
            })
        }
    }
}

/// `capstan executions …`: one API call each (a watch, a series of awaits).
async fn executions(
    remote: &client::Remote,
    command: ExecutionsCommand,
) -> anyhow::Result<ExitCode> {
    let control = async |id: &str, what: &str, body: Option<serde_json::Value>| {
        let answer = remote
            .post(&format!("/v1/executions/{id}/{what}"), body.as_ref())
            .await?;
        remote.print(&answer, |a| {
            let execution = &a["execution"];
            let status = a["status"]
                .as_str()
                .or_else(|| execution["status"].as_str())
                .unwrap_or_default();
            format!("{id}: {status}")
        });
        anyhow::Ok(ExitCode::SUCCESS)
    };
    match command {
        ExecutionsCommand::List {
            workflow,
            status,
            principal,
            limit,
        } => {
            let mut query = vec![format!("limit={limit}")];
            for (name, value) in [
                ("workflow", workflow),
                ("status", status),
                ("principalId", principal),
            ] {
                if let Some(value) = value {
                    query.push(format!("{name}={}", url_encode(&value)));
                }
            }
            let page = remote
                .get(&format!("/v1/executions?{}", query.join("&")))
                .await?;
            remote.print(&page, client::list);
            Ok(ExitCode::SUCCESS)
        }
        ExecutionsCommand::Show { id } => {
            let execution = remote.get(&format!("/v1/executions/{id}")).await?;
            remote.print(&execution, client::show);
            Ok(ExitCode::SUCCESS)
        }
        ExecutionsCommand::Watch { id } => {
            let end = client::watch(remote, &id).await?;
            Ok(client::exit_for(end["status"].as_str().unwrap_or_default()))
        }
        ExecutionsCommand::Events { id } => {
            let events = remote.get(&format!("/v1/executions/{id}/events")).await?;
            remote.print(&events, client::events);
            Ok(ExitCode::SUCCESS)
        }
        ExecutionsCommand::Cancel { id } => control(&id, "cancel", None).await,
        ExecutionsCommand::Resume { id } => control(&id, "resume", None).await,
        ExecutionsCommand::Rollback { id } => control(&id, "rollback", None).await,
        ExecutionsCommand::Approve { id, plan_hash } => {
            control(
                &id,
                "plan/approve",
                Some(serde_json::json!({"planHash": plan_hash})),
            )
            .await
        }
    }
}

/// A query parameter's value, percent-encoded.
fn url_encode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}
