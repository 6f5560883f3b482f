//! The scenarios run against holdfast *as installed*: its webhook serving the namespace given and
//! its controller running, whoever runs them. `e2e/tests/rbac.rs` runs them on the local control
//! plane with both components in-process and authenticated as their ServiceAccounts; on a kind
//! cluster (`e2e/kind/`) the same test runs them against the pods `manifests/` deploys. They
//! create only objects of their own, in the namespace they are given.

use std::{fmt::Debug, time::Duration};

use anyhow::{Context, Result, ensure};
use futures::{StreamExt, TryStreamExt};
use holdfast_cache::{CacheKey, Scope, cluster_store};
use holdfast_registry::Reference;
use k8s_openapi::api::{
    core::v1::{Namespace, Secret},
    events::v1::Event,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::{
    Env,
    control_plane::unique_name,
    images,
    objects::{api_for, parse_documents},
    wait,
};

/// A finalizer of the tests' own that holds an object in its terminating state.
pub const HOLD: &str = "e2e.holdfast.dev/hold";
/// The Secret the private App names; the registry is anonymous, so only reading it matters.
const CREDENTIALS: &str = "registry-credentials";

/// Creates the object in `yaml` in `namespace`.
pub async fn create(client: &Client, namespace: &str, yaml: &str) -> Result<DynamicObject> {
    let object = parse_documents(yaml)?
        .into_iter()
        .next()
        .context("no object in the YAML")?;
    let api = api_for(client, &object, Some(namespace)).await?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {}", object.name_any()))
}

/// Removes the tests' finalizer so the object can go (if it is still there).
pub async fn release(client: &Client, namespace: &str, object: &DynamicObject) -> Result<()> {
    let api = api_for(client, object, Some(namespace)).await?;
    let unhold = json!({"metadata": {"finalizers": null}});
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&unhold),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Waits, on a watch of `api`, until some object satisfies `found`.
pub async fn until_any<K>(api: &Api<K>, what: &str, found: impl Fn(&K) -> bool) -> Result<K>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
    let mut matching = std::pin::pin!(stream.try_filter(|o| futures::future::ready(found(o))));
    tokio::time::timeout(wait::DEFAULT_TIMEOUT, matching.next())
        .await
        .with_context(|| format!("timed out after {:?} waiting for {what}", wait::DEFAULT_TIMEOUT))?
        .with_context(|| format!("the watch for {what} ended"))?
        .with_context(|| format!("watching for {what}"))
}

pub fn app(name: &str, url: &str, secret: Option<&str>) -> String {
    let secret_ref = secret
        .map(|s| format!(", secretRef: {{name: {s}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: kappctrl.k14s.io/v1alpha1\nkind: App\nmetadata: {{name: {name}}}\nspec:\n  serviceAccountName: default\n  fetch:\n  - image: {{url: {url}{secret_ref}}}\n  template: [{{ytt: {{}}}}]\n  deploy: [{{kapp: {{}}}}]\n"
    )
}

/// The field manager that last wrote an object's `spec.fetch`.
fn fetch_manager(object: &DynamicObject) -> Option<String> {
    object
        .managed_fields()
        .iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:fetch").is_some())
        })
        .max_by_key(|m| m.time.clone())
        .and_then(|m| m.manager.clone())
}

fn url_of(app: Option<&DynamicObject>) -> Option<&str> {
    app.and_then(|a| a.data.pointer("/spec/fetch/0/image/url"))
        .and_then(|u| u.as_str())
}

