//! The chart's README (`charts/holdfast/README.md`), generated from `values.yaml`: each key's
//! `# --` comment (helm-docs' form, so helm-docs reads the same file) is its description, its
//! type and default are read from the parsed values. `README.md.gotmpl` is the text around the
//! table (`{{ template "chart.valuesTable" . }}` marks where it goes). A test holds the committed
//! README to the generated one, every key of `values.yaml` to a description, and every key to
//! `values.schema.json` (the same key, the same default).

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;

use crate::{chart::chart, load::read};

/// The command that prints [`readme`] into the file it belongs in (run from the workspace).
pub const REGENERATE: &str =
    "cargo run -q -p holdfast-manifest-checks --example chart-readme > charts/holdfast/README.md";

/// Where the values table goes in `README.md.gotmpl`.
const TABLE: &str = "{{ template \"chart.valuesTable\" . }}";

/// One documented key of values.yaml.
#[derive(Debug, Clone)]
pub struct Row {
    /// Dotted path (`webhook.podDisruptionBudget.enabled`).
    pub key: String,
    pub description: String,
    /// The default, as values.yaml sets it.
    pub default: Value,
}

/// The documented keys of a values.yaml text, in file order. A key with a `# --` comment (and
/// the `# ` lines after it) is a row, and what it holds is its default (its own keys get no
/// rows); a key without one must be a map whose keys are documented. Fails on an undocumented
/// leaf.
pub fn rows(text: &str) -> Result<Vec<Row>> {
    let values: Value = serde_yaml::from_str(text).context("parsing values.yaml")?;
    let mut rows = Vec::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut pending: Option<Vec<String>> = None;
    // A documented key's indentation: deeper lines belong to its default.
    let mut documented: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim();
        if let Some(d) = documented {
            if trimmed.is_empty() || indent > d || trimmed.starts_with('-') && indent == d {
                continue;
            }
            documented = None;
        }
        if trimmed.is_empty() {
            pending = None;
            continue;
        }
        if let Some(description) = trimmed.strip_prefix("# --") {
            pending = Some(vec![description.trim().to_string()]);
            continue;
        }
        if let Some(more) = trimmed.strip_prefix('#') {
            if let Some(p) = pending.as_mut() {
                p.push(more.trim().to_string());
            }
            continue;
        }
        let Some((key, rest)) = trimmed.split_once(':') else {
            bail!("values.yaml line {}: not a key: {line}", n + 1);
        };
        ensure!(
            !key.starts_with('-') && !key.contains(' '),
            "values.yaml line {}: a list item outside a documented key: {line}",
            n + 1
        );
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        stack.push((indent, key.to_string()));
        let path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        let dotted = path.join(".");
        match pending.take() {
            Some(description) => {
                let default = path
                    .iter()
                    .try_fold(&values, |v, k| v.get(*k))
                    .with_context(|| format!("values.yaml: {dotted} not found in the parsed values"))?;
                rows.push(Row {
                    key: dotted,
                    description: description.join(" ").trim().to_string(),
                    default: default.clone(),
                });
                documented = Some(indent);
            }
            None if rest.trim().is_empty() => {}
            None => bail!("values.yaml line {}: {dotted} has no `# --` description", n + 1),
        }
    }
    Ok(rows)
}

/// helm-docs' type names.
fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "string",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_i64() || n.is_u64() => "int",
        Value::Number(_) => "float",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// The values table (Markdown).
pub fn table(rows: &[Row]) -> Result<String> {
    let mut out =
        String::from("| Key | Type | Default | Description |\n|-----|------|---------|-------------|\n");
    for row in rows {
        let default = serde_json::to_string(&row.default)?;
        out.push_str(&format!(
            "| {} | {} | `{}` | {} |\n",
            row.key,
            type_name(&row.default),
            default.replace('|', "\\|"),
            row.description.replace('|', "\\|")
        ));
    }
    Ok(out)
}

/// The README as it must be committed.
pub fn readme() -> Result<String> {
    let dir = chart();
    let template = read(&dir.join("README.md.gotmpl"))?;
    ensure!(template.contains(TABLE), "README.md.gotmpl has no {TABLE}");
    let rows = rows(&read(&dir.join("values.yaml"))?)?;
    Ok(template.replace(TABLE, table(&rows)?.trim_end()))
}

/// What in `values.schema.json` does not match the documented keys: a key the schema does not
/// describe, a default that differs, and a schema property no row covers.
pub fn schema_differences(rows: &[Row], schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let property = |key: &str| {
        key.split('.')
            .try_fold(schema, |s, k| s.get("properties").and_then(|p| p.get(k)))
    };
    for row in rows {
        match property(&row.key) {
            None => out.push(format!("{}: not in values.schema.json", row.key)),
            Some(p) => {
                if let Some(default) = p.get("default").filter(|d| *d != &row.default) {
                    out.push(format!(
                        "{}: values.schema.json's default is {default}, values.yaml's {}",
                        row.key, row.default
                    ));
                }
            }
        }
    }
    fn walk(schema: &Value, prefix: &str, rows: &[Row], out: &mut Vec<String>) {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
            return;
        };
        for (key, property) in properties {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            if rows.iter().any(|r| r.key == path) {
                continue;
            }
            if property.get("properties").is_some() {
                walk(property, &path, rows, out);
            } else {
                out.push(format!(
                    "{path}: in values.schema.json but not documented in values.yaml"
                ));
            }
        }
    }
    walk(schema, "", rows, &mut out);
    out
}
