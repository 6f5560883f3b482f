//! Command-line flags (each also an environment variable) of `holdfast-webhook`.

use std::{net::IpAddr, net::SocketAddr, path::PathBuf, time::Duration};

use clap::Parser;
use holdfast_runtime::logs::LogFormat;

#[derive(Debug, Clone, Parser)]
#[command(name = "holdfast-webhook", version, about = "holdfast's admission webhook")]
pub struct Args {
    /// Address of the TLS admission port.
    #[arg(long, env = "HOLDFAST_WEBHOOK_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Address of the plain-HTTP admin port (/healthz, /readyz, /metrics).
    #[arg(long, env = "HOLDFAST_ADMIN_ADDR", default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Answer within this many milliseconds; past it, admit unchanged (below the manifests' 5 s timeoutSeconds).
    #[arg(long, env = "HOLDFAST_DEADLINE_MS", default_value_t = 3000)]
    pub deadline_ms: u64,
    /// Largest AdmissionReview body accepted; larger ones get 413.
    #[arg(long, env = "HOLDFAST_BODY_LIMIT_BYTES", default_value_t = crate::handler::DEFAULT_BODY_LIMIT)]
    pub body_limit_bytes: usize,
    /// Bytes of admission bodies read or decided at once (at least --body-limit-bytes); past
    /// it a request waits up to the deadline, then gets 503.
    #[arg(long, env = "HOLDFAST_IN_FLIGHT_BYTES", default_value_t = crate::handler::DEFAULT_IN_FLIGHT_BYTES)]
    pub in_flight_bytes: usize,
    /// Log format.
    #[arg(long, env = "HOLDFAST_LOG_FORMAT", value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
    /// Seconds in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = "HOLDFAST_DRAIN_SECONDS", default_value_t = 10)]
    pub drain_seconds: u64,
    /// Seconds the server keeps accepting after SIGTERM, unready, before it drains: the pod's
    /// endpoint leaves the Service's EndpointSlice and then every node's kube-proxy rules only
    /// after the kubelet has signalled, and a call routed to it meanwhile would be refused (an
    /// admission failed, or with `failurePolicy: Ignore` let through unpinned).
    #[arg(long, env = "HOLDFAST_SHUTDOWN_DELAY_SECONDS", default_value_t = 5)]
    pub shutdown_delay_seconds: u64,
    /// Delete the webhook configurations --mutating-webhook-configurations and
    /// --validating-webhook-configurations name, then exit (the chart's `pre-delete` hook, so
    /// that `helm uninstall` removes them before the Service and the pods).
    #[arg(long, env = "HOLDFAST_REMOVE_WEBHOOK_CONFIGURATIONS")]
    pub remove_webhook_configurations: bool,

    /// Policy file (YAML): allowedRegistries, requireDigestsLabel, mode (enforce|audit). Without
    /// one, the validating policy admits everything.
    #[arg(long, env = "HOLDFAST_POLICY_FILE")]
    pub policy_file: Option<PathBuf>,

    #[command(flatten)]
    pub tls: TlsArgs,

    #[command(flatten)]
    pub registry: holdfast_runtime::args::RegistryArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct TlsArgs {
    /// Serving certificate file (PEM), e.g. mounted by cert-manager. With --tls-key-file this
    /// selects file mode: the pair is re-read when its contents change. Without, holdfast manages
    /// its own CA and certificate in --tls-secret.
    #[arg(long, env = "HOLDFAST_TLS_CERT_FILE", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Serving key file (PEM), with --tls-cert-file.
    #[arg(long, env = "HOLDFAST_TLS_KEY_FILE", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,
    /// How often file mode checks the files for changes.
    #[arg(long, env = "HOLDFAST_TLS_POLL_SECONDS", default_value_t = 30)]
    pub tls_poll_seconds: u64,

    /// Secret holding the CA, the serving certificate and the caBundle (self-managed mode).
    #[arg(long, env = "HOLDFAST_TLS_SECRET", default_value = "holdfast-webhook-tls")]
    pub tls_secret: String,
    /// holdfast's own namespace (the Secret's).
    #[arg(long, env = "POD_NAMESPACE", default_value = "holdfast-system")]
    pub namespace: String,
    /// The Service in front of the webhook; the certificate names <service>.<namespace>.svc.
    #[arg(long, env = "HOLDFAST_SERVICE_NAME", default_value = "holdfast-webhook")]
    pub service_name: String,
    /// Extra IP addresses in the certificate (e.g. 127.0.0.1 for a webhook registered by URL).
    #[arg(long = "tls-ip", env = "HOLDFAST_TLS_IPS", value_delimiter = ',')]
    pub tls_ips: Vec<IpAddr>,
    /// MutatingWebhookConfigurations whose caBundle holdfast keeps current.
    #[arg(
        long,
        env = "HOLDFAST_MUTATING_WEBHOOK_CONFIGURATIONS",
        value_delimiter = ',',
        default_value = "holdfast"
    )]
    pub mutating_webhook_configurations: Vec<String>,
    /// ValidatingWebhookConfigurations whose caBundle holdfast keeps current (the manifests name
    /// `holdfast`).
    #[arg(
        long,
        env = "HOLDFAST_VALIDATING_WEBHOOK_CONFIGURATIONS",
        value_delimiter = ','
    )]
    pub validating_webhook_configurations: Vec<String>,
    /// Seconds both the old and the new CA are published before the certificate moves to the new CA.
    #[arg(long, env = "HOLDFAST_CA_OVERLAP_SECONDS", default_value_t = 3600)]
    pub ca_overlap_seconds: u64,
    /// How often each replica checks whether a certificate is due for renewal.
    #[arg(long, env = "HOLDFAST_CERT_RECHECK_SECONDS", default_value_t = 600)]
    pub cert_recheck_seconds: u64,
}

impl Args {
    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_parse() {
        let args = Args::try_parse_from(["holdfast-webhook"]).unwrap();
        assert_eq!(args.addr.port(), 8443);
        assert_eq!(args.deadline(), Duration::from_secs(3));
        assert!(args.tls.tls_cert_file.is_none());
        assert_eq!(args.tls.mutating_webhook_configurations, ["holdfast"]);
    }

    #[test]
    fn file_mode_needs_both_files() {
        assert!(Args::try_parse_from(["holdfast-webhook", "--tls-cert-file", "c.pem"]).is_err());
        let args =
            Args::try_parse_from(["x", "--tls-cert-file", "c.pem", "--tls-key-file", "k.pem"]).unwrap();
        assert!(args.tls.tls_key_file.is_some());
    }
}
