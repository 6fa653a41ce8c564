//! The workspace's layering: no two source files import each other. A pair that does is one module
//! in two files (or a missing third module both should use), and it is where a change to one side
//! breaks the other.
//!
//! Every crate's `src/` and `tests/` is read as Rust tokens (comments and doc text are not code and
//! do not count); a file names another when a path in it (in a `use`, an expression, a type or a
//! macro's arguments) starts with `crate::`, `super::` or `self::`, or with a child module, and
//! leads to that file's module. An inline `mod tests { use super::*; }` names its own file.
//! A parent module and its children may use each other (`use super::*` is how a child reads its
//! parent's shared items); cycles through three or more files are not looked for.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{Delimiter, TokenStream, TokenTree};

/// A module path within one crate root (`src/` or `tests/`): `["scenarios", "load"]`.
type Module = Vec<String>;

#[test]
fn no_two_files_of_the_workspace_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned();
    let mut roots = Vec::new();
    collect_crate_dirs(&root, &mut roots);
    assert!(
        roots.len() > 20,
        "expected the workspace's crates' src/ and tests/ folders, found {roots:?}"
    );
    let mut pairs = Vec::new();
    for dir in &roots {
        pairs.extend(mutual_imports(dir));
    }
    assert!(
        pairs.is_empty(),
        "these files import each other:\n{}",
        pairs
            .join("\n")
            .replace(&format!("{}/", root.display()), "")
    );
}

#[test]
fn a_pair_that_imports_each_other_is_found() {
    let dir = tempfile_dir("pair");
    let write = |file: &str, text: &str| {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("lib.rs", "mod a; mod b; mod c; mod e; mod f; mod g;");
    // An expression path one way, a path inside a macro in an inline test module the other way.
    write("a.rs", "pub fn f() { crate::b::g(); crate::g::h() }");
    write(
        "b.rs",
        "pub fn g() {}\n#[cfg(test)]\nmod tests { #[test] fn t() { assert!(super::super::a::f() == ()); } }",
    );
    // A grouped use one way, a plain use the other way.
    write("e.rs", "use crate::{f::X, b};\npub struct Y;");
    write("f.rs", "use crate::e::Y;\npub struct X;");
    // A path in a doc comment is not an import: a names g, g only mentions a.
    write("g.rs", "//! See [`crate::a`].\npub fn h() {}");
    // A parent and its child module may use each other.
    write("c/mod.rs", "mod d;\nuse d::X;\npub struct Y;");
    write("c/d.rs", "use super::Y;\npub struct X;");
    let found = mutual_imports(&dir);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(
        found[0].contains("a.rs <->") && found[0].ends_with("b.rs"),
        "{found:?}"
    );
    assert!(
        found[1].contains("e.rs <->") && found[1].ends_with("f.rs"),
        "{found:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_pair_inside_a_test_binary_of_several_files_is_found() {
    let dir = tempfile_dir("binary");
    let write = |file: &str, text: &str| {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("Cargo.toml", "[package]");
    write("tests/it/main.rs", "mod a; mod b;");
    write("tests/it/a.rs", "use crate::b::Y;\npub struct X;");
    write("tests/it/b.rs", "use crate::a::X;\npub struct Y;");
    let mut roots = Vec::new();
    collect_crate_dirs(&dir, &mut roots);
    let found: Vec<String> = roots.iter().flat_map(|r| mutual_imports(r)).collect();
    assert_eq!(found.len(), 1, "{roots:?}: {found:?}");
    assert!(
        found[0].contains("a.rs <->") && found[0].ends_with("b.rs"),
        "{found:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("layering-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `src/` and `tests/` folders of every crate below `dir`, skipping build outputs, tools and
/// anything hidden.
pub(crate) fn collect_crate_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut children: Vec<PathBuf> = entries.filter_map(|e| Some(e.ok()?.path())).collect();
    children.sort();
    if dir.join("Cargo.toml").is_file() {
        for part in ["src", "tests"] {
            if dir.join(part).is_dir() {
                out.push(dir.join(part));
            }
        }
        // A test binary of several files (`tests/it/main.rs`) is a crate root of its own.
        if let Ok(tests) = std::fs::read_dir(dir.join("tests")) {
            let mut binaries: Vec<PathBuf> = tests
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| p.join("main.rs").is_file())
                .collect();
            binaries.sort();
            out.extend(binaries);
        }
    }
    for child in children {
        let name = child.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if child.is_dir()
            && !name.starts_with('.')
            && !["target", "src", "tests", "node_modules"].contains(&name)
        {
            collect_crate_dirs(&child, out);
        }
    }
}

/// The pairs of files below one crate root that name each other, as lines of text.
fn mutual_imports(dir: &Path) -> Vec<String> {
    let mut files: BTreeMap<Module, PathBuf> = BTreeMap::new();
    collect_rust_files(dir, dir, &mut files);
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let mut names: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, path) in &files {
        let text = std::fs::read_to_string(path).unwrap();
        // A file that is not Rust tokens would not compile; the compiler says so, not this check.
        let Ok(tokens) = text.parse::<TokenStream>() else {
            continue;
        };
        let mut named = BTreeSet::new();
        scan(tokens, module, &modules, &mut named);
        named.retain(|m| m != module);
        names.insert(module.clone(), named);
    }
    let mut pairs = Vec::new();
    for (a, named) in &names {
        for b in named {
            let related = a.starts_with(b) || b.starts_with(a);
            if a < b && !related && names.get(b).is_some_and(|n| n.contains(a)) {
                pairs.push(format!(
                    "  {} <-> {}",
                    files[a].display(),
                    files[b].display()
                ));
            }
        }
    }
    pairs
}

/// Every `.rs` file below `dir`, by the module path it has under `root` (`lib.rs`, `main.rs` and
/// a test target's own file are crate roots: `[]` and `["name"]`).
fn collect_rust_files(root: &Path, dir: &Path, out: &mut BTreeMap<Module, PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            // Another crate root (a test binary of several files) is read on its own.
            if path.join("main.rs").is_file() {
                continue;
            }
            collect_rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).unwrap().with_extension("");
            let mut module: Module = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                module.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                module.pop();
            }
            out.insert(module, path);
        }
    }
}

