//! Text cut to a byte bound, for what holdfast records or reports (a cache entry's error, an
//! Event's note): whole characters only, marked when cut.

/// `text` cut to at most `max` bytes at a character boundary, marked with `…` when cut.
pub fn truncated(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return text.into();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end]).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncated("short", 10), "short");
        let cut = truncated("ééééé", 6);
        assert!(cut.len() <= 6 && cut.ends_with('…'), "{cut:?}");
        assert_eq!(truncated(&"a".repeat(600), 512).len(), 512);
    }
}
