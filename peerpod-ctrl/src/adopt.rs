//! Adoption before reaping: which VMs and PeerPods cloud-api-adaptor's (CAA) names tie to a Pod.
//!
//! CAA names every pod VM `podvm-<pod>-<sandbox>` (its `GenerateInstanceName(pod, sandboxID, 63)`): the Pod's
//! name and the sandbox id, each lowercased with every character outside `[a-z0-9-]` turned into `-`; the pod
//! part cut to [`POD_PART_MAX`] characters, the sandbox part to its first [`SANDBOX_PART_LEN`]. The name carries
//! no namespace. And it names the PeerPod of that VM `<pod>-resource-<5 random characters>`
//! (`newPeerPod`).
//!
//! Both rules are applied forwards here, from the Pod to the name, and compared whole: a VM named after
//! `web-1` never matches the Pod `web`, and a VM whose Pod no longer exists matches nothing. Where CAA cut a
//! long Pod name, every Pod whose name cuts to the same part matches: CAA's name keeps no more.

use std::collections::HashMap;

/// The prefix of every VM name CAA generates.
pub const PREFIX: &str = "podvm-";
/// The longest pod part of a CAA VM name: CAA caps the whole name at 63 characters and keeps 10 of them for
/// the two dashes and the sandbox part (`63 - len("podvm") - 10`).
pub const POD_PART_MAX: usize = 48;
/// How much of the sandbox id a CAA VM name keeps.
pub const SANDBOX_PART_LEN: usize = 8;
/// What CAA puts between the Pod's name and the random suffix of a PeerPod's name.
const PEERPOD_INFIX: &str = "-resource-";
/// The length of that random suffix (apimachinery's `rand.String(5)`).
const PEERPOD_SUFFIX_LEN: usize = 5;

/// A Pod of this cluster, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// CAA's `sanitize`: lowercase, and every character outside `[a-z0-9-]` a `-`.
fn sanitize(text: &str) -> String {
    text.chars()
        .flat_map(char::to_lowercase)
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The pod part CAA writes into the name of a VM of the Pod `pod_name`.
pub fn pod_part(pod_name: &str) -> String {
    sanitize(pod_name).chars().take(POD_PART_MAX).collect()
}

/// The pod part of `vm_name` when it is a name CAA generates, exactly: `podvm-`, a pod part of 1 to
/// [`POD_PART_MAX`] characters, `-`, and [`SANDBOX_PART_LEN`] lowercase letters or digits (a sandbox id is
/// hex), nothing outside `[a-z0-9-]`. `None` for any other name.
pub fn parse_vm_name(vm_name: &str) -> Option<&str> {
    let rest = vm_name.strip_prefix(PREFIX)?;
    if !rest
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return None;
    }
    let split = rest.len().checked_sub(SANDBOX_PART_LEN + 1)?;
    let (pod, dash_sandbox) = rest.split_at(split);
    let sandbox = dash_sandbox.strip_prefix('-')?;
    let sandbox_ok = sandbox
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (sandbox_ok && !pod.is_empty() && pod.len() <= POD_PART_MAX).then_some(pod)
}

/// The Pod's name in the name CAA gives its PeerPod (`<pod>-resource-<5 letters or digits>`); `None` for a
/// PeerPod CAA did not name.
pub fn pod_of_peerpod(peerpod_name: &str) -> Option<&str> {
    let split = peerpod_name.len().checked_sub(PEERPOD_SUFFIX_LEN)?;
    if !peerpod_name.is_char_boundary(split) {
        return None;
    }
    let (head, suffix) = peerpod_name.split_at(split);
    let suffix_ok = suffix
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    let pod = head.strip_suffix(PEERPOD_INFIX)?;
    (suffix_ok && !pod.is_empty()).then_some(pod)
}

/// Whether `vm_name` is the name CAA gives a VM of the Pod `pod_name`.
pub fn names_pod(vm_name: &str, pod_name: &str) -> bool {
    parse_vm_name(vm_name).is_some_and(|part| part == pod_part(pod_name))
}

/// The live Pods of this cluster by the pod part CAA would name their VMs with.
#[derive(Debug, Default, Clone)]
pub struct PodIndex(HashMap<String, Vec<PodRef>>);

impl PodIndex {
    pub fn new(pods: impl IntoIterator<Item = PodRef>) -> Self {
        let mut index: HashMap<String, Vec<PodRef>> = HashMap::new();
        for pod in pods {
            index.entry(pod_part(&pod.name)).or_default().push(pod);
        }
        for pods in index.values_mut() {
            pods.sort();
        }
        PodIndex(index)
    }

    /// The Pods `vm_name` is CAA's name for a VM of (several where Pods of the same name live in several
    /// namespaces, or CAA cut their names alike); empty when it is no CAA name or its Pod is gone.
    pub fn owners_of(&self, vm_name: &str) -> &[PodRef] {
        parse_vm_name(vm_name)
            .and_then(|part| self.0.get(part))
            .map_or(&[], Vec::as_slice)
    }
}