/// Adds to `named` the modules the paths in `tokens` lead to, `current` being the module the
/// tokens are in.
fn scan(
    tokens: TokenStream,
    current: &Module,
    modules: &BTreeSet<Module>,
    named: &mut BTreeSet<Module>,
) {
    let trees: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            // An inline module: its contents are one level down.
            TokenTree::Ident(word) if word == "mod" => {
                if let (Some(TokenTree::Ident(name)), Some(TokenTree::Group(body))) =
                    (trees.get(i + 1), trees.get(i + 2))
                    && body.delimiter() == Delimiter::Brace
                {
                    let mut inner = current.clone();
                    inner.push(name.to_string());
                    scan(body.stream(), &inner, modules, named);
                    i += 3;
                    continue;
                }
            }
            TokenTree::Ident(word) if !follows_path_separator(&trees, i) => {
                if let Some(start) = start_of_path(&word.to_string(), current, modules) {
                    i = follow_path(&trees, i + 1, start, modules, named);
                    continue;
                }
            }
            TokenTree::Group(group) => scan(group.stream(), current, modules, named),
            _ => {}
        }
        i += 1;
    }
}

/// Whether the token at `i` is preceded by `::` (a later segment, not a path's start).
fn follows_path_separator(trees: &[TokenTree], i: usize) -> bool {
    i >= 2
        && matches!(&trees[i - 1], TokenTree::Punct(p) if p.as_char() == ':')
        && matches!(&trees[i - 2], TokenTree::Punct(p) if p.as_char() == ':')
}

/// The module a path's first segment stands for, if it is one of this crate root's.
fn start_of_path(first: &str, current: &Module, modules: &BTreeSet<Module>) -> Option<Module> {
    match first {
        "crate" => Some(Vec::new()),
        "self" => Some(current.clone()),
        "super" => Some(current[..current.len().saturating_sub(1)].to_vec()),
        child => {
            let mut module = current.clone();
            module.push(child.to_owned());
            modules.contains(&module).then_some(module)
        }
    }
}

/// Follows `::segment` pairs (and `::{a, b::c}` groups) from `i`, records the deepest module each
/// path reaches, and returns the index after the path.
fn follow_path(
    trees: &[TokenTree],
    mut i: usize,
    mut module: Module,
    modules: &BTreeSet<Module>,
    named: &mut BTreeSet<Module>,
) -> usize {
    let mut reached = module.clone();
    loop {
        let separator = matches!(trees.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':')
            && matches!(trees.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
        if !separator {
            break;
        }
        match trees.get(i + 2) {
            Some(TokenTree::Ident(segment)) => {
                let segment = segment.to_string();
                if segment == "super" {
                    module.pop();
                } else {
                    module.push(segment);
                }
                if modules.contains(&module) {
                    reached = module.clone();
                }
                i += 3;
            }
            Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace => {
                // `use path::{a, b::c, self}`: each item is a path of its own from here.
                for item in split_on_commas(group.stream()) {
                    if let Some(TokenTree::Ident(first)) = item.first() {
                        let mut inner = module.clone();
                        inner.push(first.to_string());
                        if modules.contains(&inner) {
                            follow_path(&item, 1, inner, modules, named);
                        }
                    }
                }
                i += 3;
                break;
            }
            _ => break,
        }
    }
    named.insert(reached);
    i
}

/// The comma-separated items of a `use` group.
fn split_on_commas(tokens: TokenStream) -> Vec<Vec<TokenTree>> {
    let mut items = vec![Vec::new()];
    for tree in tokens {
        match &tree {
            TokenTree::Punct(p) if p.as_char() == ',' => items.push(Vec::new()),
            _ => items.last_mut().unwrap().push(tree),
        }
    }
    items.retain(|item| !item.is_empty());
    items
}
