//! The manifests as a security reviewer reads them, checked as data: what SECURITY.md promises
//! about `manifests/` is asserted on the YAML itself, and SECURITY.md's RBAC and webhook tables
//! are compared with the manifests row for row, so the document, the YAML and the code cannot
//! drift apart.
//!
//! - The base is read by following its kustomizations' `resources:` (no tool needed).
//! - With `kubectl` on the PATH, the base, every overlay, every component on its own and all
//!   components together are rendered with `kubectl kustomize` and checked as rendered.
//! - Every check is also run on mutated copies (a wildcard verb, a missing namespaceSelector, …)
//!   to show that it catches what it is meant to catch.
//! - The controller's fence (a ValidatingAdmissionPolicy) is held to the fast finalizer's table
//!   (`DELETABLE`) for the controller's flags, and its fetch fields to kapp-controller's upstream
//!   CRDs (collected by `make deps`; skipped without them).
//!
//! No control plane: plain `#[test]` functions.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail, ensure};
use holdfast_webhook::{
    review::Request,
    rules::{
        Family, MUTATE_PATH, Rule, VALIDATE_PATH, pin_fetch_refs, policy, stamp_owners, terminating_guard,
    },
};
use serde::Deserialize;
use serde_json::json;
use serde_yaml::Value;

/// holdfast's namespace: every webhook must exclude it (and `kube-system`).
const HOLDFAST_NAMESPACE: &str = "holdfast-system";
/// The opt-out label every webhook's namespaceSelector honours.
const IGNORE_LABEL: &str = "holdfast.dev/ignore";
/// The automatic namespace name label (Kubernetes >= 1.21).
const NAME_LABEL: &str = "kubernetes.io/metadata.name";
const MAX_TIMEOUT_SECONDS: i64 = 10;

/// `(path, group, version, resource, operations, rule)`.
type Served = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static str,
);

/// What the webhook's code serves — `Rule::route` maps each of these to the named rule — and
/// therefore exactly what the webhook configurations must register, no more and no less.
const SERVED: &[Served] = &[
    (
        MUTATE_PATH,
        "kappctrl.k14s.io",
        "v1alpha1",
        "apps",
        &["CREATE", "UPDATE"],
        pin_fetch_refs::NAME,
    ),
    (
        MUTATE_PATH,
        "packaging.carvel.dev",
        "v1alpha1",
        "packagerepositories",
        &["CREATE", "UPDATE"],
        pin_fetch_refs::NAME,
    ),
    (
        MUTATE_PATH,
        "data.packaging.carvel.dev",
        "v1alpha1",
        "packages",
        &["CREATE", "UPDATE"],
        pin_fetch_refs::NAME,
    ),
    (
        MUTATE_PATH,
        "kpack.io",
        "v1alpha2",
        "images",
        &["CREATE", "UPDATE"],
        stamp_owners::NAME,
    ),
    (
        VALIDATE_PATH,
        "kappctrl.k14s.io",
        "v1alpha1",
        "apps",
        &["CREATE", "UPDATE"],
        policy::NAME,
    ),
    (
        VALIDATE_PATH,
        "packaging.carvel.dev",
        "v1alpha1",
        "packagerepositories",
        &["CREATE", "UPDATE"],
        policy::NAME,
    ),
    (
        VALIDATE_PATH,
        "data.packaging.carvel.dev",
        "v1alpha1",
        "packages",
        &["CREATE", "UPDATE"],
        policy::NAME,
    ),
    (
        VALIDATE_PATH,
        "kpack.io",
        "v1alpha2",
        "builds",
        &["CREATE"],
        terminating_guard::NAME,
    ),
    (
        VALIDATE_PATH,
        "kpack.io",
        "v1alpha2",
        "images",
        &["UPDATE"],
        terminating_guard::NAME,
    ),
    (
        VALIDATE_PATH,
        "",
        "v1",
        "pods",
        &["CREATE"],
        terminating_guard::NAME,
    ),
];

// ---------------------------------------------------------------------------------------------
// Loading

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn manifests() -> PathBuf {
    repo().join("manifests")
}

fn parse_documents(text: &str) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(document)?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn kustomization_file(dir: &Path) -> Option<PathBuf> {
    ["kustomization.yaml", "kustomization.yml", "Kustomization"]
        .iter()
        .map(|name| dir.join(name))
        .find(|p| p.is_file())
}

/// The objects a kustomization lists under `resources:`, following directories recursively.
/// Generators, patches and components are kustomize's business (see [`render`]).
fn load_kustomization(dir: &Path) -> Result<Vec<Value>> {
    let file = kustomization_file(dir).with_context(|| format!("no kustomization in {}", dir.display()))?;
    let kustomization = serde_yaml::from_str::<Value>(&read(&file)?)?;
    let mut objects = Vec::new();
    for resource in strings(kustomization.get("resources")) {
        let path = dir.join(&resource);
        if path.is_dir() {
            objects.extend(load_kustomization(&path)?);
        } else {
            let docs =
                parse_documents(&read(&path)?).with_context(|| format!("parsing {}", path.display()))?;
            objects.extend(docs);
        }
    }
    Ok(objects)
}

/// The base as written (manifests/ → base/ → ../crds and the files).
fn base() -> Result<Vec<Value>> {
    let objects = load_kustomization(&manifests())?;
    ensure!(
        objects.len() > 20,
        "the base holds only {} objects",
        objects.len()
    );
    Ok(objects)
}

fn kubectl() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("kubectl"))
        .find(|p| p.is_file())
}

/// `kubectl kustomize DIR`, parsed.
fn render(kubectl: &Path, dir: &Path) -> Result<Vec<Value>> {
    let output = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .output()
        .with_context(|| format!("running kubectl kustomize {}", dir.display()))?;
    if !output.status.success() {
        bail!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    parse_documents(&String::from_utf8(output.stdout)?)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

fn subdirectories(dir: &Path) -> Result<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

// ---------------------------------------------------------------------------------------------
// YAML access

fn at<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |v, key| match key.parse::<usize>() {
            Ok(i) => v.get(i),
            Err(_) => v.get(key),
        })
}

fn at_mut<'a>(value: &'a mut Value, path: &str) -> Result<&'a mut Value> {
    let mut current = value;
    for key in path.split('.') {
        let next = match key.parse::<usize>() {
            Ok(i) => current.get_mut(i),
            Err(_) => current.get_mut(key),
        };
        current = next.with_context(|| format!("no {key:?} on the way to {path}"))?;
    }
    Ok(current)
}

fn text<'a>(value: &'a Value, path: &str) -> &'a str {
    at(value, path).and_then(Value::as_str).unwrap_or_default()
}

fn strings(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_sequence)
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().map(str::to_owned).unwrap_or_else(|| format!("{v:?}")))
                .collect()
        })
        .unwrap_or_default()
}

fn items<'a>(value: &'a Value, path: &str) -> Vec<&'a Value> {
    at(value, path)
        .and_then(Value::as_sequence)
        .map(|s| s.iter().collect())
        .unwrap_or_default()
}

fn kind(object: &Value) -> &str {
    text(object, "kind")
}

fn id(object: &Value) -> String {
    match at(object, "metadata.namespace").and_then(Value::as_str) {
        Some(ns) => format!("{} {ns}/{}", kind(object), text(object, "metadata.name")),
        None => format!("{} {}", kind(object), text(object, "metadata.name")),
    }
}

fn of_kind<'a>(objects: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| kind(o) == wanted).collect()
}

fn find<'a>(objects: &'a [Value], wanted: &str, name: &str) -> Result<&'a Value> {
    objects
        .iter()
        .find(|o| kind(o) == wanted && text(o, "metadata.name") == name)
        .with_context(|| format!("no {wanted} {name}"))
}

fn find_mut<'a>(objects: &'a mut [Value], wanted: &str, name: &str) -> Result<&'a mut Value> {
    objects
        .iter_mut()
        .find(|o| kind(o) == wanted && text(o, "metadata.name") == name)
        .with_context(|| format!("no {wanted} {name}"))
}

const WEBHOOK_CONFIGURATIONS: [&str; 2] = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"];

/// `(configuration, webhook)` for every webhook of every configuration.
fn webhooks(objects: &[Value]) -> Vec<(&Value, &Value)> {
    objects
        .iter()
        .filter(|o| WEBHOOK_CONFIGURATIONS.contains(&kind(o)))
        .flat_map(|c| items(c, "webhooks").into_iter().map(move |w| (c, w)))
        .collect()
}

fn is_mutating(configuration: &Value) -> bool {
    kind(configuration) == "MutatingWebhookConfiguration"
}

/// A terminating-guard webhook: one whose rules name kpack Builds/Images or Pods on /validate.
fn is_terminating_guard(configuration: &Value, webhook: &Value) -> bool {
    !is_mutating(configuration)
        && items(webhook, "rules").iter().any(|rule| {
            let groups = strings(rule.get("apiGroups"));
            let resources = strings(rule.get("resources"));
            groups.iter().any(|g| g == "kpack.io" || g.is_empty())
                && resources
                    .iter()
                    .any(|r| ["builds", "images", "pods"].contains(&r.as_str()))
        })
}

// ---------------------------------------------------------------------------------------------
// Checks: each returns what is wrong, empty when all is well.

/// No `*` in any Role or ClusterRole; no aggregation, no non-resource URLs; every rule has verbs.
fn check_no_wildcards(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    for role in objects
        .iter()
        .filter(|o| ["Role", "ClusterRole"].contains(&kind(o)))
    {
        if role.get("aggregationRule").is_some() {
            problems.push(format!("{}: aggregationRule (rules not listed)", id(role)));
        }
        for (i, rule) in items(role, "rules").iter().enumerate() {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                for value in strings(rule.get(field)) {
                    if value.contains('*') {
                        problems.push(format!(
                            "{}: rules[{i}].{field} has the wildcard {value:?}",
                            id(role)
                        ));
                    }
                }
            }
            if rule.get("nonResourceURLs").is_some() {
                problems.push(format!("{}: rules[{i}] grants nonResourceURLs", id(role)));
            }
            if strings(rule.get("verbs")).is_empty() || strings(rule.get("resources")).is_empty() {
                problems.push(format!("{}: rules[{i}] lists no verbs or no resources", id(role)));
            }
        }
    }
    problems
}

