//! kapp-controller's upstream CRDs, as `make deps` collects them from the peer's Go module: the
//! fence must hold every field of their fetch entries, so a field a new kapp-controller adds fails
//! a test instead of passing the fence unchecked.

use std::collections::BTreeSet;

use anyhow::Result;

use crate::load::read;

/// The properties of the fetch entries of kapp-controller's upstream CRDs (the peer's module,
/// collected by `make deps`), per resource: the entry's fields and each source's.
pub fn upstream_fetch_schema() -> Result<Option<Vec<(String, serde_json::Value)>>> {
    let Some(dir) = crate::load::peer_dir("kapp-controller") else {
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

/// The property names of a JSON schema object.
pub fn property_names(schema: &serde_json::Value) -> BTreeSet<String> {
    schema["properties"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}
