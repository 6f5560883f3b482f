//! `KIND/NAME` on the command line.

use anyhow::{Result, bail};
use holdfast_pins::PinnedKind;

/// A pinned kind and an object's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub kind: PinnedKind,
    pub name: String,
}

/// `app/NAME`, `packagerepository/NAME` (`pkgr`), `package/NAME` (`pkg`), as kubectl spells
/// them (singular, plural, short name, or `kind.group`); `None` for what reads as an image
/// reference instead (a tag or digest, or more than one `/`).
pub fn parse(text: &str) -> Result<Option<Target>> {
    if text.contains([':', '@']) || text.matches('/').count() > 1 {
        return Ok(None);
    }
    let Some((kind, name)) = text.split_once('/') else {
        bail!("{text:?}: give KIND/NAME (e.g. app/my-app) or an image reference with its tag");
    };
    let kind = kind.to_ascii_lowercase();
    let kind = kind.split('.').next().unwrap_or_default();
    let kind = match kind {
        "app" | "apps" => PinnedKind::App,
        "packagerepository" | "packagerepositories" | "pkgr" => PinnedKind::PackageRepository,
        "package" | "packages" | "pkg" => PinnedKind::Package,
        other => {
            bail!("{other:?} is not a kind holdfast pins: app, packagerepository (pkgr) or package (pkg)")
        }
    };
    if name.is_empty() || name.contains('/') {
        bail!("{text:?}: give KIND/NAME, e.g. app/my-app");
    }
    Ok(Some(Target {
        kind,
        name: name.to_owned(),
    }))
}

/// `app/NAME` for people.
pub fn display(kind: PinnedKind, name: &str) -> String {
    format!("{}/{name}", kind.kind().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_read_as_kubectl_spells_them() {
        for (text, kind) in [
            ("app/a", PinnedKind::App),
            ("apps.kappctrl.k14s.io/a", PinnedKind::App),
            ("pkgr/a", PinnedKind::PackageRepository),
            ("PackageRepository/a", PinnedKind::PackageRepository),
            ("pkg/a", PinnedKind::Package),
        ] {
            assert_eq!(parse(text).unwrap().unwrap().kind, kind, "{text}");
        }
        for reference in ["registry.io/team/app:1.0", "localhost:5000/app", "reg.io/a/b/c"] {
            assert_eq!(parse(reference).unwrap(), None, "{reference}");
        }
    }

    #[test]
    fn other_kinds_and_bad_names_are_errors() {
        assert!(parse("deployment/a").is_err());
        assert!(parse("app/").is_err());
        assert!(parse("my-app").is_err());
    }
}
