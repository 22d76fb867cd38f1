//! Identifiers are UUIDv7: time-ordered, so lists sort by creation without an extra index.

/// A new time-ordered identifier, as lowercase hyphenated text.
pub fn new_id() -> String {
    uuid::Uuid::now_v7().to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_unique_and_sort_by_creation() {
        let a = super::new_id();
        let b = super::new_id();
        assert_ne!(a, b);
        assert!(a < b, "{a} should sort before {b}");
    }
}
