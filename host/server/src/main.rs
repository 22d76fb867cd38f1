//! `capstan`: the command line. Every subcommand takes the same `--config`, `--database` and
//! `--workflows` as `serve`, so operators can script it.

use capstan_server::config::{LogFormat, Overrides, Settings};
use capstan_server::registry::Registry;
use capstan_server::{serve, telemetry};
use clap::{Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "capstan",
    version,
    about = "A durable host for infrastructure workflows written as WebAssembly components"
)]
struct Cli {
    /// TOML configuration file (layered over the defaults, under CAPSTAN_* env vars and flags).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Database URL (default sqlite://./data/capstan.db).
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
    },
    /// Run pending database migrations and exit.
    Migrate,
    /// Measure the runtime (release builds only give meaningful figures).
    Bench {
        /// A short smoke run (CI).
        #[arg(long)]
        quick: bool,
    },
    /// Inspect workflow components.
    Workflows {
        #[command(subcommand)]
        command: WorkflowsCommand,
    },
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (listen, sandbox_listen) = match &cli.command {
        Command::Serve {
            listen,
            sandbox_listen,
        } => (*listen, *sandbox_listen),
        _ => (None, None),
    };
    let overrides = Overrides {
        listen,
        sandbox_listen,
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
    telemetry::init(settings.log_format);
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
    match runtime.block_on(run(cli.command, settings)) {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("capstan: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, settings: Settings) -> anyhow::Result<ExitCode> {
    match command {
        Command::Serve { .. } => {
            let app = serve::App::start(&settings).await?;
            let listener = tokio::net::TcpListener::bind(settings.listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
            let sandbox = tokio::net::TcpListener::bind(settings.sandbox_listen)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("cannot listen on {}: {e}", settings.sandbox_listen)
                })?;
            serve::serve(app, listener, sandbox, serve::shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate => {
            let store = capstan_store::Store::open(&settings.database).await?;
            let applied = store.applied_migrations().await?;
            println!(
                "database {} is at migration {}",
                settings.database,
                applied.last().copied().unwrap_or(0)
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench { quick } => {
            capstan_server::bench::run(&settings.workflows, quick).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Workflows {
            command: WorkflowsCommand::List { json },
        } => {
            let registry = Registry::load(&settings).await?;
            let summaries = registry.summaries();
            if json {
                let body = serde_json::json!({"workflows": summaries, "failedWorkflows": registry.failures});
                println!("{}", serde_json::to_string_pretty(&body)?);
            } else {
                println!(
                    "{:<26} {:<9} {:<14} {:<40} STAGES",
                    "NAME", "VERSION", "DIGEST", "CAPABILITIES"
                );
                for w in &summaries {
                    println!(
                        "{:<26} {:<9} {:<14} {:<40} {}",
                        w.name,
                        w.version,
                        &w.digest[..12],
                        if w.capabilities.is_empty() {
                            "-".to_owned()
                        } else {
                            w.capabilities.join(",")
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
