//! Text shown or kept cut to a size: page-made and program-made strings
//! must not grow a record without bound.

/// `text` cut to at most `max` bytes on a character boundary, with `…`
/// after it when it was cut.
pub fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cut_falls_on_a_character_boundary_and_says_so() {
        assert_eq!(super::clip("short", 10), "short");
        assert_eq!(super::clip("héllo", 2), "h…");
        assert_eq!(super::clip("hello", 3), "hel…");
    }
}
