//! Registry requests go through the proxy the environment names (`HTTP_PROXY`; `HTTPS_PROXY`
//! alike, tunnelled), except to the hosts of `NO_PROXY`. The resolver runs in a child process
//! (this test binary again, its ignored test) whose environment names the proxy: the process's
//! own environment is not changed (no `unsafe`).

#![allow(clippy::unwrap_used)] // test helpers

mod support;

use std::process::Command;

use holdfast_registry::{Credentials, Reference};
use support::{FakeRegistry, expected_digest, resolver_for};

/// The host no DNS knows that the child asks for through the proxy.
const FAR: &str = "registry.corp.example";
const DIRECT: &str = "HOLDFAST_PROXY_TEST_DIRECT";

#[tokio::test]
async fn registry_requests_go_through_the_environments_proxy_except_to_no_proxy_hosts() {
    // The fake answers as a registry whatever host a request is for, so as the proxy it
    // serves a registry that does not exist.
    let proxy = FakeRegistry::start().await;
    let direct = FakeRegistry::start().await;
    let child = tokio::task::spawn_blocking({
        let (proxy, direct) = (proxy.host(), direct.host());
        move || {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "resolves_through_the_environment",
                    "--ignored",
                    "--nocapture",
                ])
                .env("HTTP_PROXY", format!("http://{proxy}"))
                // Hosts, domains or CIDRs: a port in an entry matches nothing.
                .env("NO_PROXY", "127.0.0.1")
                .env(DIRECT, &direct)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&child.stdout);
    assert!(
        child.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&child.stderr)
    );
    assert!(out.contains("1 passed"), "{out}");

    let proxied = proxy.requests();
    assert!(!proxied.is_empty(), "nothing went through the proxy");
    assert!(
        proxied.iter().all(|r| r.host.as_deref() == Some(FAR)),
        "the proxy saw requests for {:?}",
        proxied.iter().map(|r| &r.host).collect::<Vec<_>>()
    );
    assert!(
        !direct.requests().is_empty(),
        "the NO_PROXY host was not reached directly"
    );
}

/// The child: resolves a tag of [`FAR`] (through the proxy) and one of the `NO_PROXY` host.
#[tokio::test]
#[ignore = "run by the test above, with a proxy in its environment"]
async fn resolves_through_the_environment() {
    let direct = std::env::var(DIRECT).unwrap();
    let stand_in = FakeRegistry::start().await;
    let resolver = resolver_for(&stand_in, |c| {
        c.insecure_registries = [FAR.to_owned(), direct.clone()].into();
    });
    let anonymous = Credentials::anonymous();
    for registry in [FAR, direct.as_str()] {
        let reference = Reference::parse(&format!("{registry}/plain/app:v1")).unwrap();
        assert_eq!(
            resolver.resolve_digest(&reference, &anonymous).await.unwrap(),
            expected_digest("plain/app")
        );
    }
    assert!(stand_in.requests().is_empty());
}