/// Every webhook: excludes kube-system, holdfast's namespace and the opt-out label; sideEffects
/// None; explicit timeoutSeconds <= 10; admissionReviewVersions [v1]; mutating and terminating
/// guard fail open; mutating reinvoked IfNeeded; served by holdfast's Service on its path; no
/// committed caBundle; rules without wildcards or subresources.
fn check_webhooks(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let all = webhooks(objects);
    if all.is_empty() {
        problems.push("no webhooks".into());
    }
    for (configuration, webhook) in all {
        let name = format!("{} / {}", id(configuration), text(webhook, "name"));
        let mut problem = |p: String| problems.push(format!("{name}: {p}"));

        let expressions = items(webhook, "namespaceSelector.matchExpressions");
        if webhook.get("namespaceSelector").is_none() {
            problem("no namespaceSelector".into());
        }
        let excludes = |key: &str, values: &[&str]| {
            expressions.iter().any(|e| {
                text(e, "key") == key
                    && text(e, "operator") == "NotIn"
                    && values
                        .iter()
                        .all(|v| strings(e.get("values")).iter().any(|x| x == v))
            })
        };
        if !excludes(NAME_LABEL, &["kube-system", HOLDFAST_NAMESPACE]) {
            problem(format!(
                "namespaceSelector does not exclude kube-system and {HOLDFAST_NAMESPACE} by {NAME_LABEL}"
            ));
        }
        if !excludes(IGNORE_LABEL, &["true"]) {
            problem(format!("namespaceSelector does not honour {IGNORE_LABEL}=true"));
        }
        if text(webhook, "sideEffects") != "None" {
            problem(format!(
                "sideEffects {:?}, not None",
                text(webhook, "sideEffects")
            ));
        }
        match at(webhook, "timeoutSeconds").and_then(Value::as_i64) {
            Some(t) if (1..=MAX_TIMEOUT_SECONDS).contains(&t) => {}
            other => problem(format!(
                "timeoutSeconds {other:?}, want 1..={MAX_TIMEOUT_SECONDS}"
            )),
        }
        if strings(webhook.get("admissionReviewVersions")) != ["v1"] {
            problem("admissionReviewVersions is not [v1]".into());
        }
        let failure = text(webhook, "failurePolicy");
        if is_mutating(configuration) || is_terminating_guard(configuration, webhook) {
            if failure != "Ignore" {
                problem(format!("failurePolicy {failure:?}: must fail open (Ignore)"));
            }
        } else if !["Ignore", "Fail"].contains(&failure) {
            problem(format!("failurePolicy {failure:?} not set explicitly"));
        }
        if is_mutating(configuration) && text(webhook, "reinvocationPolicy") != "IfNeeded" {
            problem("reinvocationPolicy is not IfNeeded".into());
        }
        let path = if is_mutating(configuration) {
            MUTATE_PATH
        } else {
            VALIDATE_PATH
        };
        if at(webhook, "clientConfig.url").is_some() {
            problem("clientConfig.url: must call holdfast's Service".into());
        }
        if text(webhook, "clientConfig.service.namespace") != HOLDFAST_NAMESPACE
            || text(webhook, "clientConfig.service.path") != path
        {
            problem(format!(
                "clientConfig.service is not {HOLDFAST_NAMESPACE} {path} (holdfast serves {path} there)"
            ));
        }
        if at(webhook, "clientConfig.caBundle").is_some() {
            problem("a committed caBundle (holdfast or cert-manager injects it)".into());
        }
        for (i, rule) in items(webhook, "rules").iter().enumerate() {
            for field in ["apiGroups", "apiVersions", "resources", "operations"] {
                let values = strings(rule.get(field));
                if values.is_empty() || values.iter().any(|v| v.contains('*')) {
                    problem(format!("rules[{i}].{field} is empty or has a wildcard"));
                }
            }
            if strings(rule.get("resources")).iter().any(|r| r.contains('/')) {
                problem(format!("rules[{i}] names a subresource"));
            }
            if text(rule, "scope") != "Namespaced" {
                problem(format!("rules[{i}].scope is not Namespaced"));
            }
        }
    }
    problems
}

/// The rules of the webhook configurations are exactly [`SERVED`], and the code routes each to
/// the rule the table names.
fn check_served(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut registered = BTreeSet::new();
    for (configuration, webhook) in webhooks(objects) {
        let path = text(webhook, "clientConfig.service.path").to_owned();
        for rule in items(webhook, "rules") {
            for group in strings(rule.get("apiGroups")) {
                for version in strings(rule.get("apiVersions")) {
                    for resource in strings(rule.get("resources")) {
                        for operation in strings(rule.get("operations")) {
                            registered.insert((
                                path.clone(),
                                group.clone(),
                                version.clone(),
                                resource.clone(),
                                operation,
                            ));
                        }
                    }
                }
            }
        }
        if (path_family(text(webhook, "clientConfig.service.path")) == Some(Family::Mutating))
            != is_mutating(configuration)
        {
            problems.push(format!(
                "{}: path and configuration kind disagree",
                text(webhook, "name")
            ));
        }
    }
    let mut served = BTreeSet::new();
    for (path, group, version, resource, operations, rule) in SERVED {
        for operation in *operations {
            served.insert((
                path.to_string(),
                group.to_string(),
                version.to_string(),
                resource.to_string(),
                operation.to_string(),
            ));
            match route(path, group, version, resource, operation) {
                Ok(Some(name)) if name == *rule => {}
                other => problems.push(format!(
                    "the code routes {path} {group}/{version} {resource} {operation} to {other:?}, not {rule}"
                )),
            }
        }
    }
    for extra in registered.difference(&served) {
        problems.push(format!("registered but not served by the code: {extra:?}"));
    }
    for missing in served.difference(&registered) {
        problems.push(format!("served by the code but not registered: {missing:?}"));
    }
    problems
}

fn path_family(path: &str) -> Option<Family> {
    match path {
        MUTATE_PATH => Some(Family::Mutating),
        VALIDATE_PATH => Some(Family::Validating),
        _ => None,
    }
}

/// The rule `holdfast_webhook` routes a request to.
fn route(
    path: &str,
    group: &str,
    version: &str,
    resource: &str,
    operation: &str,
) -> Result<Option<&'static str>> {
    let family = path_family(path).with_context(|| format!("unknown path {path}"))?;
    let api_version = if group.is_empty() {
        version.to_owned()
    } else {
        format!("{group}/{version}")
    };
    let body = json!({
        "uid": "u", "kind": {"group": group, "version": version, "kind": "X"},
        "resource": {"group": group, "version": version, "resource": resource},
        "name": "n", "namespace": "ns", "operation": operation, "userInfo": {},
        "object": {"apiVersion": api_version, "kind": "X", "metadata": {"name": "n", "namespace": "ns"}},
        "oldObject": null, "dryRun": false,
    })
    .to_string();
    let request: Request = serde_json::from_str(&body)?;
    Ok(Rule::route(family, &request).map(Rule::name))
}

/// Every container runs `restricted`, with requests and limits; no host access.
fn check_containers(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut pods = 0;
    for object in objects {
        let spec_path = match kind(object) {
            "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" => "spec.template.spec",
            "CronJob" => "spec.jobTemplate.spec.template.spec",
            "Pod" => "spec",
            _ => continue,
        };
        pods += 1;
        let Some(spec) = at(object, spec_path) else {
            problems.push(format!("{}: no pod spec", id(object)));
            continue;
        };
        for host in ["hostNetwork", "hostPID", "hostIPC"] {
            if at(spec, host).and_then(Value::as_bool) == Some(true) {
                problems.push(format!("{}: {host}", id(object)));
            }
        }
        if items(spec, "volumes").iter().any(|v| v.get("hostPath").is_some()) {
            problems.push(format!("{}: hostPath volume", id(object)));
        }
        let containers: Vec<&Value> = ["containers", "initContainers", "ephemeralContainers"]
            .iter()
            .flat_map(|field| items(spec, field))
            .collect();
        if containers.is_empty() {
            problems.push(format!("{}: no containers", id(object)));
        }
        for container in containers {
            let name = format!("{} container {}", id(object), text(container, "name"));
            let own = |path: &str| at(container, &format!("securityContext.{path}"));
            let effective = |path: &str| own(path).or_else(|| at(spec, &format!("securityContext.{path}")));
            let mut want = |ok: bool, what: &str| {
                if !ok {
                    problems.push(format!("{name}: {what}"));
                }
            };
            want(
                effective("runAsNonRoot").and_then(Value::as_bool) == Some(true),
                "runAsNonRoot is not true",
            );
            want(
                effective("runAsUser").and_then(Value::as_i64) != Some(0),
                "runs as UID 0",
            );
            want(
                own("readOnlyRootFilesystem").and_then(Value::as_bool) == Some(true),
                "readOnlyRootFilesystem is not true",
            );
            want(
                own("allowPrivilegeEscalation").and_then(Value::as_bool) == Some(false),
                "allowPrivilegeEscalation is not false",
            );
            want(
                own("privileged").and_then(Value::as_bool) != Some(true),
                "privileged",
            );
            want(
                strings(own("capabilities.drop")).iter().any(|c| c == "ALL"),
                "capabilities do not drop ALL",
            );
            want(strings(own("capabilities.add")).is_empty(), "adds capabilities");
            want(
                effective("seccompProfile.type").and_then(Value::as_str) == Some("RuntimeDefault"),
                "seccompProfile is not RuntimeDefault",
            );
            for quantity in ["requests.cpu", "requests.memory", "limits.cpu", "limits.memory"] {
                want(
                    at(container, &format!("resources.{quantity}")).is_some(),
                    &format!("no resources.{quantity}"),
                );
            }
        }
    }
    if pods == 0 {
        problems.push("no workloads".into());
    }
    problems
}

/// The webhook runs >= 2 replicas spread by anti-affinity with a PodDisruptionBudget; the
/// controller runs >= 2 replicas spread by anti-affinity, which elect a leader: each knows its
/// pod name and its ServiceAccount may get, create and update its Lease.
fn check_availability(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let Ok(webhook) = find(objects, "Deployment", "holdfast-webhook") else {
        return vec!["no Deployment holdfast-webhook".into()];
    };
    if at(webhook, "spec.replicas").and_then(Value::as_i64).unwrap_or(1) < 2 {
        problems.push("holdfast-webhook runs fewer than 2 replicas".into());
    }
    if at(webhook, "spec.template.spec.affinity.podAntiAffinity").is_none() {
        problems.push("holdfast-webhook has no podAntiAffinity".into());
    }
    if !disruption_budgeted(objects, webhook) {
        problems.push("no PodDisruptionBudget with minAvailable >= 1 selects holdfast-webhook".into());
    }
    match find(objects, "Deployment", "holdfast-controller") {
        Ok(controller) => {
            problems.extend(check_controller_election(objects, controller));
            if !disruption_budgeted(objects, controller) {
                problems
                    .push("no PodDisruptionBudget with minAvailable >= 1 selects holdfast-controller".into());
            }
        }
        Err(e) => problems.push(e.to_string()),
    }
    problems
}

/// Whether a PodDisruptionBudget with `minAvailable` >= 1 selects `deployment`'s pods.
fn disruption_budgeted(objects: &[Value], deployment: &Value) -> bool {
    let labels = at(deployment, "spec.template.metadata.labels");
    of_kind(objects, "PodDisruptionBudget").iter().any(|pdb| {
        at(pdb, "spec.minAvailable").and_then(Value::as_i64).unwrap_or(0) >= 1
            && at(pdb, "spec.selector.matchLabels")
                .and_then(Value::as_mapping)
                .is_some_and(|selector| {
                    selector
                        .iter()
                        .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
                })
    })
}

