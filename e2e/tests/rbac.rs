//! holdfast's RBAC proven sufficient and minimal on the real kube-apiserver (RBAC authorizer).
//!
//! - The manifests apply: the RBAC objects for real, everything with `--dry-run=server`.
//! - The webhook and the controller run as their ServiceAccounts (a token from the TokenRequest
//!   API, as the kubelet projects it into their pods), through the shared scenarios
//!   (`holdfast_e2e::scenarios`): pinning and fast deletion pass and no request is forbidden.
//!   The controller's fence (`manifests/base/controller/fence.yaml`) is installed and enforced
//!   throughout, so the scenarios also show it never refuses the controller's own work.
//! - Minimality: each rule of every Role and ClusterRole in `manifests/base/rbac/` is removed in
//!   turn; a scenario then fails, with a 403 for that rule's resource.
//!
//! With `HOLDFAST_E2E_KUBECONFIG` (the kind suite, `e2e/kind/`) holdfast is already installed
//! from `manifests/`: the scenarios run against its pods, and the minimality test, which edits
//! RBAC and runs the components in-process, refuses to run.

use std::{path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use holdfast_controller::leader::{LEASE, crd::ControllerLease};
use holdfast_controller::run::Settings;
use holdfast_e2e::{
    Env,
    accounts::{
        CONTROLLER, FENCE, Forbidden, NAMESPACE, WEBHOOK, install_rbac, kubectl_ok, manifests,
        service_account_client,
    },
    e2e_main,
    objects::parse_documents,
    scenarios,
    webhook::{Installed, LocalWebhook, Registration},
};
use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
    core::v1::Secret,
    rbac::v1::{ClusterRole, PolicyRule, Role},
};
use kube::{
    Api,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

e2e_main!(serial:
    the_manifests_apply_server_side,
    the_scenarios_pass_as_the_service_accounts,
    removing_any_rule_fails_a_scenario,
);

/// The names the manifests give the webhook configurations and the TLS Secret.
const CONFIGURATION: &str = "holdfast";
const TLS_SECRET: &str = "holdfast-webhook-tls";

async fn the_manifests_apply_server_side(env: Arc<Env>) -> Result<()> {
    if env.is_existing_cluster() {
        // Installed by e2e/kind/run.sh with this overlay: applying it again changes nothing.
        let overlay = manifests().join("overlays/kind");
        kubectl_ok(
            &env,
            &["apply", "-k", &overlay.display().to_string(), "--dry-run=server"],
        )?;
        return Ok(());
    }
    // Namespaced objects are checked against an existing namespace: install it (and the RBAC).
    install_rbac(&env).await?;
    // The base and the overlay README recommends both apply, whole, on this API server.
    for dir in [manifests(), manifests().join("overlays/recommended")] {
        let out = kubectl_ok(
            &env,
            &["apply", "-k", &dir.display().to_string(), "--dry-run=server"],
        )?;
        let fence = [
            format!("validatingadmissionpolicy.admissionregistration.k8s.io/{FENCE}"),
            format!("validatingadmissionpolicybinding.admissionregistration.k8s.io/{FENCE}"),
        ];
        for kind in [
            "deployment.apps/holdfast-webhook",
            "deployment.apps/holdfast-controller",
            "mutatingwebhookconfiguration.admissionregistration.k8s.io/holdfast",
            "validatingwebhookconfiguration.admissionregistration.k8s.io/holdfast",
            "networkpolicy.networking.k8s.io/holdfast-webhook",
            "poddisruptionbudget.policy/holdfast-webhook",
        ]
        .into_iter()
        .chain(fence.iter().map(String::as_str))
        {
            ensure!(
                out.contains(kind),
                "the dry run of {} did not apply {kind}:\n{out}",
                dir.display()
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// holdfast, in-process, as installed

struct Holdfast {
    webhook: Option<LocalWebhook>,
    controller: Option<(
        CancellationToken,
        JoinHandle<Result<(), holdfast_controller::run::Error>>,
    )>,
}

impl Holdfast {
    /// The state of a fresh install: no ControllerLease, the TLS Secret empty, no configuration left over.
    async fn reset(env: &Env) -> Result<()> {
        let admin = env.client().await?;
        let gone = |r: kube::Result<()>| match r {
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            other => other,
        };
        gone(
            Api::<ControllerLease>::namespaced(admin.clone(), NAMESPACE)
                .delete(LEASE, &DeleteParams::default())
                .await
                .map(drop),
        )?;
        gone(
            Api::<MutatingWebhookConfiguration>::all(admin.clone())
                .delete(CONFIGURATION, &DeleteParams::default())
                .await
                .map(drop),
        )?;
        gone(
            Api::<ValidatingWebhookConfiguration>::all(admin.clone())
                .delete(CONFIGURATION, &DeleteParams::default())
                .await
                .map(drop),
        )?;
        Api::<Secret>::namespaced(admin, NAMESPACE)
            .patch(
                TLS_SECRET,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": null})),
            )
            .await?;
        Ok(())
    }

    /// The webhook and the controller, each with its ServiceAccount's token, holdfast's
    /// namespace and the names the manifests use. `self` is filled as components come up, so a
    /// failure half-way still stops what started.
    async fn start(
        &mut self,
        env: &Arc<Env>,
        forbidden: &Forbidden,
        stopped: &CancellationToken,
    ) -> Result<()> {
        let controller_client = service_account_client(env, CONTROLLER, forbidden).await?;
        let cancel = CancellationToken::new();
        // Renewed every second within the scenarios, so the renewal's permissions are
        // exercised too.
        // Publishing the pinning policies' parameters, as the manifests run it.
        let settings = Settings {
            lease: LEASE.into(),
            publish_pins: true,
            ..holdfast_e2e::controller::settings(env, NAMESPACE, "controller")
        };
        let run = holdfast_controller::run::run(controller_client, settings, cancel.clone());
        let stopped = stopped.clone();
        let task = tokio::spawn(async move {
            let result = run.await;
            stopped.cancel();
            result
        });
        self.controller = Some((cancel, task));

        let mut registration = Registration::shipped();
        registration.installed = Some(Installed {
            client: service_account_client(env, WEBHOOK, forbidden).await?,
            namespace: NAMESPACE.into(),
            configuration: CONFIGURATION.into(),
        });
        self.webhook = Some(LocalWebhook::start(env.clone(), registration).await?);
        Ok(())
    }

    async fn stop(&mut self) -> Result<()> {
        if let Some((cancel, mut task)) = self.controller.take() {
            cancel.cancel();
            if tokio::time::timeout(Duration::from_secs(10), &mut task)
                .await
                .is_err()
            {
                task.abort();
                bail!("the controller did not stop within 10 s of its cancellation");
            }
        }
        if let Some(webhook) = self.webhook.take() {
            webhook.stop().await?;
        }
        Ok(())
    }
}

/// Starts holdfast as its ServiceAccounts and runs both scenarios in a namespace its webhook
/// serves. The outcome fails at the first forbidden request, or when a scenario fails; the
/// second result is stopping holdfast afterwards.
async fn scenarios_as_service_accounts(
    env: &Arc<Env>,
    forbidden: &Forbidden,
) -> Result<(Result<()>, Result<()>)> {
    // Packages exist only while kapp-controller serves their API: without it the controller's
    // rule for them would never be exercised.
    env.kapp_controller().await?;
    Holdfast::reset(env).await?;
    let mut holdfast = Holdfast {
        webhook: None,
        controller: None,
    };
    // The controller runs until cancelled; `stopped` fires if it ends on its own.
    let stopped = CancellationToken::new();
    let run = async {
        holdfast.start(env, forbidden, &stopped).await?;
        let webhook = holdfast.webhook.as_ref().context("webhook not started")?;
        let namespace = webhook.namespace("rbac").await?;
        let admin = env.client().await?;
        scenarios::pinning(env, &admin, &namespace, NAMESPACE).await?;
        scenarios::fast_deletion(&admin, &namespace).await
    };
    let outcome = tokio::select! {
        outcome = run => outcome,
        first = forbidden.first() => Err(anyhow::anyhow!("forbidden: {first}")),
        _ = stopped.cancelled() => Err(anyhow::anyhow!("the controller stopped (leader election failed)")),
    };
    let stopped = holdfast.stop().await;
    Ok((outcome, stopped))
}

async fn the_scenarios_pass_as_the_service_accounts(env: Arc<Env>) -> Result<()> {
    if env.is_existing_cluster() {
        // holdfast's pods, installed from manifests/ with their ServiceAccounts, serve every
        // namespace but kube-system, holdfast-system and opted-out ones.
        let admin = env.client().await?;
        let namespace = env.namespace("scenarios").await?;
        scenarios::pinning(&env, &admin, &namespace, NAMESPACE).await?;
        return scenarios::fast_deletion(&admin, &namespace).await;
    }
    install_rbac(&env).await?;
    let forbidden = Forbidden::new();
    let (outcome, stopped) = scenarios_as_service_accounts(&env, &forbidden).await?;
    outcome?;
    stopped?;
    let requests = forbidden.requests();
    ensure!(requests.is_empty(), "forbidden requests: {requests:?}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Minimality

/// A rule of one of holdfast's roles.
struct RoleRule {
    kind: &'static str,
    name: String,
    namespace: Option<String>,
    /// The ServiceAccount its binding names.
    account: String,
    rules: Vec<PolicyRule>,
}

/// Every Role and ClusterRole in `manifests/base/rbac/`, with the ServiceAccount it is bound to.
fn roles() -> Result<Vec<RoleRule>> {
    let mut documents = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifests().join("base/rbac"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    for file in files {
        for object in parse_documents(&std::fs::read_to_string(&file)?)? {
            documents.push(serde_json::to_value(object)?);
        }
    }
    let account_of = |role_kind: &str, name: &str| -> Result<String> {
        documents
            .iter()
            .find(|d| d["roleRef"]["kind"] == role_kind && d["roleRef"]["name"] == name)
            .and_then(|b| b["subjects"][0]["name"].as_str())
            .map(str::to_owned)
            .with_context(|| format!("{role_kind} {name} is bound to no ServiceAccount"))
    };
    let mut roles = Vec::new();
    for document in &documents {
        let (kind, rules, namespace) = match document["kind"].as_str() {
            Some("ClusterRole") => {
                let role: ClusterRole = serde_json::from_value(document.clone())?;
                ("ClusterRole", role.rules.unwrap_or_default(), None)
            }
            Some("Role") => {
                let role: Role = serde_json::from_value(document.clone())?;
                ("Role", role.rules.unwrap_or_default(), role.metadata.namespace)
            }
            _ => continue,
        };
        let name = document["metadata"]["name"]
            .as_str()
            .context("no name")?
            .to_owned();
        roles.push(RoleRule {
            kind,
            account: account_of(kind, &name)?,
            name,
            namespace,
            rules,
        });
    }
    Ok(roles)
}

/// Replaces the role's rules (as the cluster admin).
async fn set_rules(env: &Env, role: &RoleRule, rules: &[PolicyRule]) -> Result<()> {
    let admin = env.client().await?;
    let patch = Patch::Merge(json!({ "rules": rules }));
    match &role.namespace {
        Some(namespace) => {
            Api::<Role>::namespaced(admin, namespace)
                .patch(&role.name, &PatchParams::default(), &patch)
                .await?;
        }
        None => {
            Api::<ClusterRole>::all(admin)
                .patch(&role.name, &PatchParams::default(), &patch)
                .await?;
        }
    }
    Ok(())
}

/// Asks the API server whether the account may do what the rule's first verb allows.
async fn allowed(env: &Env, role: &RoleRule, rule: &PolicyRule) -> Result<bool> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{NAMESPACE}:{}", role.account)),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{NAMESPACE}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: rule.api_groups.as_ref().and_then(|g| g.first().cloned()),
                resource: rule.resources.as_ref().and_then(|r| r.first().cloned()),
                verb: rule.verbs.first().cloned(),
                name: rule.resource_names.as_ref().and_then(|n| n.first().cloned()),
                namespace: role.namespace.clone(),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(env.client().await?)
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The RBAC authorizer follows role changes through its own watch: ask it (a bounded poll, as
/// there is nothing to watch) until it answers `want`.
async fn until_authorizer_says(env: &Env, role: &RoleRule, rule: &PolicyRule, want: bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while allowed(env, role, rule).await? != want {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{} {}: the API server still says allowed={} for {rule:?} (is another rule granting it?)",
            role.kind,
            role.name,
            !want
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// `(group, resource)` of an API request path: `/api/v1/...` or `/apis/<group>/<version>/...`,
/// optionally under `namespaces/<ns>/`, with its subresource (`digestcacheentries/status`).
fn group_resource(request: &str) -> Option<(String, String)> {
    let path = request.split_whitespace().nth(1)?.split('?').next()?;
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest),
        ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest),
        _ => return None,
    };
    // A subresource is authorised as `resource/subresource` (digestcacheentries/status).
    let resource = match rest {
        ["namespaces", _, resource, _, subresource] => format!("{resource}/{subresource}"),
        ["namespaces", _, resource, ..] => (*resource).to_owned(),
        [resource, _, subresource] => format!("{resource}/{subresource}"),
        [resource, ..] => (*resource).to_owned(),
        [] => return None,
    };
    Some((group, resource))
}

fn rule_matches(rule: &PolicyRule, request: &str) -> bool {
    let Some((group, resource)) = group_resource(request) else {
        return false;
    };
    let listed =
        |list: &Option<Vec<String>>, value: &str| list.as_ref().is_some_and(|l| l.iter().any(|v| v == value));
    listed(&rule.api_groups, &group) && listed(&rule.resources, &resource)
}

async fn removing_any_rule_fails_a_scenario(env: Arc<Env>) -> Result<()> {
    if env.is_existing_cluster() {
        bail!("this test edits holdfast's RBAC and runs it in-process: local control plane only");
    }
    install_rbac(&env).await?;
    let mut problems = Vec::new();
    let mut cases = 0;
    for role in roles()? {
        for (index, rule) in role.rules.iter().enumerate() {
            cases += 1;
            let mut without = role.rules.clone();
            without.remove(index);
            set_rules(&env, &role, &without).await?;
            until_authorizer_says(&env, &role, rule, false).await?;

            let forbidden = Forbidden::new();
            let started = tokio::time::Instant::now();
            let (outcome, stopped) = scenarios_as_service_accounts(&env, &forbidden).await?;
            let requests = forbidden.requests();
            let what = format!(
                "{} {} rule {index} ({:?} {:?} {:?})",
                role.kind, role.name, rule.api_groups, rule.resources, rule.verbs
            );
            // A kind whose list stays forbidden must not hold the controller's stop (kube waits
            // for a store's first list before its graceful shutdown ends: controller::shutdown).
            if let Err(error) = stopped {
                problems.push(format!("{what}: {error:#}"));
            }
            match outcome {
                Ok(()) => problems.push(format!("{what}: removed, yet the scenarios passed")),
                Err(error) if !requests.iter().any(|r| rule_matches(rule, r)) => problems.push(format!(
                    "{what}: removed; the scenarios failed ({error:#}) but with no 403 for it: {requests:?}"
                )),
                Err(error) => eprintln!(
                    "without {what}: failed in {:.1} s: {error:#}",
                    started.elapsed().as_secs_f64()
                ),
            }

            set_rules(&env, &role, &role.rules).await?;
            until_authorizer_says(&env, &role, rule, true).await?;
        }
    }
    ensure!(cases >= 10, "only {cases} rules found in manifests/base/rbac");
    ensure!(
        problems.is_empty(),
        "rules not shown to be needed:\n{}",
        problems.join("\n")
    );
    Ok(())
}
