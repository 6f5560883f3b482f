//! The real local-path-provisioner (`e2e/peers/local-path-provisioner`, the dynamic volume
//! provisioner kind ships) as a process: kpack gives every Image a build-cache
//! PersistentVolumeClaim (Korifi always asks for one, and kpack's webhook refuses it without a
//! default StorageClass), and a pod whose claim is unbound is never scheduled.
//!
//! Its upstream `deploy/local-path-storage.yaml` is applied without the Deployment (the process
//! runs as the admin user instead, so its RBAC objects are not needed either); the StorageClass
//! `local-path` (`WaitForFirstConsumer`) is annotated as the default class, as kind's is. On a
//! PVC the scheduler has picked a node for, it runs its helper pod on that node (kwok completes
//! it: nothing is created on disk) and creates a `hostPath` PersistentVolume with node affinity;
//! kube-controller-manager binds it. When the claim goes (reclaim policy Delete), the
//! provisioner runs its teardown helper pod, then deletes the volume.
//!
//! Harmless here: "failed to save helper-pod-… logs: unable to retrieve in cluster config" (it
//! reads its helper pods' logs with an in-cluster client; kwok's pods have no logs anyway).

use std::path::Path;

use anyhow::{Context, Result};

use crate::{access::Access, peers::manifests, process::ServerProcess, tools::peer_bin};

pub const NAMESPACE: &str = "local-path-storage";
pub const STORAGE_CLASS: &str = "local-path";
const MANIFEST: &str = "deploy/local-path-storage.yaml";

/// A running provisioner; stopped when dropped.
#[derive(Debug)]
pub struct LocalPathProvisioner {
    process: ServerProcess,
}

impl LocalPathProvisioner {
    pub(crate) fn start(env: &Access, dir: &Path) -> Result<Self> {
        let docs = manifests::documents("local-path-provisioner", MANIFEST, &[])?;
        let mut docs = manifests::of_kinds(
            docs,
            &["Namespace", "ServiceAccount", "StorageClass", "ConfigMap"],
        );
        let mut config = None;
        for doc in &mut docs {
            match doc["kind"].as_str() {
                Some("StorageClass") => {
                    doc["metadata"]["annotations"] =
                        serde_json::json!({"storageclass.kubernetes.io/is-default-class": "true"});
                }
                Some("ConfigMap") => config = doc["data"]["config.json"].as_str().map(String::from),
                _ => {}
            }
        }
        let config = config.with_context(|| format!("{MANIFEST}: no config.json in its ConfigMap"))?;
        manifests::apply(env, &docs)?;
        std::fs::create_dir_all(dir)?;
        let config_file = dir.join("config.json");
        std::fs::write(&config_file, config)?;
        let process = ServerProcess::spawn(
            "local-path-provisioner",
            &peer_bin("local-path-provisioner", "local-path-provisioner")?,
            &[
                "--debug".into(),
                "start".into(),
                format!("--config={}", config_file.display()),
                format!("--kubeconfig={}", env.kubeconfig().display()),
                "--service-account-name=local-path-provisioner-service-account".into(),
            ],
            &[("POD_NAMESPACE", Path::new(NAMESPACE))],
            dir.join("local-path-provisioner.log"),
        )?;
        Ok(Self { process })
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    pub fn check_running(&mut self) -> Result<()> {
        self.process.check_running()
    }

    pub fn stop(&mut self) {
        self.process.stop(std::time::Duration::from_secs(5));
    }
}