/// The verbs on `coordination.k8s.io` leases that the roles bound to `account` grant on the
/// Lease `lease` in holdfast's namespace.
fn lease_verbs(objects: &[Value], account: &str, lease: &str) -> BTreeSet<String> {
    let bound = objects
        .iter()
        .filter(|b| ["RoleBinding", "ClusterRoleBinding"].contains(&kind(b)))
        .filter(|b| {
            let namespace = text(b, "metadata.namespace");
            (namespace.is_empty() || namespace == HOLDFAST_NAMESPACE)
                && items(b, "subjects").iter().any(|s| {
                    text(s, "kind") == "ServiceAccount"
                        && text(s, "namespace") == HOLDFAST_NAMESPACE
                        && text(s, "name") == account
                })
        })
        .filter_map(|b| find(objects, text(b, "roleRef.kind"), text(b, "roleRef.name")).ok());
    bound
        .flat_map(|role| items(role, "rules"))
        .filter(|rule| {
            strings(rule.get("apiGroups"))
                .iter()
                .any(|g| g == "coordination.k8s.io")
        })
        .filter(|rule| strings(rule.get("resources")).iter().any(|r| r == "leases"))
        .filter(|rule| {
            let names = strings(rule.get("resourceNames"));
            names.is_empty() || names.iter().any(|n| n == lease)
        })
        .flat_map(|rule| strings(rule.get("verbs")))
        .collect()
}

/// The controller's high availability: >= 2 replicas, spread, rolled without a gap, each with its
/// identity, and the RBAC its Lease election calls (controller/src/leader.rs: get, create,
/// update of the Lease named by --lease-name).
fn check_controller_election(objects: &[Value], controller: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let replicas = at(controller, "spec.replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    if replicas < 2 {
        problems.push(format!(
            "holdfast-controller runs {replicas} replica(s): it has leader election and must run at least 2"
        ));
    }
    if text(controller, "spec.strategy.type") == "Recreate" {
        problems.push("holdfast-controller uses strategy Recreate: a rollout would leave no replica".into());
    }
    if at(controller, "spec.template.spec.affinity.podAntiAffinity").is_none() {
        problems.push("holdfast-controller has no podAntiAffinity".into());
    }
    let container = at(controller, "spec.template.spec.containers.0");
    let args = strings(container.and_then(|c| c.get("args")));
    let lease = args
        .iter()
        .find_map(|a| a.strip_prefix("--lease-name="))
        .unwrap_or("holdfast-controller");
    let identity = container
        .map(|c| items(c, "env"))
        .unwrap_or_default()
        .into_iter()
        .any(|e| text(e, "name") == "POD_NAME" && text(e, "valueFrom.fieldRef.fieldPath") == "metadata.name");
    if !identity && !args.iter().any(|a| a.starts_with("--identity=")) {
        problems.push(
            "holdfast-controller has no identity for leader election: POD_NAME from the downward API (metadata.name)"
                .into(),
        );
    }
    let granted = lease_verbs(objects, "holdfast-controller", lease);
    for verb in ["get", "create", "update"] {
        if !granted.contains(verb) {
            problems.push(format!(
                "holdfast-controller runs {replicas} replicas with leader election but may not {verb} its Lease {HOLDFAST_NAMESPACE}/{lease}"
            ));
        }
    }
    problems
}

/// Ingress is denied by default in holdfast's namespace; the admin ports (the webhook's 8080,
/// the controller's 8081) admit only selected scrapers.
fn check_network(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let policies: Vec<&Value> = of_kind(objects, "NetworkPolicy")
        .into_iter()
        .filter(|p| text(p, "metadata.namespace") == HOLDFAST_NAMESPACE)
        .collect();
    let default_deny = policies.iter().any(|p| {
        at(p, "spec.podSelector")
            .and_then(Value::as_mapping)
            .is_some_and(|m| m.is_empty())
            && strings(at(p, "spec.policyTypes")).iter().any(|t| t == "Ingress")
            && items(p, "spec.ingress").is_empty()
    });
    if !default_deny {
        problems.push(format!(
            "no default-deny ingress NetworkPolicy in {HOLDFAST_NAMESPACE}"
        ));
    }
    for policy in &policies {
        for (i, rule) in items(policy, "spec.ingress").iter().enumerate() {
            let admin = items(rule, "ports").iter().any(|p| {
                text(p, "port") == "admin"
                    || matches!(at(p, "port").and_then(Value::as_i64), Some(8080 | 8081))
            });
            if admin && items(rule, "from").is_empty() {
                problems.push(format!(
                    "{}: ingress[{i}] opens the admin port to everyone",
                    id(policy)
                ));
            }
        }
    }
    problems
}

/// Everything SECURITY.md promises of any rendering of the manifests.
fn check_all(objects: &[Value]) -> Vec<String> {
    [
        check_no_wildcards(objects),
        check_webhooks(objects),
        check_served(objects),
        check_containers(objects),
        check_availability(objects),
        check_network(objects),
        check_fence(objects),
    ]
    .concat()
}

fn assert_clean(what: &str, problems: &[String]) {
    assert!(problems.is_empty(), "{what}:\n  {}", problems.join("\n  "));
}

// ---------------------------------------------------------------------------------------------
// SECURITY.md

fn security_md() -> Result<String> {
    read(&repo().join("SECURITY.md"))
}

/// The rows of the Markdown table whose header line starts with `header`, as trimmed cells.
fn table(markdown: &str, header: &str) -> Result<Vec<Vec<String>>> {
    let mut lines = markdown.lines().skip_while(|l| !l.starts_with(header));
    lines
        .next()
        .with_context(|| format!("SECURITY.md has no table {header:?}"))?;
    lines.next(); // the |---| line
    Ok(lines
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            // `\|` is a pipe inside a cell (a CEL `||`), not a cell boundary.
            l.trim()
                .trim_matches('|')
                .replace("\\|", "\u{0}")
                .split('|')
                .map(|cell| cell.trim().replace('\u{0}', "|"))
                .collect()
        })
        .collect())
}

fn plain(cell: &str) -> String {
    cell.replace('`', "").trim().to_owned()
}

fn cell_list(cell: &str) -> BTreeSet<String> {
    plain(cell)
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s != "—")
        .collect()
}

/// `(role, group, resources, resourceNames, verbs)`, role as "ClusterRole name".
type RbacRow = (
    String,
    String,
    BTreeSet<String>,
    BTreeSet<String>,
    BTreeSet<String>,
);

/// The header of SECURITY.md's table of the base's RBAC.
const RBAC_TABLE: &str = "| Role | API group | Resources | Names | Verbs |";
/// The header of its table of the RBAC objects components add (same columns).
const COMPONENT_RBAC_TABLE: &str = "| Role (component) | API group | Resources | Names | Verbs |";

fn rbac_from_doc(markdown: &str, header: &str) -> Result<BTreeSet<RbacRow>> {
    let mut rows = BTreeSet::new();
    for cells in table(markdown, header)? {
        ensure!(cells.len() >= 5, "short RBAC row {cells:?}");
        let role = plain(&cells[0])
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        let group = match plain(&cells[1]).as_str() {
            "core" => String::new(),
            group => group.to_owned(),
        };
        let row = (
            role,
            group,
            cell_list(&cells[2]),
            cell_list(&cells[3]),
            cell_list(&cells[4]),
        );
        ensure!(rows.insert(row.clone()), "duplicate RBAC row {row:?}");
    }
    Ok(rows)
}

fn rbac_from_manifests(objects: &[Value]) -> BTreeSet<RbacRow> {
    let set = |v: Option<&Value>| strings(v).into_iter().collect::<BTreeSet<_>>();
    let mut rows = BTreeSet::new();
    for role in objects
        .iter()
        .filter(|o| ["Role", "ClusterRole"].contains(&kind(o)))
    {
        for rule in items(role, "rules") {
            for group in strings(rule.get("apiGroups")) {
                rows.insert((
                    format!("{} {}", kind(role), text(role, "metadata.name")),
                    group,
                    set(rule.get("resources")),
                    set(rule.get("resourceNames")),
                    set(rule.get("verbs")),
                ));
            }
        }
    }
    rows
}

fn compare_rbac(doc: &BTreeSet<RbacRow>, manifests: &BTreeSet<RbacRow>) -> Vec<String> {
    let mut problems = Vec::new();
    for row in manifests.difference(doc) {
        problems.push(format!(
            "in the manifests but not in SECURITY.md's RBAC table: {row:?}"
        ));
    }
    for row in doc.difference(manifests) {
        problems.push(format!(
            "in SECURITY.md's RBAC table but not in the manifests: {row:?}"
        ));
    }
    problems
}

/// `(webhook, Mutating|Validating, path, failurePolicy)`.
type WebhookRow = (String, String, String, String);

fn webhooks_from_doc(markdown: &str) -> Result<BTreeSet<WebhookRow>> {
    let mut rows = BTreeSet::new();
    for cells in table(markdown, "| Webhook | Configuration | Path |")? {
        ensure!(cells.len() >= 5, "short webhook row {cells:?}");
        rows.insert((
            plain(&cells[0]),
            plain(&cells[1]),
            plain(&cells[2]),
            plain(&cells[4]),
        ));
    }
    Ok(rows)
}

