//! holdfast's admission server: TLS serving, AdmissionReview decoding and routing, and the rules.
//!
//! - [`rules`]: pure decisions over a request and a read-only [`cluster::ClusterView`];
//!   [`rules::RuleContext::new`] is the one constructor of what they consult.
//! - [`review`]: the wire format; [`handler`]: the HTTP layer (deadline, body and in-flight
//!   budgets, metrics, logs).
//! - [`digest_cache`]: the controller's cache entries, read-only.
//! - [`server`]: the TLS and admin ports; [`admin`]: what the admin port's probes read (served
//!   by `holdfast_runtime::admin`); [`metrics`]: the admission metrics.
//!
//! The log lines and the registry flags are `holdfast_runtime`'s, shared with the controller.

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod decision;
pub mod digest_cache;
pub mod handler;
pub mod metrics;
pub mod review;
pub mod rules;
pub mod server;
pub mod uninstall;
