//! The data a benchmark writes beside its last line: one CSV per table, in
//! `docs/benchmarks/data/` (or `$BENCH_DATA_DIR`), which `scripts/plot-benchmarks.py` draws into
//! the plots BENCHMARKS.md shows. A bench writes its files only when it finished, so a failed run
//! leaves the committed data as it was.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

/// Where the CSV files go: `$BENCH_DATA_DIR`, else `docs/benchmarks/data` in the repository.
pub fn dir() -> PathBuf {
    std::env::var_os("BENCH_DATA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::dist::repo().join("docs/benchmarks/data"))
}

/// Writes `rows` to `<dir>/<name>.csv` (a header from the row type's field names) and says where
/// on standard error, so the bench's last line stays its last line.
pub fn write<R: Serialize>(name: &str, rows: &[R]) -> Result<PathBuf> {
    write_in(&dir(), name, rows)
}

fn write_in<R: Serialize>(dir: &Path, name: &str, rows: &[R]) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{name}.csv"));
    let mut writer = csv::Writer::from_path(&path).with_context(|| format!("creating {}", path.display()))?;
    for row in rows {
        writer
            .serialize(row)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    writer
        .flush()
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench data: {} ({} rows)", path.display(), rows.len());
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Row {
        arm: &'static str,
        t_s: f64,
    }

    #[test]
    fn rows_are_written_under_a_header_of_their_field_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_in(
            dir.path(),
            "sample",
            &[
                Row {
                    arm: "with",
                    t_s: 1.5,
                },
                Row {
                    arm: "without",
                    t_s: 2.0,
                },
            ],
        )
        .unwrap();
        assert_eq!(path, dir.path().join("sample.csv"));
        assert_eq!(
            std::fs::read_to_string(path).unwrap(),
            "arm,t_s\nwith,1.5\nwithout,2.0\n"
        );
    }
}
