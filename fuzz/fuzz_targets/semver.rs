//! vendir's `tagSelection.semver`: constraints, versions (tags) and the selection over them.
//! Input: constraints on the first line, one tag per following line.
#![no_main]

use holdfast_registry::{
    VersionSelection, select_tag,
    semver_select::{range::Range, version::Version},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.lines();
    let constraints = lines.next().unwrap_or_default();
    let tags: Vec<&str> = lines.collect();
    let range = Range::parse(constraints);
    for tag in &tags {
        for version in [Version::parse(tag), Version::parse_relaxed(tag)]
            .into_iter()
            .flatten()
        {
            let _ = version.to_string();
            if let Ok(range) = &range {
                range.matches(&version);
            }
        }
    }
    let selection =
        serde_json::json!({"semver": {"constraints": constraints, "prereleases": {"identifiers": ["rc"]}}});
    if let Ok(selection) = serde_json::from_value::<VersionSelection>(selection)
        && let Ok(tag) = select_tag(&tags, &selection)
    {
        assert!(tags.contains(&tag), "selected a tag that was not offered");
    }
});
