//! SECURITY.md's tables, parsed so that they can be compared with the manifests row for row: a
//! manifest that drifts from its table fails, and so does a row of the document nothing backs.

pub mod rbac;
pub mod settings;
pub mod webhooks;

use std::collections::BTreeSet;

use anyhow::{Context, Result};

use crate::load::{read, repo};

/// SECURITY.md's text.
pub fn security_md() -> Result<String> {
    read(&repo().join("SECURITY.md"))
}

/// The rows of the Markdown table whose header line starts with `header`, as trimmed cells.
pub(crate) fn table(markdown: &str, header: &str) -> Result<Vec<Vec<String>>> {
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

/// A cell without its backquotes.
pub(crate) fn plain(cell: &str) -> String {
    cell.replace('`', "").trim().to_owned()
}

/// A cell's comma-separated list (`—` for none).
pub(crate) fn cell_list(cell: &str) -> BTreeSet<String> {
    plain(cell)
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && s != "—")
        .collect()
}