/// Pinning, by both components:
/// - an App naming a fresh tag with a `secretRef` is admitted as written (the webhook never
///   reads Secrets, and no anonymous cache entry exists for the tag yet), then pinned by the
///   controller, which reads the Secret, and records a `Pinned` Event on it;
/// - an App naming the same tag without one is admitted pinned to the pushed digest (the
///   webhook);
/// - both resolutions are in the shared digest cache, as `DigestCacheEntry` objects in
///   holdfast's namespace (one per credential scope).
pub async fn pinning(env: &Env, client: &Client, namespace: &str, holdfast_namespace: &str) -> Result<()> {
    let repository = unique_name("scenario/config");
    let image = images::Image::with_files(&[("config.yml", repository.as_bytes())])?;
    let digest = images::push(env.registry(), &repository, "1.0.0", &image).await?;
    let tagged = format!("{}/{repository}:1.0.0", env.cluster_registry());
    let pinned = format!("{}/{repository}@{digest}", env.cluster_registry());

    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": CREDENTIALS},
        "stringData": {"username": "e2e", "password": "e2e"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &secret)
        .await
        .context("creating the registry credentials")?;

    let private = create(client, namespace, &app("private", &tagged, Some(CREDENTIALS))).await?;
    ensure!(
        url_of(Some(&private)) == Some(tagged.as_str()),
        "an App with a secretRef was pinned at admission, but the webhook reads no Secrets: {:?}",
        url_of(Some(&private))
    );
    let apps = api_for(client, &private, Some(namespace)).await?;
    let private = wait::until(&apps, "private", |a: Option<&DynamicObject>| {
        url_of(a) == Some(pinned.as_str())
    })
    .await
    .context("the controller did not pin the App with a secretRef")?
    .context("App private is gone")?;
    // The controller pins it with a patch of its own and says so in an Event, unless somebody
    // else wrote the App first (kapp-controller adds its finalizer right after the create):
    // then the webhook pins that write from the digest the controller just cached.
    if fetch_manager(&private).as_deref() == Some(holdfast_controller::pinning::MANAGER) {
        let events: Api<Event> = Api::namespaced(client.clone(), namespace);
        until_any(&events, "a Pinned Event on App private", |e: &Event| {
            e.reason.as_deref() == Some("Pinned")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("private")
        })
        .await?;
    }

    // An Event only the controller records, whoever wins the race above: a tag the registry
    // does not have, behind a secretRef (the webhook leaves it to the controller), is PinFailed.
    let missing = tagged.replace(":1.0.0", ":9.9.9-missing");
    create(client, namespace, &app("missing", &missing, Some(CREDENTIALS))).await?;
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    until_any(&events, "a PinFailed Event on App missing", |e: &Event| {
        e.reason.as_deref() == Some("PinFailed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("missing")
    })
    .await?;

    let public = create(client, namespace, &app("public", &tagged, None)).await?;
    ensure!(
        url_of(Some(&public)) == Some(pinned.as_str()),
        "the webhook did not pin the App at admission: {:?}",
        url_of(Some(&public))
    );

    let entries = cluster_store::api(client.clone(), holdfast_namespace);
    let reference = Reference::parse(&tagged)?;
    for scope in [
        Scope::Anonymous,
        Scope::Secret {
            namespace: namespace.into(),
            name: CREDENTIALS.into(),
        },
    ] {
        let name = cluster_store::object_name(&CacheKey::tag(&reference, scope.clone()));
        let expected = digest.clone();
        wait::until(&entries, &name, move |e: Option<&DynamicObject>| {
            e.and_then(|e| e.data.pointer("/spec/digest")) == Some(&json!(expected))
        })
        .await
        .with_context(|| format!("no digest cache entry for {tagged} ({scope})"))?;
    }
    Ok(())
}

pub fn cfapp(name: &str) -> String {
    format!(
        "apiVersion: korifi.cloudfoundry.org/v1alpha1\nkind: CFApp\nmetadata: {{name: {name}, finalizers: [{HOLD}]}}\nspec:\n  displayName: {name}\n  desiredState: STOPPED\n  lifecycle: {{type: buildpack, data: {{buildpacks: [], stack: cflinuxfs3}}}}\n"
    )
}

/// A kpack Image as Korifi makes one: named after its app, no finalizer.
pub fn kpack_image(name: &str) -> String {
    format!(
        "apiVersion: kpack.io/v1alpha2\nkind: Image\nmetadata: {{name: {name}}}\nspec:\n  tag: registry.example/{name}-droplets\n  serviceAccountName: default\n  builder: {{kind: ClusterBuilder, name: holdfast-e2e}}\n  source: {{registry: {{image: registry.example/{name}-source}}}}\n"
    )
}

/// A kpack Image owned (not controlled) by `owner`, as stamp-owners and Korifi make them.
pub fn image_owned_by(name: &str, owner: &DynamicObject) -> Result<String> {
    let types = owner.types.as_ref().context("owner without a kind")?;
    Ok(kpack_image(name).replacen(
        &format!("metadata: {{name: {name}}}"),
        &format!(
            "metadata:\n  name: {name}\n  ownerReferences: [{{apiVersion: {}, kind: {}, name: {}, uid: {}}}]",
            types.api_version,
            types.kind,
            owner.name_any(),
            owner.uid().context("no uid")?
        ),
        1,
    ))
}

/// A kpack Build of `image`, owned by it as kpack makes them, held by the tests' finalizer.
pub fn kpack_build(name: &str, image: &DynamicObject) -> Result<String> {
    Ok(format!(
        "apiVersion: kpack.io/v1alpha2\nkind: Build\nmetadata:\n  name: {name}\n  labels: {{image.kpack.io/image: {image_name}}}\n  finalizers: [{HOLD}]\n  ownerReferences: [{{apiVersion: kpack.io/v1alpha2, kind: Image, name: {image_name}, uid: {uid}, controller: true}}]\nspec:\n  tags: [registry.example/{image_name}-droplets]\n  serviceAccountName: default\n  builder: {{image: registry.example/builder}}\n  source: {{registry: {{image: registry.example/{image_name}-source}}}}\n",
        image_name = image.name_any(),
        uid = image.uid().context("no uid")?,
    ))
}

/// A build pod of `build` as kpack makes one: labelled with the Build's name, the Build its
/// controller.
pub fn build_pod(name: &str, build: &DynamicObject) -> Result<String> {
    Ok(format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{kpack.io/build: {build_name}}}\n  ownerReferences: [{{apiVersion: kpack.io/v1alpha2, kind: Build, name: {build_name}, uid: {uid}, controller: true}}]\nspec: {{restartPolicy: Never, containers: [{{name: build, image: registry.example/kpack/build-init}}]}}\n",
        build_name = build.name_any(),
        uid = build.uid().context("no uid")?,
    ))
}