fn webhooks_from_manifests(objects: &[Value]) -> BTreeSet<WebhookRow> {
    webhooks(objects)
        .into_iter()
        .map(|(configuration, webhook)| {
            (
                text(webhook, "name").to_owned(),
                if is_mutating(configuration) {
                    "Mutating"
                } else {
                    "Validating"
                }
                .to_owned(),
                text(webhook, "clientConfig.service.path").to_owned(),
                text(webhook, "failurePolicy").to_owned(),
            )
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Tests: the manifests as written

#[test]
fn the_base_keeps_every_promise() -> Result<()> {
    assert_clean("manifests/ (as written)", &check_all(&base()?));
    Ok(())
}

#[test]
fn the_rbac_table_in_security_md_is_the_rbac_of_the_manifests() -> Result<()> {
    let doc = rbac_from_doc(&security_md()?, RBAC_TABLE)?;
    let manifests = rbac_from_manifests(&base()?);
    ensure!(manifests.len() > 10, "only {} RBAC rules found", manifests.len());
    assert_clean("SECURITY.md vs manifests (RBAC)", &compare_rbac(&doc, &manifests));
    Ok(())
}

/// The Roles components add (their own `resources:`, e.g. `no-secret-reads`' Role for the
/// mirror Secret) are SECURITY.md's component RBAC table, row for row.
#[test]
fn the_component_rbac_table_in_security_md_is_the_rbac_components_add() -> Result<()> {
    let doc = rbac_from_doc(&security_md()?, COMPONENT_RBAC_TABLE)?;
    let mut added = Vec::new();
    for component in subdirectories(&manifests().join("components"))? {
        added.extend(load_kustomization(
            &manifests().join("components").join(component),
        )?);
    }
    let manifests = rbac_from_manifests(&added);
    ensure!(!manifests.is_empty(), "no component adds RBAC");
    assert_clean(
        "SECURITY.md vs components (RBAC)",
        &compare_rbac(&doc, &manifests),
    );
    Ok(())
}

#[test]
fn the_webhook_table_in_security_md_is_the_webhooks_of_the_manifests() -> Result<()> {
    let doc = webhooks_from_doc(&security_md()?)?;
    let manifests = webhooks_from_manifests(&base()?);
    assert_eq!(
        doc, manifests,
        "SECURITY.md's webhook table (left) vs the manifests (right)"
    );
    Ok(())
}

#[test]
fn bindings_grant_holdfast_roles_to_holdfast_service_accounts_only() -> Result<()> {
    let objects = base()?;
    let mut problems = Vec::new();
    for binding in objects
        .iter()
        .filter(|o| ["RoleBinding", "ClusterRoleBinding"].contains(&kind(o)))
    {
        let role_kind = text(binding, "roleRef.kind");
        let role = text(binding, "roleRef.name");
        if find(&objects, role_kind, role).is_err() {
            problems.push(format!(
                "{}: binds {role_kind} {role}, which is not holdfast's",
                id(binding)
            ));
        }
        for subject in items(binding, "subjects") {
            let account = (
                text(subject, "kind"),
                text(subject, "namespace"),
                text(subject, "name"),
            );
            let ours = account.0 == "ServiceAccount"
                && account.1 == HOLDFAST_NAMESPACE
                && find(&objects, "ServiceAccount", account.2).is_ok();
            if !ours {
                problems.push(format!("{}: binds {account:?}", id(binding)));
            }
        }
    }
    for role in objects
        .iter()
        .filter(|o| ["Role", "ClusterRole"].contains(&kind(o)))
    {
        let bound = objects.iter().any(|b| {
            text(b, "roleRef.kind") == kind(role) && text(b, "roleRef.name") == text(role, "metadata.name")
        });
        if !bound {
            problems.push(format!("{}: not bound to anything", id(role)));
        }
        if kind(role) == "Role" && text(role, "metadata.namespace") != HOLDFAST_NAMESPACE {
            problems.push(format!("{}: a Role outside {HOLDFAST_NAMESPACE}", id(role)));
        }
    }
    assert_clean("bindings", &problems);
    Ok(())
}

/// The webhook Deployment's flags are documented (README.md, "Configuration") and agree with
/// the objects they name: ports, Service, configurations (and their RBAC resourceNames), the TLS
/// Secret, the policy file.
#[test]
fn the_webhook_deployment_agrees_with_the_readme_and_the_other_objects() -> Result<()> {
    let objects = base()?;
    let readme = read(&repo().join("README.md"))?;
    let deployment = find(&objects, "Deployment", "holdfast-webhook")?;
    ensure!(text(deployment, "metadata.namespace") == HOLDFAST_NAMESPACE);
    let container = at(deployment, "spec.template.spec.containers.0").context("no container")?;
    let mut flags: Vec<(String, String)> = Vec::new();
    for arg in strings(container.get("args")) {
        let (flag, value) = arg
            .split_once('=')
            .with_context(|| format!("write flags as --flag=value: {arg}"))?;
        ensure!(
            readme.contains(&format!("`{flag}`")),
            "{flag} is not documented in README.md"
        );
        flags.push((flag.to_owned(), value.to_owned()));
    }
    let flag = |name: &str| -> Vec<String> {
        flags
            .iter()
            .filter(|(f, _)| f == name)
            .flat_map(|(_, v)| v.split(',').map(str::to_owned))
            .collect()
    };
    let one = |name: &str| -> Result<String> {
        match flag(name).as_slice() {
            [value] => Ok(value.clone()),
            other => bail!("{name}: {other:?}"),
        }
    };
    let port = |name: &str| {
        items(container, "ports")
            .into_iter()
            .find(|p| text(p, "name") == name)
            .and_then(|p| at(p, "containerPort").and_then(Value::as_i64))
            .map(|p| p.to_string())
    };
    let flag_port = |name: &str| one(name).map(|a| a.rsplit(':').next().unwrap_or_default().to_owned());
    assert_eq!(port("https"), Some(flag_port("--addr")?), "--addr vs port https");
    assert_eq!(
        port("admin"),
        Some(flag_port("--admin-addr")?),
        "--admin-addr vs port admin"
    );
    // --namespace is POD_NAMESPACE: the pod's own namespace.
    let namespace_env = items(container, "env")
        .into_iter()
        .find(|e| text(e, "name") == "POD_NAMESPACE")
        .context("no POD_NAMESPACE")?;
    assert_eq!(
        text(namespace_env, "valueFrom.fieldRef.fieldPath"),
        "metadata.namespace"
    );

    // The Service the webhooks call selects these pods and routes its port to the TLS port.
    let service_name = one("--service-name")?;
    let service = find(&objects, "Service", &service_name)?;
    let pod_labels = at(deployment, "spec.template.metadata.labels").context("no pod labels")?;
    let selects = at(service, "spec.selector")
        .and_then(Value::as_mapping)
        .is_some_and(|s| s.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    ensure!(selects, "Service {service_name} does not select the webhook pods");
    for (_, webhook) in webhooks(&objects) {
        assert_eq!(text(webhook, "clientConfig.service.name"), service_name);
        let port = at(webhook, "clientConfig.service.port")
            .and_then(Value::as_i64)
            .unwrap_or(443);
        let routed = items(service, "spec.ports")
            .iter()
            .any(|p| at(p, "port").and_then(Value::as_i64) == Some(port) && text(p, "targetPort") == "https");
        ensure!(routed, "Service port {port} does not lead to the TLS port");
    }

    // The configurations holdfast injects into are exactly the ones installed, and RBAC names them.
    let names = |k: &str| -> BTreeSet<String> {
        of_kind(&objects, k)
            .iter()
            .map(|o| text(o, "metadata.name").to_owned())
            .collect()
    };
    let set = |v: Vec<String>| v.into_iter().collect::<BTreeSet<_>>();
    assert_eq!(
        set(flag("--mutating-webhook-configurations")),
        names("MutatingWebhookConfiguration")
    );
    assert_eq!(
        set(flag("--validating-webhook-configurations")),
        names("ValidatingWebhookConfiguration")
    );
    let certs = find(&objects, "ClusterRole", "holdfast-webhook-certs")?;
    let allowed: BTreeSet<String> = items(certs, "rules")
        .iter()
        .flat_map(|r| strings(r.get("resourceNames")))
        .collect();
    let configured: BTreeSet<String> = names("MutatingWebhookConfiguration")
        .union(&names("ValidatingWebhookConfiguration"))
        .cloned()
        .collect();
    assert_eq!(allowed, configured, "resourceNames vs the configurations");

    // The certificate Secret exists and ships empty (holdfast may not create it), and it is the
    // one RBAC names.
    let tls_secret = one("--tls-secret")?;
    let secret = find(&objects, "Secret", &tls_secret)?;
    ensure!(secret.get("data").is_none(), "the TLS Secret must ship empty");
    let role = find(&objects, "Role", "holdfast-webhook-certs")?;
    assert_eq!(
        items(role, "rules")
            .iter()
            .flat_map(|r| strings(r.get("resourceNames")))
            .collect::<Vec<_>>(),
        [tls_secret]
    );

    // The policy file is on a mounted volume and parses with the webhook's own parser.
    let policy = one("--policy-file")?;
    let mounted = items(container, "volumeMounts")
        .iter()
        .any(|m| policy.starts_with(&format!("{}/", text(m, "mountPath"))));
    ensure!(mounted, "{policy} is not on a mounted volume");
    let policy_text = read(&manifests().join("base/webhook/policy.yaml"))?;
    holdfast_webhook::rules::policy::Policy::from_yaml(&policy_text)?;
    Ok(())
}

/// The e2e harness installs every `*.yaml` in manifests/crds as a CRD, and holdfast's code
/// addresses the digest cache by a fixed group, version and plural.
#[test]
fn the_crds_directory_holds_only_crds_and_the_cache_crd_matches_the_code() -> Result<()> {
    let dir = manifests().join("crds");
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|x| x == "yaml") {
            for doc in parse_documents(&read(&path)?)? {
                ensure!(
                    kind(&doc) == "CustomResourceDefinition",
                    "{} holds a {} (the harness loads *.yaml here as CRDs)",
                    path.display(),
                    kind(&doc)
                );
                found.push(doc);
            }
        }
    }
    let resource = holdfast_registry::cluster_store::resource();
    let crd = found
        .iter()
        .find(|c| text(c, "spec.names.kind") == resource.kind)
        .context("no DigestCacheEntry CRD")?;
    assert_eq!(text(crd, "spec.group"), resource.group);
    assert_eq!(text(crd, "spec.names.plural"), resource.plural);
    assert_eq!(text(crd, "spec.scope"), "Namespaced");
    ensure!(
        items(crd, "spec.versions")
            .iter()
            .any(|v| text(v, "name") == resource.version
                && at(v, "storage").and_then(Value::as_bool) == Some(true)),
        "no stored {} version",
        resource.version
    );
    // Whatever renders the base installs it.
    ensure!(
        find(
            &base()?,
            "CustomResourceDefinition",
            &format!("{}.{}", resource.plural, resource.group)
        )
        .is_ok()
    );
    Ok(())
}

#[test]
fn holdfasts_namespace_enforces_the_restricted_pod_security_profile() -> Result<()> {
    let objects = base()?;
    let namespace = find(&objects, "Namespace", HOLDFAST_NAMESPACE)?;
    let labels = at(namespace, "metadata.labels").context("no labels")?;
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .and_then(Value::as_str),
        Some("restricted")
    );
    for object in &objects {
        if let Some(ns) = at(object, "metadata.namespace").and_then(Value::as_str) {
            assert_eq!(
                ns,
                HOLDFAST_NAMESPACE,
                "{} is outside holdfast's namespace",
                id(object)
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests: the manifests as kustomize renders them (needs kubectl)

#[test]
fn every_rendering_keeps_every_promise() -> Result<()> {
    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not on PATH: the renderings are not checked");
        return Ok(());
    };
    // `kubectl apply -k manifests/` must work.
    let base = render(&kubectl, &manifests())?;
    assert_clean("kubectl kustomize manifests/", &check_all(&base));
    // The policy ConfigMap is generated (name with a content hash) and mounted by that name.
    let generated = of_kind(&base, "ConfigMap")
        .iter()
        .map(|c| text(c, "metadata.name").to_owned())
        .find(|n| n.starts_with("holdfast-policy-"))
        .context("no generated holdfast-policy ConfigMap")?;
    let webhook = find(&base, "Deployment", "holdfast-webhook")?;
    ensure!(
        items(webhook, "spec.template.spec.volumes")
            .iter()
            .any(|v| text(v, "configMap.name") == generated),
        "the webhook does not mount {generated}"
    );

    for overlay in subdirectories(&manifests().join("overlays"))? {
        let objects = render(&kubectl, &manifests().join("overlays").join(&overlay))?;
        assert_clean(&format!("overlays/{overlay}"), &check_all(&objects));
    }

    // Components need a kustomization that uses them: a copy of manifests/ in a temporary
    // directory (kustomize allows no absolute paths), with every component alone and all together.
    let components = subdirectories(&manifests().join("components"))?;
    ensure!(!components.is_empty(), "no components");
    let scratch = tempfile::tempdir()?;
    copy_dir(&manifests(), &scratch.path().join("manifests"))?;
    let mut selections: Vec<Vec<String>> = components.iter().map(|c| vec![c.clone()]).collect();
    selections.push(components.clone());
    for selection in selections {
        let listed: String = selection
            .iter()
            .map(|c| format!("  - manifests/components/{c}\n"))
            .collect();
        std::fs::write(
            scratch.path().join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - manifests/base\ncomponents:\n{listed}"
            ),
        )?;
        let objects = render(&kubectl, scratch.path())?;
        assert_clean(&format!("base + components {selection:?}"), &check_all(&objects));
    }
    Ok(())
}

#[test]
fn the_kind_overlay_runs_the_image_make_image_builds() -> Result<()> {
    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not on PATH: the kind overlay is not checked");
        return Ok(());
    };
    let makefile = read(&repo().join("Makefile"))?;
    let image = makefile
        .lines()
        .find_map(|l| l.strip_prefix("IMAGE ?="))
        .map(str::trim)
        .context("no `IMAGE ?=` in the Makefile")?;
    let objects = render(&kubectl, &manifests().join("overlays/kind"))?;
    for deployment in of_kind(&objects, "Deployment") {
        for container in items(deployment, "spec.template.spec.containers") {
            assert_eq!(text(container, "image"), image, "{}", id(deployment));
            assert_eq!(
                text(container, "imagePullPolicy"),
                "IfNotPresent",
                "{}",
                id(deployment)
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tests: every check catches what it is for (mutated copies of the base)

fn expect_caught(what: &str, problems: Vec<String>, needle: &str) {
    assert!(
        problems.iter().any(|p| p.contains(needle)),
        "{what}: expected a problem mentioning {needle:?}, got {problems:?}"
    );
}

#[test]
fn a_wildcard_in_any_role_field_is_caught() -> Result<()> {
    for (field, role_kind, role) in [
        ("verbs", "ClusterRole", "holdfast-controller"),
        ("resources", "ClusterRole", "holdfast-webhook"),
        ("apiGroups", "Role", "holdfast-webhook"),
        ("resourceNames", "ClusterRole", "holdfast-webhook-certs"),
    ] {
        let mut objects = base()?;
        let rule = at_mut(find_mut(&mut objects, role_kind, role)?, "rules.0")?;
        let list = rule
            .get_mut(field)
            .and_then(Value::as_sequence_mut)
            .with_context(|| format!("{role} rules[0] has no {field}"))?;
        list.push(Value::from("*"));
        expect_caught(
            &format!("`*` in {role}.{field}"),
            check_no_wildcards(&objects),
            "wildcard",
        );
    }
    // A rule added with everything, as `kubectl create clusterrole --verb='*'` would write it.
    let mut objects = base()?;
    let rules = at_mut(
        find_mut(&mut objects, "ClusterRole", "holdfast-controller")?,
        "rules",
    )?;
    let everything: Value = serde_yaml::from_str("{apiGroups: ['*'], resources: ['*'], verbs: ['*']}")?;
    rules.as_sequence_mut().context("rules")?.push(everything);
    expect_caught("a rule of wildcards", check_no_wildcards(&objects), "wildcard");
    Ok(())
}

#[test]
fn a_webhook_without_its_namespace_exclusions_is_caught() -> Result<()> {
    // No namespaceSelector at all.
    let mut objects = base()?;
    let webhook = at_mut(
        find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?,
        "webhooks.0",
    )?;
    webhook
        .as_mapping_mut()
        .context("webhook")?
        .remove("namespaceSelector");
    expect_caught(
        "no namespaceSelector",
        check_webhooks(&objects),
        "no namespaceSelector",
    );

    // kube-system no longer excluded.
    let mut objects = base()?;
    let values = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks.2.namespaceSelector.matchExpressions.0.values",
    )?;
    values
        .as_sequence_mut()
        .context("values")?
        .retain(|v| v.as_str() != Some("kube-system"));
    expect_caught(
        "kube-system not excluded",
        check_webhooks(&objects),
        "kube-system",
    );

    // The opt-out label dropped.
    let mut objects = base()?;
    let expressions = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks.0.namespaceSelector.matchExpressions",
    )?;
    expressions
        .as_sequence_mut()
        .context("matchExpressions")?
        .retain(|e| e.get("key").and_then(Value::as_str) != Some(IGNORE_LABEL));
    expect_caught("no opt-out label", check_webhooks(&objects), IGNORE_LABEL);
    Ok(())
}

#[test]
fn unsafe_webhook_settings_are_caught() -> Result<()> {
    let cases: [(&str, &str, &str, &str, &str); 7] = [
        (
            "MutatingWebhookConfiguration",
            "webhooks.0.sideEffects",
            "Some",
            "sideEffects",
            "sideEffects",
        ),
        (
            "MutatingWebhookConfiguration",
            "webhooks.1.timeoutSeconds",
            "30",
            "timeout 30",
            "timeoutSeconds",
        ),
        (
            "MutatingWebhookConfiguration",
            "webhooks.0.failurePolicy",
            "Fail",
            "mutation fails closed",
            "fail open",
        ),
        (
            "ValidatingWebhookConfiguration",
            "webhooks.1.failurePolicy",
            "Fail",
            "guard fails closed",
            "fail open",
        ),
        (
            "ValidatingWebhookConfiguration",
            "webhooks.2.failurePolicy",
            "Fail",
            "pod guard fails closed",
            "fail open",
        ),
        (
            "MutatingWebhookConfiguration",
            "webhooks.0.reinvocationPolicy",
            "Never",
            "no reinvocation",
            "IfNeeded",
        ),
        (
            "ValidatingWebhookConfiguration",
            "webhooks.0.clientConfig.service.path",
            "/mutate",
            "wrong path",
            "clientConfig",
        ),
    ];
    for (configuration, path, value, what, needle) in cases {
        let mut objects = base()?;
        *at_mut(find_mut(&mut objects, configuration, "holdfast")?, path)? = serde_yaml::from_str(value)?;
        expect_caught(what, check_webhooks(&objects), needle);
    }
    // admissionReviewVersions with v1beta1 too.
    let mut objects = base()?;
    *at_mut(
        find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?,
        "webhooks.0.admissionReviewVersions",
    )? = serde_yaml::from_str("[v1, v1beta1]")?;
    expect_caught(
        "v1beta1 reviews",
        check_webhooks(&objects),
        "admissionReviewVersions",
    );
    Ok(())
}

#[test]
fn rules_the_code_does_not_serve_and_served_rules_left_out_are_caught() -> Result<()> {
    // A rule for Deployments: holdfast has no rule for them.
    let mut objects = base()?;
    let rules = at_mut(
        find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?,
        "webhooks.1.rules",
    )?;
    let deployments: Value = serde_yaml::from_str(
        "{apiGroups: [apps], apiVersions: [v1], resources: [deployments], operations: [CREATE], scope: Namespaced}",
    )?;
    rules.as_sequence_mut().context("rules")?.push(deployments);
    expect_caught(
        "deployments registered",
        check_served(&objects),
        "not served by the code",
    );

    // The build-pod webhook removed.
    let mut objects = base()?;
    let list = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks",
    )?;
    list.as_sequence_mut().context("webhooks")?.truncate(2);
    expect_caught("pods not registered", check_served(&objects), "not registered");

    // DELETE added to the terminating guard.
    let mut objects = base()?;
    let operations = at_mut(
        find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?,
        "webhooks.1.rules.0.operations",
    )?;
    operations
        .as_sequence_mut()
        .context("operations")?
        .push(Value::from("DELETE"));
    expect_caught("DELETE registered", check_served(&objects), "DELETE");
    Ok(())
}

#[test]
fn containers_that_are_not_restricted_are_caught() -> Result<()> {
    let cases: [(&str, &str, &str); 7] = [
        (
            "securityContext.readOnlyRootFilesystem",
            "false",
            "readOnlyRootFilesystem",
        ),
        (
            "securityContext.allowPrivilegeEscalation",
            "true",
            "allowPrivilegeEscalation",
        ),
        ("securityContext.capabilities", "{drop: [NET_RAW]}", "drop ALL"),
        ("securityContext.runAsNonRoot", "false", "runAsNonRoot"),
        (
            "securityContext.seccompProfile",
            "{type: Unconfined}",
            "seccompProfile",
        ),
        ("resources", "{requests: {cpu: 10m, memory: 10Mi}}", "limits.cpu"),
        ("securityContext.privileged", "true", "privileged"),
    ];
    for (path, value, needle) in cases {
        let mut objects = base()?;
        let container = at_mut(
            find_mut(&mut objects, "Deployment", "holdfast-controller")?,
            "spec.template.spec.containers.0",
        )?;
        let (parent, key) = path.rsplit_once('.').unwrap_or(("", path));
        let target = if parent.is_empty() {
            container
        } else {
            at_mut(container, parent)?
        };
        target
            .as_mapping_mut()
            .context("not a mapping")?
            .insert(Value::from(key), serde_yaml::from_str(value)?);
        expect_caught(path, check_containers(&objects), needle);
    }
    Ok(())
}

#[test]
fn a_drifted_rbac_table_is_caught() -> Result<()> {
    let doc = rbac_from_doc(&security_md()?, RBAC_TABLE)?;
    let mut objects = base()?;
    let verbs = at_mut(
        find_mut(&mut objects, "ClusterRole", "holdfast-controller")?,
        "rules.0.verbs",
    )?;
    verbs
        .as_sequence_mut()
        .context("verbs")?
        .push(Value::from("update"));
    expect_caught(
        "an undocumented verb",
        compare_rbac(&doc, &rbac_from_manifests(&objects)),
        "not in SECURITY.md",
    );
    Ok(())
}

#[test]
fn a_controller_without_high_availability_or_lease_rbac_is_caught() -> Result<()> {
    assert_clean("the base", &check_availability(&base()?));
    let mut objects = base()?;
    *at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-controller")?,
        "spec.replicas",
    )? = Value::from(1);
    expect_caught(
        "one controller",
        check_availability(&objects),
        "must run at least 2",
    );

    // Each lease rule removed from the controller's Role: the election could not run.
    for (index, verb) in [(1, "create"), (2, "get")] {
        let mut objects = base()?;
        let rules = at_mut(find_mut(&mut objects, "Role", "holdfast-controller")?, "rules")?
            .as_sequence_mut()
            .context("rules")?;
        ensure!(
            strings(rules[index].get("resources")) == ["leases"],
            "rules[{index}] of Role holdfast-controller is not the lease rule"
        );
        rules.remove(index);
        expect_caught(
            &format!("no lease rule {index}"),
            check_availability(&objects),
            &format!("may not {verb} its Lease"),
        );
    }
    // The Lease named by --lease-name is not the one RBAC names.
    let mut objects = base()?;
    at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-controller")?,
        "spec.template.spec.containers.0.args",
    )?
    .as_sequence_mut()
    .context("args")?
    .iter_mut()
    .filter(|a| a.as_str().is_some_and(|a| a.starts_with("--lease-name=")))
    .for_each(|a| *a = Value::from("--lease-name=other"));
    expect_caught(
        "another lease",
        check_availability(&objects),
        "may not get its Lease",
    );
    // No identity: every replica would claim the Lease as the same holder.
    let mut objects = base()?;
    at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-controller")?,
        "spec.template.spec.containers.0.env",
    )?
    .as_sequence_mut()
    .context("env")?
    .retain(|e| text(e, "name") != "POD_NAME");
    expect_caught("no identity", check_availability(&objects), "no identity");

    let mut objects = base()?;
    *at_mut(
        find_mut(&mut objects, "Deployment", "holdfast-webhook")?,
        "spec.replicas",
    )? = Value::from(1);
    expect_caught("one webhook", check_availability(&objects), "fewer than 2");
    Ok(())
}

