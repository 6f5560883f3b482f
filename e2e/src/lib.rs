//! Test harness for holdfast: a real local control plane (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, kwok nodes) and a real OCI registry on loopback, the
//! real peers on demand, test images pushed to it, and the runner the e2e suites share.

pub mod access;
pub mod accounts;
pub mod audit;
pub mod bench_data;
pub mod cluster;
pub mod control_plane;
pub mod controller;
pub mod dist;
pub mod images;
pub mod installed;
pub mod latency;
pub mod metrics;
pub mod mirror;
pub mod netns;
pub mod objects;
pub mod peers;
pub mod pki;
pub mod process;
pub mod scenarios;
pub mod slow_link;
pub mod soak;
pub mod suite;
pub mod tls_front;
pub mod tools;
pub mod upgrade;
pub mod wait;
pub mod webhook;

pub use control_plane::Env;

/// Process-wide set-up for harness users: the ring TLS provider and logs from `RUST_LOG`.
pub fn init() {
    // Only ring is compiled in; installing it explicitly keeps rustls from guessing.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .try_init();
}