/// A Korifi object below an app, as Korifi makes one: labelled with the app's GUID, controlled
/// by `owner`, held by the tests' finalizer; `spec` its (minimal, valid) spec.
pub fn korifi_child(
    kind: &str,
    name: &str,
    app_guid: &str,
    owner: &DynamicObject,
    spec: &str,
) -> Result<String> {
    let owner_kind = owner
        .types
        .as_ref()
        .map(|t| t.kind.as_str())
        .context("owner without a kind")?;
    Ok(format!(
        "apiVersion: korifi.cloudfoundry.org/v1alpha1\nkind: {kind}\nmetadata:\n  name: {name}\n  labels: {{korifi.cloudfoundry.org/app-guid: {app_guid}}}\n  finalizers: [{HOLD}]\n  ownerReferences: [{{apiVersion: korifi.cloudfoundry.org/v1alpha1, kind: {owner_kind}, name: {owner_name}, uid: {uid}, controller: true, blockOwnerDeletion: true}}]\nspec: {spec}\n",
        owner_name = owner.name_any(),
        uid = owner.uid().context("no uid")?,
    ))
}

/// The specs [`korifi_child`] gives each kind (what its CRD requires).
pub mod korifi_specs {
    pub fn package(app: &str) -> String {
        format!("{{type: bits, appRef: {{name: {app}}}}}")
    }
    pub fn build(app: &str) -> String {
        format!(
            "{{appRef: {{name: {app}}}, packageRef: {{name: {app}-package}}, stagingMemoryMB: 1, stagingDiskMB: 1, lifecycle: {{type: buildpack, data: {{stack: cflinuxfs3}}}}}}"
        )
    }
    pub fn build_workload(build: &str) -> String {
        format!("{{buildRef: {{name: {build}}}, builderName: kpack-image-builder}}")
    }
    pub fn process(app: &str) -> String {
        format!(
            "{{appRef: {{name: {app}}}, processType: web, memoryMB: 1, diskQuotaMB: 1, healthCheck: {{type: process, data: {{invocationTimeoutSeconds: 1, timeoutSeconds: 1}}}}}}"
        )
    }
    pub fn app_workload(app: &str, name: &str) -> String {
        format!(
            "{{GUID: {name}, appGUID: {app}, image: registry.example/{app}, instances: 1, processType: web, runnerName: statefulset-runner, version: '1'}}"
        )
    }
}

/// A pod anyone could make: labelled `kpack.io/build: <build>`, owned by nothing.
pub fn labelled_pod(name: &str, build: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, labels: {{kpack.io/build: {build}}}}}\nspec: {{restartPolicy: Never, securityContext: {{runAsNonRoot: true, runAsUser: 1000, seccompProfile: {{type: RuntimeDefault}}}}, containers: [{{name: app, image: registry.example/app, securityContext: {{allowPrivilegeEscalation: false, capabilities: {{drop: [ALL]}}}}}}]}}\n"
    )
}