#[test]
fn an_open_admin_port_is_caught() -> Result<()> {
    let mut objects = base()?;
    let rule = at_mut(
        find_mut(&mut objects, "NetworkPolicy", "holdfast-webhook")?,
        "spec.ingress.1",
    )?;
    rule.as_mapping_mut().context("rule")?.remove("from");
    expect_caught("admin port open", check_network(&objects), "admin port");

    let mut objects = base()?;
    let rule = at_mut(
        find_mut(&mut objects, "NetworkPolicy", "holdfast-controller")?,
        "spec.ingress.0",
    )?;
    rule.as_mapping_mut().context("rule")?.remove("from");
    expect_caught(
        "controller admin port open",
        check_network(&objects),
        "admin port",
    );
    Ok(())
}

/// The controller's admin port: `--admin-addr` (documented) is the container's `admin` port,
/// the probes ask it (`/healthz` for liveness, `/readyz` for readiness), and a NetworkPolicy
/// opens it to scrapers only.
#[test]
fn the_controller_serves_its_probes_and_metrics_on_its_admin_port() -> Result<()> {
    let objects = base()?;
    let readme = read(&repo().join("README.md"))?;
    let deployment = find(&objects, "Deployment", "holdfast-controller")?;
    let container = at(deployment, "spec.template.spec.containers.0").context("no container")?;
    let addr = strings(container.get("args"))
        .into_iter()
        .find_map(|a| a.strip_prefix("--admin-addr=").map(str::to_owned))
        .context("no --admin-addr")?;
    let controller_section = readme
        .split_once("### `holdfast-controller`")
        .map(|(_, rest)| rest)
        .context("no holdfast-controller section in README.md")?;
    ensure!(
        controller_section.contains("`--admin-addr`"),
        "--admin-addr is not documented for holdfast-controller in README.md"
    );
    let admin = items(container, "ports")
        .into_iter()
        .find(|p| text(p, "name") == "admin")
        .and_then(|p| at(p, "containerPort").and_then(Value::as_i64))
        .context("no container port named admin")?;
    assert_eq!(
        addr.rsplit(':').next(),
        Some(admin.to_string().as_str()),
        "--admin-addr vs port admin"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = at(container, &format!("{probe}.httpGet")).with_context(|| format!("no {probe}"))?;
        assert_eq!(text(get, "path"), path, "{probe}");
        assert_eq!(text(get, "port"), "admin", "{probe}");
    }
    let pod_labels = at(deployment, "spec.template.metadata.labels").context("no pod labels")?;
    let opened = of_kind(&objects, "NetworkPolicy").into_iter().any(|policy| {
        let selects = at(policy, "spec.podSelector.matchLabels")
            .and_then(Value::as_mapping)
            .is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
        selects
            && items(policy, "spec.ingress").iter().any(|rule| {
                !items(rule, "from").is_empty()
                    && items(rule, "ports").iter().any(|p| text(p, "port") == "admin")
            })
    });
    ensure!(
        opened,
        "no NetworkPolicy lets scrapers reach the controller's admin port"
    );
    Ok(())
}