/// The one VM of `vms` (instance id, name) that CAA's name ties to the PeerPod `peerpod_name`; `None` when
/// the PeerPod's name is not CAA's, or no VM or more than one VM matches.
pub fn matched_instance<'a>(
    peerpod_name: &str,
    vms: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Option<&'a str> {
    let pod = pod_of_peerpod(peerpod_name)?;
    let mut matching = vms
        .into_iter()
        .filter(|(_, name)| names_pod(name, pod))
        .map(|(id, _)| id);
    let first = matching.next()?;
    matching.next().is_none().then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(namespace: &str, name: &str) -> PodRef {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_pod_part_is_caas_sanitized_and_cut_name() {
        assert_eq!(pod_part("web"), "web");
        assert_eq!(pod_part("Web.Front_1"), "web-front-1");
        let long = "a".repeat(60);
        assert_eq!(pod_part(&long), "a".repeat(POD_PART_MAX));
        // CAA's own example length: podvm- + 48 + - + 8 is its 63-character cap.
        assert_eq!(
            format!("{PREFIX}{}-{}", pod_part(&long), "0123abcd").len(),
            63
        );
    }

    #[test]
    fn only_whole_caa_names_parse() {
        assert_eq!(parse_vm_name("podvm-web-0123abcd"), Some("web"));
        assert_eq!(parse_vm_name("podvm-web-1-0123abcd"), Some("web-1"));
        for other in [
            "podvm-0123abcd",                             // no pod part
            "podvm--0123abcd",                            // empty pod part
            "podvm-web-0123abc",                          // sandbox part too short
            "podvm-web-0123abcde", // ... too long: the dash is not where CAA puts it
            "podvm-web_0123abcd",  // CAA's sanitize leaves no underscore
            "podvm-Web-0123abcd",  // nor capitals
            "podvm-web-0123-bcd",  // a sandbox id is hex
            "web-0123abcd",        // not CAA's prefix
            "xpodvm-web-0123abcd", // not at the start
            "i-0123456789abcdef0", // an EC2 id
            "podvm-3b1c2d4e-5f60-4a7b-8c9d-0e1f2a3b4c5d", // a test VM named by UUID
        ] {
            assert_eq!(parse_vm_name(other), None, "{other}");
        }
        let too_long = format!("podvm-{}-0123abcd", "a".repeat(POD_PART_MAX + 1));
        assert_eq!(parse_vm_name(&too_long), None);
    }

    #[test]
    fn a_vm_names_its_pod_and_no_other() {
        assert!(names_pod("podvm-web-0123abcd", "web"));
        assert!(!names_pod("podvm-web-0123abcd", "we"));
        assert!(!names_pod("podvm-web-1-0123abcd", "web"), "no prefix games");
        assert!(!names_pod("podvm-web-0123abcd", "web-1"));
        assert!(names_pod("podvm-web-front-0123abcd", "web.front"));
        // A long name matches the Pods it could be CAA's name for: the cut part, not any prefix of it.
        let long = format!("{}x", "a".repeat(POD_PART_MAX));
        let vm = format!("podvm-{}-0123abcd", "a".repeat(POD_PART_MAX));
        assert!(names_pod(&vm, &long));
        assert!(!names_pod(&vm, &"a".repeat(POD_PART_MAX - 1)));
    }

    #[test]
    fn the_index_finds_live_pods_of_every_namespace_and_nothing_else() {
        let index = PodIndex::new([pod("b", "web"), pod("a", "web"), pod("a", "web-1")]);
        assert_eq!(
            index.owners_of("podvm-web-0123abcd"),
            [pod("a", "web"), pod("b", "web")]
        );
        assert_eq!(index.owners_of("podvm-web-1-0123abcd"), [pod("a", "web-1")]);
        assert!(index.owners_of("podvm-gone-0123abcd").is_empty());
        assert!(index.owners_of("podvm-web").is_empty());
        assert!(index.owners_of("").is_empty());
    }

    #[test]
    fn peerpod_names_give_their_pod() {
        assert_eq!(pod_of_peerpod("web-resource-x7b2k"), Some("web"));
        assert_eq!(
            pod_of_peerpod("web-resource-1-resource-abcde"),
            Some("web-resource-1")
        );
        for other in [
            "web",
            "web-resource-",
            "web-resource-abcd",
            "web-resource-abcdef",
            "web-resource-ABCDE",
            "-resource-abcde",
            "web-resourcex-abcde",
        ] {
            assert_eq!(pod_of_peerpod(other), None, "{other}");
        }
    }

    #[test]
    fn a_peerpod_is_matched_to_exactly_one_vm() {
        let one = [
            ("id-1", "podvm-web-0123abcd"),
            ("id-2", "podvm-web-1-0123abcd"),
        ];
        assert_eq!(matched_instance("web-resource-abcde", one), Some("id-1"));
        let two = [
            ("id-1", "podvm-web-0123abcd"),
            ("id-3", "podvm-web-4567cdef"),
        ];
        assert_eq!(matched_instance("web-resource-abcde", two), None);
        assert_eq!(matched_instance("db-resource-abcde", one), None);
        assert_eq!(matched_instance("not-caas", one), None);
    }
}
