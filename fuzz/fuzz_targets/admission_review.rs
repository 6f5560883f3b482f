//! AdmissionReview bodies, decoded as the webhook decodes them and, when they decode, routed to
//! every rule (mutating and validating) and answered. The registry answers every tag at once
//! and the cluster view derives its answers from the names asked, so each rule's paths are
//! reachable without a cluster.
#![no_main]

use std::{collections::BTreeMap, sync::Arc, sync::OnceLock};

use bytes::Bytes;
use futures::{FutureExt, future::BoxFuture};
use holdfast_cache::{CacheConfig, DigestCache, testing::FakeSource};
use holdfast_webhook::{
    cluster::{ClusterView, Peer, Presence},
    review,
    rules::{Family, Rule, RuleContext, policy::Policy},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use libfuzzer_sys::fuzz_target;

/// Answers from the names asked: even-length names are being deleted, names with a digit are
/// gone, the rest live.
struct DerivedCluster;

fn state(name: &str) -> Presence {
    if name.chars().any(|c| c.is_ascii_digit()) {
        Presence::Gone
    } else if name.len() % 2 == 0 {
        Presence::Terminating
    } else {
        Presence::Live
    }
}

impl ClusterView for DerivedCluster {
    fn namespace_labels(&self, namespace: &str) -> BTreeMap<String, String> {
        BTreeMap::from([(
            "holdfast.dev/require-digests".to_owned(),
            (namespace.len() % 2 == 0).to_string(),
        )])
    }

    /// Namespaces of odd-length names are not known yet; the others were created at the epoch.
    fn namespace_created(&self, namespace: &str) -> Option<std::time::SystemTime> {
        (namespace.len() % 2 == 0).then_some(std::time::UNIX_EPOCH)
    }

    fn serves(&self, _: Peer) -> bool {
        true
    }

    fn terminating(&self, _: Peer, _: &str, name: &str) -> Option<bool> {
        match state(name) {
            Presence::Gone | Presence::Unknown => None,
            presence => Some(presence == Presence::Terminating),
        }
    }

    /// Every object has the uid `uid-NAME`; a BuildWorkload is labelled with the app of the name
    /// before its first `-`, so the chains of stamp-owners and the guard are walked.
    fn metadata(&self, peer: Peer, _: &str, name: &str) -> Option<ObjectMeta> {
        (state(name) != Presence::Gone).then(|| ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            labels: (peer == Peer::BuildWorkload).then(|| {
                BTreeMap::from([(
                    "korifi.cloudfoundry.org/app-guid".to_owned(),
                    name.split('-').next().unwrap_or_default().to_owned(),
                )])
            }),
            ..Default::default()
        })
    }

    fn presence_now<'a>(
        &'a self,
        _: Peer,
        _: &'a str,
        name: &'a str,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Presence> {
        futures::future::ready(state(name)).boxed()
    }
}

fn context() -> &'static RuleContext {
    static CONTEXT: OnceLock<RuleContext> = OnceLock::new();
    CONTEXT.get_or_init(|| {
        // No entry is kept: every input starts from the same empty cache.
        let config = CacheConfig {
            max_entries: 0,
            ..CacheConfig::default()
        };
        // Every tag resolves to the digest of its name; every repository lists a few semver tags.
        let registry = FakeSource::deriving();
        registry.set_tags(["1.0.0", "1.2.3", "2.0.0-rc.1", "latest"]);
        let cache = DigestCache::new(Arc::new(registry), config, None);
        let policy =
            Policy::from_yaml("allowedRegistries: [registry.corp.com, ghcr.io/corp]\nmode: enforce\n")
                .expect("the fuzz policy parses");
        RuleContext::new(Arc::new(DerivedCluster), Arc::new(cache), policy, None)
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    let body = Bytes::copy_from_slice(data);
    let Ok(request) = review::decode(&body) else {
        return;
    };
    for family in [Family::Mutating, Family::Validating] {
        let Some(rule) = Rule::route(family, &request) else {
            continue;
        };
        let verdict = runtime().block_on(rule.evaluate(&request, context()));
        review::encode(&request, verdict).expect("a verdict encodes");
    }
});
