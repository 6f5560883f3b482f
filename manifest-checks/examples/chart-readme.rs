//! Prints charts/holdfast/README.md as generated from values.yaml and README.md.gotmpl:
//!   cargo run -q -p holdfast-manifest-checks --example chart-readme > charts/holdfast/README.md

fn main() -> anyhow::Result<()> {
    print!("{}", holdfast_manifest_checks::chart_docs::readme()?);
    Ok(())
}
