//! One vocabulary: every condition reason, Event reason and error reason the components write is spelled once,
//! in the `api` crate (the Kubernetes side) or the `proto` crate (provider-service's `ErrorInfo` reasons), and
//! everyone else names it through their enums. A string literal equal to one of those reasons in the non-test
//! code of any other crate is a second spelling: renaming the variant would leave it behind.
//!
//! Code is read as Rust tokens (comments and doc text do not count); `#[cfg(test)]` items are skipped (a test
//! may pin a wire string on purpose), and so are the emulators, which speak the clouds' vocabulary, not ours.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};

use crate::layering::collect_crate_dirs;

/// Literals that spell one of our reasons but belong to another vocabulary, or are a process's own error label
/// (logs and metrics, never on an object or the wire) that happens to be the same word: (file, literal, why).
const OTHER_VOCABULARIES: &[(&str, &str, &str)] = &[
    ("bench/src/cluster.rs", "Ready", "a Node's condition type"),
    ("testenv/src/node.rs", "Ready", "a Node's condition type"),
    (
        "providers/alibabacloud/src/deletion.rs",
        "Available",
        "an ECS disk status",
    ),
    (
        "providers/aws/src/failure.rs",
        "Unavailable",
        "an EC2 error code",
    ),
    (
        "bench/src/error.rs",
        "Timeout",
        "the bench's own error label",
    ),
    ("bench/src/error.rs", "Io", "the bench's own error label"),
    (
        "provider-client/src/error.rs",
        "Io",
        "the client's own error label",
    ),
    (
        "runtime/src/error.rs",
        "Io",
        "the runtime's own error label",
    ),
    (
        "runtime/src/error.rs",
        "Tls",
        "the runtime's own error label",
    ),
    (
        "runtime/src/error.rs",
        "LeaderElection",
        "the runtime's own error label",
    ),
    (
        "webhook/src/error.rs",
        "Io",
        "the webhook's own error label",
    ),
    (
        "webhook/src/error.rs",
        "MalformedRequest",
        "the webhook's own error label",
    ),
];

/// Every reason string the `api` and `proto` crates own.
fn reasons() -> BTreeSet<&'static str> {
    use peerpods_api::peerpod::{CleanedReason, EventReason, FailureReason, InstancePresentReason};
    use peerpods_api::peerpodconfig::{ConditionReason, EventReason as ConfigEventReason};
    CleanedReason::NAMED
        .map(CleanedReason::as_str)
        .into_iter()
        .chain(FailureReason::ALL.map(FailureReason::as_str))
        .chain(EventReason::ALL.map(EventReason::as_str))
        .chain(InstancePresentReason::ALL.map(InstancePresentReason::as_str))
        .chain(ConditionReason::all_strings())
        .chain(ConfigEventReason::ALL.map(ConfigEventReason::as_str))
        .chain(peerpods_proto::ErrorReason::ALL.map(peerpods_proto::ErrorReason::as_str))
        .chain(peerpods_proto::RequesterReason::ALL.map(peerpods_proto::RequesterReason::as_str))
        .collect()
}

#[test]
fn no_reason_is_spelled_outside_the_api_and_proto_crates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned();
    let mut dirs = Vec::new();
    collect_crate_dirs(&root, &mut dirs);
    let owners = [root.join("api"), root.join("proto"), root.join("emulators")];
    let sources: Vec<PathBuf> = dirs
        .into_iter()
        .filter(|d| d.ends_with("src") && !owners.iter().any(|o| d.starts_with(o)))
        .collect();
    assert!(
        sources.len() > 15,
        "expected the workspace's crates' src/ folders, found {sources:?}"
    );
    let reasons = reasons();
    let mut found = Vec::new();
    for dir in &sources {
        found.extend(spelled_reasons(dir, &reasons));
    }
    let prefix = format!("{}/", root.display());
    let excused =
        |(file, literal, _): &(&str, &str, &str)| format!("{prefix}{file}: \"{literal}\"");
    let stale: Vec<String> = OTHER_VOCABULARIES
        .iter()
        .map(excused)
        .filter(|e| !found.contains(e))
        .collect();
    assert!(stale.is_empty(), "excused but no longer there: {stale:?}");
    found.retain(|f| !OTHER_VOCABULARIES.iter().map(excused).any(|e| &e == f));
    assert!(
        found.is_empty(),
        "reasons spelled outside api/ and proto/ (use the enum):\n{}",
        found.join("\n").replace(&prefix, "")
    );
}

#[test]
fn a_reason_in_code_is_found_and_one_in_a_test_or_comment_is_not() {
    let dir = std::env::temp_dir().join(format!("vocabulary-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("lib.rs"),
        "//! \"DoNotDelete\" in a doc comment.\n\
         pub fn f() -> &'static str { let _ = \"Other\"; \"DoNotDelete\" }\n\
         #[cfg(test)]\nmod tests { const X: &str = \"DoNotDelete\"; }\n\
         pub fn g() -> &'static str { \"DoNotDelete\" }\n",
    )
    .unwrap();
    let found = spelled_reasons(&dir, &BTreeSet::from(["DoNotDelete"]));
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.iter().all(|f| f.ends_with("lib.rs: \"DoNotDelete\"")));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `file: "Reason"` for every reason literal in the non-test code of the `.rs` files under `dir`.
fn spelled_reasons(dir: &Path, reasons: &BTreeSet<&str>) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    let mut found = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let tokens: TokenStream = text
            .parse()
            .unwrap_or_else(|e| panic!("{}: {e:?}", file.display()));
        let mut literals = Vec::new();
        literals_outside_tests(tokens, &mut literals);
        for literal in literals {
            let unquoted = literal.trim_matches('"');
            if literal.starts_with('"') && reasons.contains(unquoted) {
                found.push(format!("{}: {literal}", file.display()));
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The literals of `tokens`, skipping every item under a `#[cfg(test)]` attribute (up to and including the
/// item's body, or its `;`).
fn literals_outside_tests(tokens: TokenStream, out: &mut Vec<String>) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            TokenTree::Punct(p) if p.as_char() == '#' => {
                if let Some(TokenTree::Group(attr)) = trees.get(i + 1) {
                    let text: String = attr.stream().to_string().split_whitespace().collect();
                    if text == "cfg(test)" {
                        i += 2;
                        while i < trees.len() {
                            let end = match &trees[i] {
                                TokenTree::Group(g) => {
                                    g.delimiter() == proc_macro2::Delimiter::Brace
                                }
                                TokenTree::Punct(p) => p.as_char() == ';',
                                _ => false,
                            };
                            i += 1;
                            if end {
                                break;
                            }
                        }
                        continue;
                    }
                }
            }
            TokenTree::Group(g) => literals_outside_tests(g.stream(), out),
            TokenTree::Literal(l) => out.push(l.to_string()),
            _ => {}
        }
        i += 1;
    }
}
