//! OCI references as vendir/imgpkg write them: parse, and everything holdfast derives from one.
#![no_main]

use holdfast_registry::Reference;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(reference) = Reference::parse(text) else {
        return;
    };
    let normalized = reference.normalized();
    // The normalised form is a reference too, and normalises to itself.
    let again = Reference::parse(&normalized).expect("a normalised reference parses");
    assert_eq!(again.normalized(), normalized);
    let _ = (
        reference.registry(),
        reference.repository(),
        reference.name(),
        reference.tag(),
    );
    if let Ok(tagged) = reference.with_tag("1.0.0") {
        let _ = tagged.normalized();
    }
});
