//! Identifiers are UUIDv7: time-ordered, so lists sort by creation without an extra index.

/// A new time-ordered identifier, as lowercase hyphenated text.
pub fn new_id() -> String {
    // Encoded into a buffer rather than through `Display`: ids are made for every event and
    // audit record.
    let mut buffer = uuid::Uuid::encode_buffer();
    uuid::Uuid::now_v7()
        .hyphenated()
        .encode_lower(&mut buffer)
        .to_owned()
}

/// A new time-ordered identifier as `prefix` and 32 upper-case hex digits (a simulated DNS
/// change's id, `C…`, in Route 53's style), written into one buffer: one is made per change.
pub fn new_upper_hex_id(prefix: char) -> String {
    let mut buffer = uuid::Uuid::encode_buffer();
    let digits = uuid::Uuid::now_v7().simple().encode_upper(&mut buffer);
    let mut id = String::with_capacity(prefix.len_utf8() + digits.len());
    id.push(prefix);
    id.push_str(digits);
    id
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_unique_and_sort_by_creation() {
        let a = super::new_id();
        let b = super::new_id();
        assert_ne!(a, b);
        assert!(a < b, "{a} should sort before {b}");
        assert_eq!(
            uuid::Uuid::parse_str(&a).map(|u| u.get_version_num()),
            Ok(7)
        );
        assert_eq!(a, a.to_lowercase());
    }

    #[test]
    fn upper_hex_ids_are_the_prefix_and_a_uuidv7s_digits() {
        let a = super::new_upper_hex_id('C');
        let b = super::new_upper_hex_id('C');
        assert_eq!(a.len(), 33);
        assert!(a.starts_with('C'));
        assert!(
            a[1..]
                .chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
        );
        let digits = uuid::Uuid::parse_str(&a[1..]).map(|u| u.get_version_num());
        assert_eq!(digits, Ok(7));
        assert!(a < b, "{a} should sort before {b}");
    }
}