/// `(group, resource)` of every `delete` the controller's roles grant on others' objects (its
/// own digest cache, `holdfast.dev`, aside).
fn controller_deletes(objects: &[Value]) -> BTreeSet<(String, String)> {
    rbac_from_manifests(objects)
        .into_iter()
        .filter(|(role, group, _, _, verbs)| {
            role.split_whitespace()
                .nth(1)
                .is_some_and(|name| name.starts_with("holdfast-controller"))
                && group != "holdfast.dev"
                && verbs.contains("delete")
        })
        .flat_map(|(_, group, resources, _, _)| resources.into_iter().map(move |r| (group.clone(), r)))
        .collect()
}

/// `(group, resource)` of the fast finalizer's table, opt-in ones or the others.
fn deletable(opt_in: bool) -> BTreeSet<(String, String)> {
    holdfast_controller::deletable::DELETABLE
        .iter()
        .filter(|d| d.opt_in.is_some() == opt_in)
        .map(|d| (d.group.to_owned(), d.resource.to_owned()))
        .collect()
}

/// The controller may delete exactly what `controller/src/deletable.rs` lists: the base grants
/// the always-on kinds, `components/fast-org-deletion` the opt-in ones (and sets their flag).
#[test]
fn the_controllers_delete_rules_are_the_fast_finalizers_table() -> Result<()> {
    ensure!(
        controller_deletes(&base()?) == deletable(false),
        "base: the controller's delete rules {:?} are not the table's {:?}",
        controller_deletes(&base()?),
        deletable(false)
    );
    let component = load_kustomization(&manifests().join("components/fast-org-deletion"))?;
    ensure!(
        controller_deletes(&component) == deletable(true),
        "components/fast-org-deletion: {:?} are not the table's opt-in kinds {:?}",
        controller_deletes(&component),
        deletable(true)
    );
    let kustomization = read(&manifests().join("components/fast-org-deletion/kustomization.yaml"))?;
    for flag in holdfast_controller::deletable::DELETABLE
        .iter()
        .filter_map(|d| d.opt_in)
    {
        ensure!(
            kustomization.contains(&format!("{flag}=true")),
            "components/fast-org-deletion does not set {flag}"
        );
    }
    Ok(())
}

/// Issue 15, item 6: the component issued a self-signed leaf with `rotationPolicy: Always`, so
/// the trust anchor in the caBundle changed on every renewal. The certificate the webhook
/// configurations inject from must come from a CA Issuer whose CA a self-signed bootstrap
/// Issuer signed.
#[test]
fn cert_manager_issues_the_leaf_from_a_ca_issuer_chain() -> Result<()> {
    let objects = load_kustomization(&manifests().join("components/cert-manager"))?;
    let issuer = |name: &str| -> Result<&Value> { find(&objects, "Issuer", name) };
    let injected = read(&manifests().join("components/cert-manager/kustomization.yaml"))?;
    let from = "cert-manager.io/inject-ca-from: holdfast-system/";
    let leaf_name = injected
        .lines()
        .find_map(|line| line.trim().strip_prefix(from))
        .context("the webhook configurations inject no CA")?;
    let leaf = find(&objects, "Certificate", leaf_name)?;
    ensure!(
        at(leaf, "spec.isCA") != Some(&Value::Bool(true)),
        "the leaf is a CA"
    );
    let ca_issuer = issuer(text(leaf, "spec.issuerRef.name"))?;
    let ca_secret = text(ca_issuer, "spec.ca.secretName");
    ensure!(!ca_secret.is_empty(), "the leaf's Issuer is not a CA Issuer");
    let ca = of_kind(&objects, "Certificate")
        .into_iter()
        .find(|c| text(c, "spec.secretName") == ca_secret)
        .context("no Certificate makes the CA Issuer's Secret")?;
    ensure!(
        at(ca, "spec.isCA") == Some(&Value::Bool(true)),
        "the CA Certificate is not a CA"
    );
    let bootstrap = issuer(text(ca, "spec.issuerRef.name"))?;
    ensure!(
        at(bootstrap, "spec.selfSigned").is_some(),
        "the CA is not issued by a self-signed bootstrap Issuer"
    );
    Ok(())
}

/// `components/restrict-egress` selects both Deployments' pods and allows what they call: DNS,
/// the API server and registries (HTTPS).
#[test]
fn the_egress_component_allows_dns_the_api_server_and_registries() -> Result<()> {
    let objects = load_kustomization(&manifests().join("components/restrict-egress"))?;
    let policy = find(&objects, "NetworkPolicy", "holdfast-egress")?;
    ensure!(
        strings(at(policy, "spec.policyTypes")) == ["Egress"],
        "not an egress policy"
    );
    let selector = at(policy, "spec.podSelector.matchLabels").context("no podSelector")?;
    for deployment in of_kind(&base()?, "Deployment") {
        let labels = at(deployment, "spec.template.metadata.labels");
        let selected = selector
            .as_mapping()
            .is_some_and(|m| m.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)));
        ensure!(selected, "{} is not selected", id(deployment));
    }
    let ports: BTreeSet<i64> = items(policy, "spec.egress")
        .iter()
        .flat_map(|rule| items(rule, "ports"))
        .filter_map(|p| at(p, "port").and_then(Value::as_i64))
        .collect();
    for port in [53, 443, 6443] {
        ensure!(ports.contains(&port), "egress to port {port} is not allowed");
    }
    Ok(())
}

/// A label selector as SECURITY.md writes it: `key operator (values)` and `key=value` terms,
/// `; ` between them, `—` for none.
fn selector_text(selector: Option<&Value>) -> String {
    let Some(selector) = selector else {
        return "—".into();
    };
    let mut terms: Vec<String> = Vec::new();
    if let Some(labels) = at(selector, "matchLabels").and_then(Value::as_mapping) {
        for (k, v) in labels {
            terms.push(format!(
                "{}={}",
                k.as_str().unwrap_or_default(),
                v.as_str().unwrap_or_default()
            ));
        }
    }
    for expression in items(selector, "matchExpressions") {
        let values = strings(expression.get("values"));
        let operator = text(expression, "operator");
        terms.push(if values.is_empty() {
            format!("{} {operator}", text(expression, "key"))
        } else {
            format!("{} {operator} ({})", text(expression, "key"), values.join(", "))
        });
    }
    if terms.is_empty() {
        "—".into()
    } else {
        terms.join("; ")
    }
}

/// `name: expression` of a webhook's matchConditions, `; ` between them, `—` for none.
fn conditions_text(webhook: Option<&Value>) -> String {
    let conditions: Vec<String> = webhook
        .map(|w| items(w, "matchConditions"))
        .unwrap_or_default()
        .iter()
        .map(|c| format!("{}: {}", text(c, "name"), text(c, "expression")))
        .collect();
    if conditions.is_empty() {
        "—".into()
    } else {
        conditions.join("; ")
    }
}

/// `(webhook, namespaceSelector, objectSelector, matchConditions, failurePolicy, sideEffects,
/// timeoutSeconds, scope)`.
type SettingsRow = (String, String, String, String, String, String, String, String);

const SETTINGS_TABLE: &str = "| Webhook setting | namespaceSelector |";

