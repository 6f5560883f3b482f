//! imgpkg bundle layers (tar, often gzip) and the ImagesLock in them. The first byte splits the
//! layer into chunks as the network would deliver it.
#![no_main]

use holdfast_registry::mirror::{LockScanner, is_bundle_config, parse_images_lock};
use libfuzzer_sys::fuzz_target;

/// The largest ImagesLock the mirror accepts, small here so the limit path is reached.
const LIMIT: u64 = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&chunk, layer)) = data.split_first() else {
        return;
    };
    let _ = parse_images_lock(layer);
    let _ = is_bundle_config(layer);
    let mut scanner = LockScanner::new(LIMIT);
    for piece in layer.chunks(usize::from(chunk).max(1)) {
        scanner.feed(piece);
    }
    if let Ok(Some(lock)) = scanner.finish() {
        assert!(
            lock.len() as u64 <= LIMIT,
            "an ImagesLock over the limit was returned"
        );
        let _ = parse_images_lock(&lock);
    }
});
