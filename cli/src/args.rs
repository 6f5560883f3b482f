//! The command line.

use std::{path::PathBuf, time::Duration};

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-holdfast",
    bin_name = "kubectl holdfast",
    version,
    about = "What holdfast pinned, and why not; refresh, unpin, and pin files for CI",
    after_help = "Exit status: 0 all is well, 1 something needs attention, 2 the command failed."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct Global {
    /// The kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or in-cluster).
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The namespace holdfast runs in (its DigestCacheEntry objects live there).
    #[arg(long, global = true, default_value = "holdfast-system")]
    pub holdfast_namespace: String,
    /// holdfast's MutatingWebhookConfiguration (its namespaceSelector says which namespaces are
    /// served).
    #[arg(long, global = true, default_value = "holdfast")]
    pub webhook_configuration: String,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per namespace: objects pinned, unpinned, pinned from stale entries, pinned to the mirror,
    /// opted out or ignored; entries serving stale and how long they may. Exits 1 when
    /// something needs attention.
    Status(Status),
    /// Each fetch reference of one object: as written, as stored, the cache entry it came from,
    /// the last holdfast Events, and why it is or is not pinned.
    Explain(Explain),
    /// Re-resolve now, through the controller (the entry's holdfast.dev/refresh annotation),
    /// and wait for the result.
    Refresh(Refresh),
    /// Put back the references holdfast pinned (from holdfast.dev/original-refs) and opt the
    /// object out with the label holdfast.dev/pin=disabled.
    Unpin(Unpin),
    /// Print a file with its Carvel fetch references resolved to digests (for CI pipelines).
    Pin(Pin),
    /// Shell completion for bash, zsh, fish, elvish or powershell.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// Which namespaces: one (`-n`, default `default`) or all (`-A`).
#[derive(Debug, Args, Clone)]
pub struct Namespaces {
    /// The namespace.
    #[arg(short, long, conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

impl Namespaces {
    /// `None` for every namespace.
    pub fn one(&self) -> Option<&str> {
        if self.all_namespaces {
            None
        } else {
            Some(self.namespace.as_deref().unwrap_or("default"))
        }
    }
}

#[derive(Debug, Args)]
pub struct Status {
    #[command(flatten)]
    pub namespaces: Namespaces,
}

#[derive(Debug, Args)]
pub struct Explain {
    /// KIND/NAME: app/NAME, packagerepository/NAME (pkgr), package/NAME (pkg).
    pub target: String,
    /// The object's namespace.
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
}

#[derive(Debug, Args)]
pub struct Refresh {
    /// KIND/NAME (every reference it names) or an image reference (every entry of it).
    pub target: String,
    /// The object's namespace (for KIND/NAME).
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
    /// How long to wait for the controller to act.
    #[arg(long, value_parser = humantime_secs, default_value = "60")]
    pub timeout: Duration,
}

#[derive(Debug, Args)]
pub struct Unpin {
    /// KIND/NAME; or --all.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub target: Option<String>,
    /// Every App, PackageRepository and Package of the namespace (or, with -A, the cluster).
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub namespaces: Namespaces,
}

#[derive(Debug, Args)]
pub struct Pin {
    /// The YAML file (`-`: standard input).
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// Resolve through the registries instead of the cluster's digest cache (the default when no
    /// kubeconfig is found).
    #[arg(long, conflicts_with = "cluster")]
    pub registry: bool,
    /// Resolve from the cluster's digest cache only (the default when a kubeconfig is found).
    #[arg(long)]
    pub cluster: bool,
    /// Registries (`host[:port]`) spoken to over plain HTTP, with --registry.
    #[arg(long = "insecure-registry")]
    pub insecure_registries: Vec<String>,
    /// The namespace of objects that name none (their secretRef's scope).
    #[arg(short, long, default_value = "default")]
    pub namespace: String,
}

/// Seconds, as a whole number (`60`), or with a unit (`90s`, `5m`).
fn humantime_secs(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text.strip_suffix('m') {
        Some(minutes) => (minutes, 60),
        None => (text.strip_suffix('s').unwrap_or(text), 1),
    };
    number
        .parse::<u64>()
        .map(|n| Duration::from_secs(n * unit))
        .map_err(|_| format!("{text:?} is not a duration: give seconds (60, 90s) or minutes (5m)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn timeouts_read_seconds_and_minutes() {
        assert_eq!(humantime_secs("60"), Ok(Duration::from_secs(60)));
        assert_eq!(humantime_secs("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(humantime_secs("5m"), Ok(Duration::from_secs(300)));
        assert!(humantime_secs("soon").is_err());
    }
}