fn settings_from_doc(markdown: &str) -> Result<BTreeSet<SettingsRow>> {
    let mut rows = BTreeSet::new();
    for cells in table(markdown, SETTINGS_TABLE)? {
        ensure!(
            cells.len() == 8,
            "webhook settings row with {} cells: {cells:?}",
            cells.len()
        );
        let c = |i: usize| plain(&cells[i]);
        rows.insert((c(0), c(1), c(2), c(3), c(4), c(5), c(6), c(7)));
    }
    Ok(rows)
}

/// The settings of every webhook in `objects`; matchConditions from `conditions` (the
/// match-conditions component's webhooks, by name).
fn settings_from_manifests(objects: &[Value], conditions: &[Value]) -> BTreeSet<SettingsRow> {
    let with_conditions: Vec<&Value> = conditions.iter().flat_map(|c| items(c, "webhooks")).collect();
    webhooks(objects)
        .into_iter()
        .map(|(_, webhook)| {
            let name = text(webhook, "name");
            let scalar = |field: &str| match webhook.get(field) {
                Some(Value::Number(n)) => n.to_string(),
                Some(Value::String(s)) => s.clone(),
                _ => "—".into(),
            };
            let mut scopes: Vec<String> = items(webhook, "rules")
                .iter()
                .map(|r| match r.get("scope") {
                    Some(Value::String(scope)) => scope.clone(),
                    _ => "*".into(),
                })
                .collect();
            scopes.sort();
            scopes.dedup();
            let in_base = conditions_text(Some(webhook));
            let component = with_conditions.iter().find(|w| text(w, "name") == name).copied();
            (
                name.to_owned(),
                selector_text(webhook.get("namespaceSelector")),
                selector_text(webhook.get("objectSelector")),
                // The base has none; a condition in the base would show as a mismatch.
                if in_base == "—" {
                    conditions_text(component)
                } else {
                    format!("base: {in_base}")
                },
                scalar("failurePolicy"),
                scalar("sideEffects"),
                scalar("timeoutSeconds"),
                scopes.join(", "),
            )
        })
        .collect()
}

fn compare_settings(doc: &BTreeSet<SettingsRow>, manifests: &BTreeSet<SettingsRow>) -> Vec<String> {
    let mut problems: Vec<String> = manifests
        .difference(doc)
        .map(|row| format!("in the manifests but not in SECURITY.md's webhook settings: {row:?}"))
        .collect();
    problems.extend(
        doc.difference(manifests)
            .map(|row| format!("in SECURITY.md's webhook settings but not in the manifests: {row:?}")),
    );
    problems
}

fn match_conditions_component() -> Result<Vec<Value>> {
    let dir = manifests().join("components/match-conditions");
    let mut objects = Vec::new();
    for file in ["mutating.yaml", "validating.yaml"] {
        objects.extend(parse_documents(&read(&dir.join(file))?)?);
    }
    Ok(objects)
}

/// Issue 15, item 7: SECURITY.md held the manifests to names, paths and failure policies only.
/// Every security-relevant field of every webhook is now in its settings table.
#[test]
fn every_security_relevant_webhook_setting_is_the_one_security_md_states() -> Result<()> {
    let doc = settings_from_doc(&security_md()?)?;
    let manifests = settings_from_manifests(&base()?, &match_conditions_component()?);
    assert_clean(
        "SECURITY.md vs manifests (webhook settings)",
        &compare_settings(&doc, &manifests),
    );
    Ok(())
}

#[test]
fn a_drifted_webhook_setting_is_caught() -> Result<()> {
    let doc = settings_from_doc(&security_md()?)?;
    let conditions = match_conditions_component()?;
    let drifts: [(&str, &str, Value); 6] = [
        ("namespaceSelector", "namespace", Value::Null),
        (
            "objectSelector",
            "objectSelector",
            serde_yaml::from_str("{matchLabels: {a: b}}")?,
        ),
        ("failurePolicy", "failurePolicy", Value::String("Fail".into())),
        ("sideEffects", "sideEffects", Value::String("NoneOnDryRun".into())),
        ("timeoutSeconds", "timeoutSeconds", serde_yaml::from_str("30")?),
        (
            "matchConditions",
            "matchConditions",
            serde_yaml::from_str("[{name: x, expression: 'true'}]")?,
        ),
    ];
    for (field, needle, value) in drifts {
        let mut objects = base()?;
        let configuration = find_mut(&mut objects, "MutatingWebhookConfiguration", "holdfast")?;
        let webhook = at_mut(configuration, "webhooks.0")?;
        match (field, value) {
            ("namespaceSelector", _) => {
                if let Some(map) = webhook.as_mapping_mut() {
                    map.remove("namespaceSelector");
                }
            }
            (field, value) => webhook[field] = value,
        }
        let problems = compare_settings(&doc, &settings_from_manifests(&objects, &conditions));
        ensure!(
            !problems.is_empty(),
            "a changed {field} ({needle}) went unnoticed"
        );
    }
    // A rule's scope widened to cluster-wide objects.
    let mut objects = base()?;
    let configuration = find_mut(&mut objects, "ValidatingWebhookConfiguration", "holdfast")?;
    at_mut(configuration, "webhooks.0.rules.0")?["scope"] = Value::String("*".into());
    ensure!(
        !compare_settings(&doc, &settings_from_manifests(&objects, &conditions)).is_empty(),
        "a widened scope went unnoticed"
    );
    Ok(())
}

/// Issue 15, items 1-2: the webhook's ServiceAccount could create and patch DigestCacheEntry
/// objects, so its token (or any pod reaching port 8443, through forged reviews) could plant
/// entries naming another namespace's Secret and grow etcd. It may only read them now.
#[test]
fn the_webhook_cannot_write_the_digest_cache() -> Result<()> {
    let writes: Vec<RbacRow> = rbac_from_manifests(&base()?)
        .into_iter()
        .filter(|(role, group, resources, _, verbs)| {
            role.ends_with("holdfast-webhook")
                && group == "holdfast.dev"
                && resources.contains("digestcacheentries")
                && verbs
                    .iter()
                    .any(|v| !["get", "list", "watch"].contains(&v.as_str()))
        })
        .collect();
    ensure!(
        writes.is_empty(),
        "the webhook may write digest cache entries: {writes:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The controller's fence (manifests/base/controller/fence.yaml; issue 15, item 5)

const FENCE: &str = "holdfast-controller-fence";

/// What the fence can see of one row of the fast finalizer's table, as the policy's `deletable`
/// variable writes it: the resource (`resource.group`), the label that finds it, and the kind
/// (`Kind.group`) an ownerReference must name — the controller reference if `controller` — or
/// `''` when its namespace must be being deleted. Whether that owner is being deleted, and has
/// that uid, is not in the request: the controller checks it (`deletable::permits`).
fn fence_row(row: &holdfast_controller::deletable::Deletable) -> String {
    use holdfast_controller::deletable::Condition;
    let resource = match row.group {
        "" => row.resource.to_owned(),
        group => format!("{}.{group}", row.resource),
    };
    let (owner, controller) = match row.condition {
        Condition::OwnerTerminating {
            group,
            kind,
            controller,
            ..
        } => (format!("{kind}.{group}"), controller),
        Condition::NamespaceTerminating => (String::new(), false),
    };
    format!(
        "{{'resource': '{resource}', 'label': '{}', 'owner': '{owner}', 'controller': '{controller}'}}",
        row.label.unwrap_or_default()
    )
}

/// The rows of the fence for a controller started with `args`: every row of `DELETABLE` that
/// is always on or whose opt-in flag the args set.
fn fence_rows_for(args: &[String]) -> Vec<String> {
    holdfast_controller::deletable::DELETABLE
        .iter()
        .filter(|d| d.opt_in.is_none_or(|flag| args.contains(&format!("{flag}=true"))))
        .map(fence_row)
        .collect()
}

/// The policy's variable `name`, as written.
fn fence_variable<'a>(policy: &'a Value, name: &str) -> &'a str {
    items(policy, "spec.variables")
        .into_iter()
        .find(|v| text(v, "name") == name)
        .map(|v| text(v, "expression"))
        .unwrap_or_default()
}

/// The rows of the policy's `deletable` variable: one per line, as the file lays them out.
fn fence_rows(policy: &Value) -> Vec<String> {
    fence_variable(policy, "deletable")
        .lines()
        .map(|l| l.trim().trim_end_matches(',').to_owned())
        .filter(|l| l.starts_with('{'))
        .collect()
}

/// The fence is installed, fails closed, denies, binds to holdfast-controller's ServiceAccount
/// (as the controller Deployment runs it, in its namespace), holds the table's rows for the
/// controller's flags, and answers every refusal with 403 Forbidden: a 422 without causes is what
/// the controller takes for a failed resourceVersion guard and retries quietly
/// (`controller/src/pinning.rs`, `guard_failed`).
fn check_fence(objects: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let (Ok(policy), Ok(controller)) = (
        find(objects, "ValidatingAdmissionPolicy", FENCE),
        find(objects, "Deployment", "holdfast-controller"),
    ) else {
        return vec![format!("no ValidatingAdmissionPolicy {FENCE} (or no controller)")];
    };
    if text(policy, "spec.failurePolicy") != "Fail" {
        problems.push(format!("{}: failurePolicy is not Fail", id(policy)));
    }
    let account = format!(
        "system:serviceaccount:{}:{}",
        text(controller, "metadata.namespace"),
        text(controller, "spec.template.spec.serviceAccountName")
    );
    let conditions = items(policy, "spec.matchConditions");
    if conditions.len() != 1
        || text(conditions[0], "expression") != format!("request.userInfo.username == '{account}'")
    {
        problems.push(format!("{}: does not match {account} alone", id(policy)));
    }
    let rules: BTreeSet<(Vec<String>, Vec<String>, Vec<String>)> =
        items(policy, "spec.matchConstraints.resourceRules")
            .into_iter()
            .map(|r| {
                (
                    strings(r.get("operations")),
                    strings(r.get("apiGroups")),
                    strings(r.get("resources")),
                )
            })
            .collect();
    // Every DELETE, and the UPDATEs of the pinned kinds kube-apiserver admits itself: Packages
    // go to kapp-controller's aggregated API server, which no policy of kube-apiserver sees.
    let mut expected = BTreeSet::from([(vec!["DELETE".into()], vec!["*".into()], vec!["*".into()])]);
    for kind in holdfast_pins::PinnedKind::ALL {
        if kind != holdfast_pins::PinnedKind::Package {
            expected.insert((
                vec!["UPDATE".into()],
                vec![kind.group().into()],
                vec![kind.resource().into()],
            ));
        }
    }
    if rules != expected {
        problems.push(format!("{}: matches {rules:?}, not {expected:?}", id(policy)));
    }
    let args = strings(at(controller, "spec.template.spec.containers.0.args"));
    let (rows, wanted) = (fence_rows(policy), fence_rows_for(&args));
    if rows != wanted {
        problems.push(format!(
            "{}: the deletable rows are not controller/src/deletable.rs's DELETABLE for the controller's flags; they should read:\n{}",
            id(policy),
            wanted.join(",\n")
        ));
    }
    for (i, validation) in items(policy, "spec.validations").iter().enumerate() {
        if text(validation, "reason") != "Forbidden" {
            problems.push(format!(
                "{}: validations[{i}] answers without reason Forbidden",
                id(policy)
            ));
        }
    }
    let bindings: Vec<&Value> = of_kind(objects, "ValidatingAdmissionPolicyBinding")
        .into_iter()
        .filter(|b| text(b, "spec.policyName") == FENCE)
        .collect();
    let enforced = bindings.iter().any(|b| {
        strings(b.get("spec").and_then(|s| s.get("validationActions"))) == ["Deny"]
            && at(b, "spec.matchResources").is_none()
            && at(b, "spec.paramRef").is_none()
    });
    if !enforced {
        problems.push(format!(
            "no binding of {FENCE} with validationActions [Deny] on every object"
        ));
    }
    problems
}