/// The webhook learns of a deletion through its own watch, a moment after the API server: dry
/// runs (admitted by the webhooks, stored nowhere) until it refuses, within `limit`.
pub async fn until_refused(client: &Client, namespace: &str, yaml: &str, limit: Duration) -> Result<String> {
    let object = parse_documents(yaml)?
        .into_iter()
        .next()
        .context("no object in the YAML")?;
    let api = api_for(client, &object, Some(namespace)).await?;
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match api.create(&dry_run, &object).await {
            Err(kube::Error::Api(e)) => return Ok(e.message),
            Err(e) => return Err(e.into()),
            Ok(_) => ensure!(
                tokio::time::Instant::now() < deadline,
                "the terminating guard never refused {}",
                object.name_any()
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Fast deletion (Korifi and kpack), by both components:
/// - a kpack Image owned by the CFApp's BuildWorkload is admitted with an ownerReference to the
///   CFApp (the webhook);
/// - the CFApp starts deleting: the controller deletes its Image at once (nothing else would
///   while the CFApp's finalizer holds it), and the garbage collector then deletes the Image's
///   Build;
/// - the CFApp's tree goes at once too (the controller): its CFPackage, CFBuild and CFProcess,
///   the CFBuild's BuildWorkload and the CFProcess's AppWorkload, but not those labelled for the
///   app whose controller chain names another app;
/// - the Build is terminating: a new build pod for it is refused (the webhook) and its running
///   build pod is deleted (the controller), but not a pod that only carries its label.
pub async fn fast_deletion(client: &Client, namespace: &str) -> Result<()> {
    use korifi_specs as spec;
    let app = create(client, namespace, &cfapp("app")).await?;
    let other = create(client, namespace, &cfapp("other")).await?;
    let child = |kind: &str, name: &str, owner: &DynamicObject, spec: String| {
        korifi_child(kind, name, "app", owner, &spec)
    };
    let package = create(
        client,
        namespace,
        &child("CFPackage", "app-package", &app, spec::package("app"))?,
    )
    .await?;
    let cf_build = create(
        client,
        namespace,
        &child("CFBuild", "app-build", &app, spec::build("app"))?,
    )
    .await?;
    let workload = create(
        client,
        namespace,
        &child(
            "BuildWorkload",
            "app-build",
            &cf_build,
            spec::build_workload("app-build"),
        )?,
    )
    .await?;
    let process = create(
        client,
        namespace,
        &child("CFProcess", "app-web", &app, spec::process("app"))?,
    )
    .await?;
    let app_workload = create(
        client,
        namespace,
        &child(
            "AppWorkload",
            "app-web",
            &process,
            spec::app_workload("app", "app-web"),
        )?,
    )
    .await?;
    // Labelled for the terminating app, controlled by (a CFBuild of) the live one.
    let other_package = create(
        client,
        namespace,
        &child("CFPackage", "other-package", &other, spec::package("other"))?,
    )
    .await?;
    let other_build = create(
        client,
        namespace,
        &child("CFBuild", "other-build", &other, spec::build("other"))?,
    )
    .await?;
    let other_workload = create(
        client,
        namespace,
        &child(
            "BuildWorkload",
            "other-build",
            &other_build,
            spec::build_workload("other-build"),
        )?,
    )
    .await?;
    // Korifi's kpack-image-builder makes the Image owned by the app's BuildWorkload; stamp-owners
    // follows that chain (by uid) to the CFApp.
    let image = create(client, namespace, &image_owned_by("app", &workload)?).await?;
    let owners = image.owner_references();
    ensure!(
        owners
            .iter()
            .any(|o| o.kind == "CFApp" && Some(&o.uid) == app.uid().as_ref()),
        "the Image was admitted without an ownerReference to its CFApp: {owners:?}"
    );
    let build = create(client, namespace, &kpack_build("app-build-1", &image)?).await?;
    let pod = create(client, namespace, &build_pod("app-build-1-e2e-pod", &build)?).await?;
    let decoy = create(client, namespace, &labelled_pod("decoy", "app-build-1")).await?;

    let apps = api_for(client, &app, Some(namespace)).await?;
    apps.delete("app", &DeleteParams::default()).await?;
    let images = api_for(client, &image, Some(namespace)).await?;
    wait::deleted(&images, "app", &image.uid().context("no uid")?)
        .await
        .context("the controller did not delete the Image of the CFApp being deleted")?;

    for leaf in [&package, &cf_build, &process, &workload, &app_workload] {
        let api = api_for(client, leaf, Some(namespace)).await?;
        wait::until(&api, &leaf.name_any(), |o: Option<&DynamicObject>| {
            o.is_some_and(|o| o.metadata.deletion_timestamp.is_some())
        })
        .await
        .with_context(|| {
            format!(
                "the controller did not delete the {} of the CFApp being deleted",
                leaf.types.as_ref().map(|t| t.kind.as_str()).unwrap_or("leaf")
            )
        })?;
    }
    for spared in [&other_package, &other_build, &other_workload] {
        let api = api_for(client, spared, Some(namespace)).await?;
        ensure!(
            api.get_opt(&spared.name_any())
                .await?
                .is_some_and(|o| o.metadata.deletion_timestamp.is_none()),
            "the controller deleted {}, labelled for the terminating app but controlled by another",
            spared.name_any()
        );
    }

    let builds = api_for(client, &build, Some(namespace)).await?;
    wait::until(&builds, "app-build-1", |b: Option<&DynamicObject>| {
        b.is_some_and(|b| b.metadata.deletion_timestamp.is_some())
    })
    .await
    .context("the garbage collector did not delete the Build of the deleted Image")?;
    let message = until_refused(
        client,
        namespace,
        &build_pod("app-build-1-e2e-pod-2", &build)?,
        Duration::from_secs(10),
    )
    .await?;
    ensure!(
        message.contains("build pod"),
        "refused for another reason: {message}"
    );
    let pods = api_for(client, &pod, Some(namespace)).await?;
    wait::deleted(&pods, &pod.name_any(), &pod.uid().context("no uid")?)
        .await
        .context("the controller did not delete the build pod of the terminating Build")?;
    let decoys = api_for(client, &decoy, Some(namespace)).await?;
    ensure!(
        decoys
            .get_opt("decoy")
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        "the controller deleted a pod that the terminating Build does not own (only its label)"
    );

    for object in [
        &app,
        &build,
        &other,
        &package,
        &cf_build,
        &workload,
        &process,
        &app_workload,
        &other_package,
        &other_build,
        &other_workload,
    ] {
        release(client, namespace, object).await?;
    }
    Ok(())
}

pub fn cfspace(name: &str) -> String {
    format!(
        "apiVersion: korifi.cloudfoundry.org/v1alpha1\nkind: CFSpace\nmetadata: {{name: {name}, finalizers: [{HOLD}]}}\nspec: {{displayName: {name}}}\n"
    )
}

/// The namespace controller's first pass over a namespace being deleted comes 5 s after the
/// deletion (`namespaceDeletionGracePeriod`): a CFSpace deleted sooner was deleted by holdfast.
const BEFORE_NAMESPACE_CONTROLLER: Duration = Duration::from_secs(4);

/// An org namespace `org` starts deleting: with `--delete-org-spaces` (`opted_in`) the
/// controller deletes the CFSpace in it before the namespace controller's first pass could (5 s
/// after); without it, holdfast leaves the space to the namespace controller.
pub async fn org_namespace_deletion(client: &Client, org: &str, opted_in: bool) -> Result<()> {
    let namespaces = Api::<Namespace>::all(client.clone());
    let mut namespace = Namespace::default();
    namespace.metadata.name = Some(org.to_string());
    namespaces.create(&PostParams::default(), &namespace).await?;
    let space = create(client, org, &cfspace("space")).await?;
    namespaces.delete(org, &DeleteParams::default()).await?;
    let spaces = api_for(client, &space, Some(org)).await?;
    let deleted = tokio::time::timeout(
        BEFORE_NAMESPACE_CONTROLLER,
        wait::until(&spaces, "space", |s: Option<&DynamicObject>| {
            s.is_some_and(|s| s.metadata.deletion_timestamp.is_some())
        }),
    )
    .await;
    release(client, org, &space).await?;
    match (opted_in, deleted) {
        (true, deleted) => deleted
            .context("the controller did not delete the CFSpace of the namespace being deleted")?
            .map(drop),
        (false, Err(_)) => Ok(()),
        (false, Ok(_)) => anyhow::bail!(
            "a CFSpace was deleted before the namespace controller's first pass without --delete-org-spaces"
        ),
    }
}
