//! Syntax shared by the clouds' identifiers.

/// Whether `text` is a UUID (Azure: GUID) in its 8-4-4-4-12 hexadecimal form, either case.
pub fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_five_groups_of_hex_digits() {
        for uuid in [
            "2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a",
            "ABCDEF01-2345-6789-abcd-ef0123456789",
        ] {
            assert!(is_uuid(uuid), "{uuid}");
        }
        for not_uuid in [
            "00000000-1111-2222-3333-44444444444",
            "0000000g-1111-2222-3333-444444444444",
            "00000000-1111-2222-3333-444444444444-5",
            "",
        ] {
            assert!(!is_uuid(not_uuid), "{not_uuid}");
        }
    }
}
