//! `kubectl holdfast`: an operator's questions about holdfast, answered from the cluster: is
//! this App pinned, from which cache entry, how fresh, and if not, why (`status`, `explain`);
//! re-resolve now (`refresh`, through the controller); undo (`unpin`); and, for CI pipelines,
//! a file with its references resolved (`pin -f`).
//!
//! Exit status: 0 when all is well, 1 when something needs attention (an unpinned reference,
//! an entry serving stale, a refresh that failed), 2 when the command itself failed.

mod args;
mod cluster;
mod entries;
mod explain;
mod pin_file;
mod refresh;
mod report;
mod status;
mod target;
mod unpin;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

use crate::args::{Cli, Command};

/// What a command found: whether something needs attention (exit status 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Fine,
    NeedsAttention,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // One provider for kube's and the registry client's rustls.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let outcome = match cli.command {
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "kubectl-holdfast",
                &mut std::io::stdout(),
            );
            Ok(Outcome::Fine)
        }
        command => run(&cli.global, command).await,
    };
    match outcome {
        Ok(Outcome::Fine) => ExitCode::SUCCESS,
        Ok(Outcome::NeedsAttention) => ExitCode::from(1),
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(global: &args::Global, command: Command) -> anyhow::Result<Outcome> {
    match command {
        Command::Pin(pin) => pin_file::run(global, &pin).await,
        command => {
            let cluster = cluster::Cluster::connect(global).await?;
            match command {
                Command::Status(status) => status::run(&cluster, &status).await,
                Command::Explain(explain) => explain::run(&cluster, &explain).await,
                Command::Refresh(refresh) => refresh::run(&cluster, &refresh).await,
                Command::Unpin(unpin) => unpin::run(&cluster, &unpin).await,
                Command::Pin(_) | Command::Completion { .. } => unreachable!("handled above"),
            }
        }
    }
}
