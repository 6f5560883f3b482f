//! Every workload's containers run as the `restricted` Pod Security profile demands, with
//! requests and limits.

use serde_yaml::Value;

use crate::yaml::{at, id, items, kind, strings, text};

/// Every container runs `restricted`, with requests and limits; no host access.
pub fn check_containers(objects: &[Value]) -> Vec<String> {
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
