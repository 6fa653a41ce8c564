//! `kubectl peerpods`: one view of peer pods cleanup, from what peerpod-ctrl records in the cluster (PeerPod
//! status and conditions, Events, Node capacity), and the one write an operator needs: `release`.
//!
//! - [`gather`]: reads the cluster into facts (read-only).
//! - [`facts`]: the facts as plain values, and where each PeerPod belongs (live, stuck, ...).
//! - [`render`]: facts to text, a pure function of the facts and a given `now`.
//! - [`release`]: whether and how to set the `peerpods.io/release` annotation (pure), and the patch that sets it.

mod error;
pub mod facts;
pub mod gather;
pub mod release;
pub mod render;

pub use error::Error;

/// Splits `<namespace>/<name>`.
pub fn parse_reference(text: &str) -> Result<(&str, &str), Error> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => Err(Error::BadReference(text.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_is_namespace_slash_name() {
        assert_eq!(parse_reference("ns/pp").unwrap(), ("ns", "pp"));
        assert!(parse_reference("pp").is_err());
        assert!(parse_reference("/pp").is_err());
        assert!(parse_reference("ns/").is_err());
        assert!(parse_reference("a/b/c").is_err());
    }
}
