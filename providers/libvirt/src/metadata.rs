//! What libvirt's XML says: the tags metadata element of a domain and its file-backed disks.

use std::collections::BTreeMap;

/// XML namespace of the tags metadata element.
pub const TAGS_NAMESPACE: &str = "urn:peerpods:tags:v1";

/// Tags from the metadata element libvirt returns for [`TAGS_NAMESPACE`]. libvirt hands it
/// back without the namespace (`<tags><tag key="k">v</tag></tags>`): the lookup by namespace
/// already picked our element. Entries without a key are skipped.
pub fn parse_tags(xml: &str) -> BTreeMap<String, String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return BTreeMap::new();
    };
    doc.descendants()
        .filter(|n| n.tag_name().name() == "tag")
        .filter_map(|n| {
            let key = n.attribute("key")?;
            Some((key.to_owned(), n.text().unwrap_or_default().to_owned()))
        })
        .collect()
}

/// Source paths of the file-backed disks in a domain XML.
pub(crate) fn file_disks(xml: &str) -> Vec<String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Vec::new();
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("disk") && n.attribute("type") == Some("file"))
        .filter_map(|disk| {
            disk.children()
                .find(|n| n.has_tag_name("source"))
                .and_then(|s| s.attribute("file"))
                .map(str::to_owned)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_file_disks_only() {
        let xml = r#"<domain><devices>
            <disk type='file' device='disk'><source file='/pool/a.qcow2'/></disk>
            <disk type='file' device='cdrom'><source file='/pool/ci.iso'/></disk>
            <disk type='block' device='disk'><source dev='/dev/sdb'/></disk>
        </devices></domain>"#;
        assert_eq!(file_disks(xml), vec!["/pool/a.qcow2", "/pool/ci.iso"]);
    }

    #[test]
    fn parses_tags_as_libvirt_returns_them() {
        let xml =
            "<tags>\n  <tag key=\"cluster\">c1</tag><tag key=\"empty\"/><tag>no key</tag>\n</tags>";
        let tags = parse_tags(xml);
        assert_eq!(tags.len(), 2);
        assert_eq!(tags["cluster"], "c1");
        assert_eq!(tags["empty"], "");
        assert!(parse_tags("not xml").is_empty());
    }
}
