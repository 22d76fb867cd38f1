//! `capstan-bench`: runs the benchmarks behind BENCHMARKS.md (release builds only give meaningful
//! figures; `just bench` builds both binaries and runs this one).

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// The `capstan` binary's allocator, so in-process figures match the server's.
#[global_allocator]
static ALLOCATOR: capstan_alloc::Allocator = capstan_alloc::Allocator;

#[derive(Debug, Parser)]
#[command(name = "capstan-bench", version, about)]
struct Args {
    /// The directory of workflow components (`just build-guests` fills `target/workflows`).
    #[arg(long, default_value = "target/workflows")]
    workflows: PathBuf,
    /// A short smoke run (CI).
    #[arg(long)]
    quick: bool,
    /// Run only this section.
    #[arg(long, value_enum, value_name = "SECTION")]
    only: Option<capstan_bench::Section>,
    /// The engine section's stores to run (`sqlite`, `sqlite-normal`, `postgres`, `postgres-tls`; repeat the
    /// flag for several); all of them when absent.
    #[arg(long = "backend", value_name = "STORE")]
    backends: Vec<String>,
    /// Executions per row of the engine section (default 2,000; 100 with `--quick`): more for a
    /// longer steady state to profile.
    #[arg(long, value_name = "N")]
    executions: Option<usize>,
    /// Run the sections this many times and end with each target's figure run by run (the
    /// spread BENCHMARKS.md's targets table reports).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match capstan_bench::run(
        &args.workflows,
        args.quick,
        args.only,
        &args.backends,
        args.executions,
        usize::from(args.runs),
    )
    .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("capstan-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
