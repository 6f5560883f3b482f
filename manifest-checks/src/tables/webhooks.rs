//! SECURITY.md's webhook table (name, configuration, path, failure policy) and the webhooks of
//! the manifests, as rows of the same shape.

use std::collections::BTreeSet;

use anyhow::{Result, ensure};
use serde_yaml::Value;

use super::{plain, table};
use crate::yaml::{is_mutating, text, webhooks};

/// `(webhook, Mutating|Validating, path, failurePolicy)`.
pub type WebhookRow = (String, String, String, String);

/// The rows of SECURITY.md's webhook table.
pub fn webhooks_from_doc(markdown: &str) -> Result<BTreeSet<WebhookRow>> {
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

/// A row per webhook of the manifests.
pub fn webhooks_from_manifests(objects: &[Value]) -> BTreeSet<WebhookRow> {
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
