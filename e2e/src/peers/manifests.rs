//! A peer's upstream manifests (collected from its Go module by the install script into
//! `$HOLDFAST_CACHE/peers/<peer>/manifests/`, paths as in the module), rendered the little they
//! are templated (helm's and ytt's placeholders are substituted as text) and routed to loopback.

use anyhow::{Context, Result};
use serde::Deserialize as _;
use serde_json::Value;

use crate::{access::Access, tools::peer_dir};

/// The documents of `file`, after replacing each `(placeholder, value)` in its text. Comments
/// (ytt's `#@` lines) and empty documents are dropped by the YAML parser.
pub fn documents(peer: &str, file: &str, substitutions: &[(&str, &str)]) -> Result<Vec<Value>> {
    let path = peer_dir(peer)?.join("manifests").join(file);
    let mut text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (run `make deps`: scripts/install-deps.sh collects it)",
            path.display()
        )
    })?;
    for (placeholder, value) in substitutions {
        text = text.replace(placeholder, value);
    }
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(doc).with_context(|| format!("parsing {}", path.display()))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The documents of the given kinds only (e.g. without the Deployment that runs the peer in a
/// cluster: here it runs as a process).
pub fn of_kinds(docs: Vec<Value>, kinds: &[&str]) -> Vec<Value> {
    docs.into_iter()
        .filter(|d| d["kind"].as_str().is_some_and(|k| kinds.contains(&k)))
        .collect()
}

/// Points every webhook of a webhook configuration at `port` of its Service (the Service is an
/// ExternalName naming 127.0.0.1: [`loopback_service`]), keeping name, namespace and path.
pub fn route_webhooks(config: &mut Value, port: u16) {
    for webhook in config["webhooks"].as_array_mut().into_iter().flatten() {
        if let Some(service) = webhook["clientConfig"]["service"].as_object_mut() {
            service.insert("port".into(), port.into());
        }
    }
}

/// A Service of type ExternalName naming 127.0.0.1: kube-apiserver resolves a webhook's or an
/// APIService's `service:` reference to its externalName and dials the reference's port there
/// (Endpoints may not hold loopback addresses; cluster IPs are never dialled here). TLS is still
/// verified against `<name>.<namespace>.svc`.
pub fn loopback_service(namespace: &str, name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1"},
    })
}

/// `kubectl apply -f -` of the documents, each in the namespace it names (as applying a
/// release's manifests does).
pub fn apply(env: &Access, docs: &[Value]) -> Result<()> {
    env.kubectl_apply_with(&[], &stream(docs)?)
}

/// A multi-document YAML stream of the documents (JSON is YAML), for `kubectl apply -f -`.
pub fn stream(docs: &[Value]) -> Result<String> {
    let mut out = String::new();
    for doc in docs {
        out.push_str("---\n");
        out.push_str(&serde_json::to_string(doc)?);
        out.push('\n');
    }
    Ok(out)
}
