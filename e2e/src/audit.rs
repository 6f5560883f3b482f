//! The local kube-apiserver's audit log: every write (create, update, patch, delete) to the
//! resources holdfast's controller writes, and deletes of what holdfast's removal orders, at
//! Metadata level, one JSON object a line in the
//! environment's directory ([`crate::Env::audit_log`]). Small (no bodies, no reads, a handful of
//! resources), so every local environment keeps one.

use anyhow::{Context, Result};
use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;

/// Writes to the resources the controller writes: its pinned kinds, Events, its ControllerLease,
/// the digest cache and the pinning policy's parameters. Reads, watches and everything else are
/// not logged; neither is the `RequestReceived` stage (each request is one line, at
/// `ResponseComplete`, or `Panic`).
pub const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
  resources:
  - group: kappctrl.k14s.io
    resources: [apps]
  - group: packaging.carvel.dev
    resources: [packagerepositories]
  - group: data.packaging.carvel.dev
    resources: [packages]
  - group: ''
    resources: [events]
  - group: events.k8s.io
    resources: [events]
  - group: holdfast.dev
    resources: [controllerleases, digestcacheentries, digestpins, clusterdigestpins]
# Deletes of what holdfast's removal orders (the package suite): its webhook configurations
# before anything an admission goes through.
- level: Metadata
  verbs: [delete]
  resources:
  - group: admissionregistration.k8s.io
    resources: [mutatingwebhookconfigurations, validatingwebhookconfigurations]
  - group: apps
    resources: [deployments]
  - group: ''
    resources: [services, namespaces]
  - group: networking.k8s.io
    resources: [networkpolicies]
- level: None
";

/// The fields of one audit event the tests read.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    #[serde(rename = "auditID")]
    pub audit_id: String,
    pub stage: String,
    pub verb: String,
    #[serde(default)]
    pub user_agent: String,
    pub user: User,
    #[serde(default)]
    pub object_ref: ObjectRef,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    #[serde(deserialize_with = "timestamp")]
    pub request_received_timestamp: Timestamp,
    #[serde(deserialize_with = "timestamp")]
    pub stage_timestamp: Timestamp,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct User {
    #[serde(default)]
    pub username: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectRef {
    #[serde(default)]
    pub resource: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub api_group: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponseStatus {
    #[serde(default)]
    pub code: u16,
    /// A refusal's message (a ValidatingAdmissionPolicy's names it).
    #[serde(default)]
    pub message: String,
}

fn timestamp<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

impl Event {
    /// The response code, 0 when the server recorded none.
    pub fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// Completed (`ResponseComplete`) with a 2xx: the server did the write.
    pub fn succeeded(&self) -> bool {
        self.stage == "ResponseComplete" && (200..300).contains(&self.code())
    }

    /// Refused (403) by the ValidatingAdmissionPolicy `policy`, as the response's message says.
    pub fn refused_by(&self, policy: &str) -> bool {
        self.response_status.as_ref().is_some_and(|s| {
            s.code == 403
                && s.message
                    .contains(&format!("ValidatingAdmissionPolicy '{policy}' "))
        })
    }

    /// A write of the controllers' election: their ControllerLease `namespace/name`.
    pub fn is_lease(&self, namespace: &str, name: &str) -> bool {
        self.object_ref.resource == "controllerleases"
            && self.object_ref.api_group == "holdfast.dev"
            && self.object_ref.namespace == namespace
            && self.object_ref.name == name
    }

    /// `verb resource namespace/name -> code (received .. completed)`, for failure messages.
    pub fn describe(&self) -> String {
        format!(
            "{} {} {}/{} -> {} ({} .. {}, {})",
            self.verb,
            self.object_ref.resource,
            self.object_ref.namespace,
            self.object_ref.name,
            self.code(),
            self.request_received_timestamp,
            self.stage_timestamp,
            self.user_agent
        )
    }
}

/// Parses a JSON-lines audit log: the events of the stages [`POLICY`] keeps, in file order. A
/// last line still being written (no newline yet) is left out.
pub fn parse(text: &str) -> Result<Vec<Event>> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line).with_context(|| format!("audit log line {}: {line}", i + 1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_complete_line_parses() {
        let line = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/apis/holdfast.dev/v1alpha1/namespaces/ns/controllerleases/l","verb":"update","user":{"username":"admin","groups":["system:masters"]},"sourceIPs":["127.0.0.1"],"userAgent":"holdfast-e2e/replica-a","objectRef":{"resource":"controllerleases","namespace":"ns","name":"l","apiGroup":"holdfast.dev","apiVersion":"v1alpha1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-12-01T11:52:46.123456Z","stageTimestamp":"2026-12-01T11:52:46.125000Z"}"#;
        let events = parse(&format!("{line}\n{{\"partial")).unwrap();
        assert_eq!(events.len(), 1, "the unfinished last line is left out");
        let event = &events[0];
        assert!(event.succeeded() && event.is_lease("ns", "l"));
        let coordination = line
            .replace("\"controllerleases\"", "\"leases\"")
            .replace("\"holdfast.dev\"", "\"coordination.k8s.io\"");
        let other = &parse(&format!("{coordination}\n")).unwrap()[0];
        assert!(
            !other.is_lease("ns", "l"),
            "a coordination.k8s.io Lease is not the election's"
        );
        assert_eq!(event.user_agent, "holdfast-e2e/replica-a");
        assert_eq!(event.user.username, "admin");
        assert!(event.request_received_timestamp < event.stage_timestamp);
        let failed = line.replace("\"code\":200", "\"code\":409");
        assert!(!parse(&format!("{failed}\n")).unwrap()[0].succeeded());
    }
}