#[test]
fn the_fence_is_the_fast_finalizers_table_and_binds_the_controller() -> Result<()> {
    let objects = base()?;
    assert_clean("the base's fence", &check_fence(&objects));
    // The base's rows are the always-on ones; the opt-in rows come with their component.
    let policy = find(&objects, "ValidatingAdmissionPolicy", FENCE)?;
    ensure!(
        fence_rows(policy) == fence_rows_for(&[]),
        "{:?}",
        fence_rows(policy)
    );
    Ok(())
}

/// Renders the base with `components` (a copy of manifests/ in a scratch directory).
fn render_with_components(kubectl: &Path, components: &[&str]) -> Result<Vec<Value>> {
    let scratch = tempfile::tempdir()?;
    copy_dir(&manifests(), &scratch.path().join("manifests"))?;
    let listed: String = components
        .iter()
        .map(|c| format!("  - manifests/components/{c}\n"))
        .collect();
    std::fs::write(
        scratch.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - manifests/base\ncomponents:\n{listed}"
        ),
    )?;
    render(kubectl, scratch.path())
}

/// `components/fast-org-deletion` turns on `--delete-org-spaces` and the fence's CFSpace row
/// together, and changes nothing else of the fence.
#[test]
fn the_fence_lets_cfspaces_go_only_with_fast_org_deletion() -> Result<()> {
    let Some(kubectl) = kubectl() else {
        eprintln!("kubectl is not on PATH: the fence with fast-org-deletion is not checked");
        return Ok(());
    };
    let base = render(&kubectl, &manifests())?;
    let opted = render_with_components(&kubectl, &["fast-org-deletion"])?;
    assert_clean("base + fast-org-deletion", &check_fence(&opted));
    let all_rows: Vec<String> = holdfast_controller::deletable::DELETABLE
        .iter()
        .map(fence_row)
        .collect();
    let policy = find(&opted, "ValidatingAdmissionPolicy", FENCE)?;
    ensure!(fence_rows(policy) == all_rows, "{:?}", fence_rows(policy));
    ensure!(
        fence_rows(find(&base, "ValidatingAdmissionPolicy", FENCE)?) != all_rows,
        "the base's fence already holds the opt-in rows"
    );
    let mut without_rows = policy.clone();
    let mut base_policy = find(&base, "ValidatingAdmissionPolicy", FENCE)?.clone();
    for p in [&mut without_rows, &mut base_policy] {
        *at_mut(p, "spec.variables.1.expression")? = Value::Null;
    }
    ensure!(
        without_rows == base_policy,
        "components/fast-org-deletion changes more of the fence than its deletable rows"
    );
    Ok(())
}

#[test]
fn a_fence_that_drifts_from_the_table_or_the_controller_is_caught() -> Result<()> {
    fn with(change: impl FnOnce(&mut Vec<Value>) -> Result<()>) -> Result<Vec<String>> {
        let mut objects = base()?;
        change(&mut objects)?;
        Ok(check_fence(&objects))
    }
    fn policy(objects: &mut [Value]) -> Result<&mut Value> {
        find_mut(objects, "ValidatingAdmissionPolicy", FENCE)
    }
    let rows = |objects: &mut Vec<Value>, edit: &dyn Fn(&str) -> String| -> Result<()> {
        let expression = at_mut(policy(objects)?, "spec.variables.1.expression")?;
        *expression = Value::from(edit(expression.as_str().unwrap_or_default()));
        Ok(())
    };
    expect_caught(
        "a row dropped",
        with(|o| {
            rows(o, &|e| {
                e.replace(&fence_row(&holdfast_controller::deletable::BUILD_POD), "")
            })
        })?,
        "DELETABLE",
    );
    expect_caught(
        "the opt-in row without its flag",
        with(|o| {
            rows(o, &|e| {
                e.replace(
                    "\n]",
                    &format!(
                        ",\n  {}\n]",
                        fence_row(&holdfast_controller::deletable::NAMESPACE_SPACE)
                    ),
                )
            })
        })?,
        "DELETABLE",
    );
    expect_caught(
        "pods without their label",
        with(|o| rows(o, &|e| e.replace("'label': 'kpack.io/build'", "'label': ''")))?,
        "DELETABLE",
    );
    expect_caught(
        "fails open",
        with(|o| {
            *at_mut(policy(o)?, "spec.failurePolicy")? = Value::from("Ignore");
            Ok(())
        })?,
        "failurePolicy",
    );
    expect_caught(
        "another account",
        with(|o| {
            *at_mut(policy(o)?, "spec.matchConditions.0.expression")? = Value::from(
                "request.userInfo.username == 'system:serviceaccount:default:holdfast-controller'",
            );
            Ok(())
        })?,
        "does not match",
    );
    expect_caught(
        "no longer every delete",
        with(|o| {
            *at_mut(policy(o)?, "spec.matchConstraints.resourceRules.0.resources")? =
                serde_yaml::from_str("[pods]")?;
            Ok(())
        })?,
        "matches",
    );
    expect_caught(
        "a 422",
        with(|o| {
            at_mut(policy(o)?, "spec.validations.2")?
                .as_mapping_mut()
                .context("validation")?
                .remove("reason");
            Ok(())
        })?,
        "reason Forbidden",
    );
    expect_caught(
        "warn only",
        with(|o| {
            *at_mut(
                find_mut(o, "ValidatingAdmissionPolicyBinding", FENCE)?,
                "spec.validationActions",
            )? = serde_yaml::from_str("[Warn]")?;
            Ok(())
        })?,
        "no binding",
    );
    expect_caught(
        "no fence",
        with(|o| {
            o.retain(|d| kind(d) != "ValidatingAdmissionPolicy");
            Ok(())
        })?,
        "no ValidatingAdmissionPolicy",
    );
    Ok(())
}

/// The properties of the fetch entries of kapp-controller's upstream CRDs (the peer's module,
/// collected by `make deps`), per resource: the entry's fields and each source's.
fn upstream_fetch_schema() -> Result<Option<Vec<(String, serde_json::Value)>>> {
    let Ok(dir) = holdfast_e2e::tools::peer_dir("kapp-controller") else {
        return Ok(None);
    };
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir.join("crds"))? {
        let path = entry?.path();
        if path.extension().is_none_or(|x| x != "yaml") {
            continue;
        }
        let crd: serde_json::Value = serde_yaml::from_str(&read(&path)?)?;
        let name = crd["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if ![
            "apps.kappctrl.k14s.io",
            "packagerepositories.packaging.carvel.dev",
        ]
        .contains(&name.as_str())
        {
            continue;
        }
        for version in crd["spec"]["versions"].as_array().into_iter().flatten() {
            let fetch = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["fetch"];
            let entry = if fetch["type"] == "array" {
                &fetch["items"]
            } else {
                fetch
            };
            found.push((
                format!("{name} {}", version["name"].as_str().unwrap_or_default()),
                entry.clone(),
            ));
        }
    }
    Ok(Some(found))
}

fn property_names(schema: &serde_json::Value) -> BTreeSet<String> {
    schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// The fence compares fetch entries field by field (CEL in Kubernetes 1.30 cannot drop a key
/// from an object): every field of the upstream CRDs' fetch entries must be either one it holds
/// unchanged (`fixed`, `sources`) or one pinning rewrites (`pins/src/sites.rs`: a source's
/// reference, `secretRef.name`, `tagSelection`). A field a new kapp-controller adds fails here.
#[test]
fn the_fence_holds_every_fetch_field_of_the_upstream_crds() -> Result<()> {
    let Some(schemas) = upstream_fetch_schema()? else {
        eprintln!(
            "kapp-controller's CRDs are not collected (make deps): the fence's fetch fields are not checked"
        );
        return Ok(());
    };
    ensure!(schemas.len() >= 2, "found only {schemas:?}");
    let objects = base()?;
    let policy = find(&objects, "ValidatingAdmissionPolicy", FENCE)?;
    // `f.?git`, `f.?image.?subPath`: the paths the policy holds unchanged.
    let fixed: BTreeSet<String> = fence_variable(policy, "fixed")
        .split("f.?")
        .skip(1)
        .map(|s| {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '?')
                .collect::<String>()
                .replace('?', "")
        })
        .collect();
    let sources = fence_variable(policy, "sources");
    let mut problems = Vec::new();
    for kind in [
        holdfast_pins::SiteKind::Image,
        holdfast_pins::SiteKind::ImgpkgBundle,
    ] {
        let source = kind.source_key();
        for needle in [
            format!("has(f.{source})"),
            format!("f.?{source}.?secretRef.hasValue()"),
        ] {
            if !sources.contains(&needle) {
                problems.push(format!("the fence's sources do not hold {needle}"));
            }
        }
    }
    for (crd, entry) in &schemas {
        let mut held: BTreeSet<String> = fixed.iter().filter(|p| !p.contains('.')).cloned().collect();
        for kind in [
            holdfast_pins::SiteKind::Image,
            holdfast_pins::SiteKind::ImgpkgBundle,
        ] {
            let source = kind.source_key();
            held.insert(source.to_owned());
            let schema = &entry["properties"][source];
            let rewritten = BTreeSet::from([
                kind.ref_key().to_owned(),
                "secretRef".into(),
                "tagSelection".into(),
            ]);
            let unchanged: BTreeSet<String> = fixed
                .iter()
                .filter_map(|p| p.strip_prefix(&format!("{source}.")).map(str::to_owned))
                .collect();
            let covered: BTreeSet<String> = rewritten.union(&unchanged).cloned().collect();
            if property_names(schema) != covered {
                problems.push(format!(
                    "{crd}: fetch[].{source} has {:?}; the fence covers {covered:?}",
                    property_names(schema)
                ));
            }
            let secret = property_names(&schema["properties"]["secretRef"]);
            if secret != BTreeSet::from(["name".to_owned()]) {
                problems.push(format!(
                    "{crd}: fetch[].{source}.secretRef has {secret:?}, not only name"
                ));
            }
        }
        let fields = property_names(entry);
        if !fields.is_subset(&held) {
            problems.push(format!(
                "{crd}: fetch entries have {:?} that the fence does not hold",
                fields.difference(&held).collect::<Vec<_>>()
            ));
        }
    }
    assert_clean("the fence's fetch fields", &problems);
    Ok(())
}
