//! Every file in `src/` is named in the `# Layout` section of its
//! folder's module doc, so the maps that the crate doc and each folder's
//! `mod.rs` draw stay true as files come and go.
//!
//! The rule, per file `src/<dir>/<name>.rs` (and per subfolder with Rust
//! files): the `# Layout` section of `src/<dir>/mod.rs` names it (as
//! `name.rs`, or as `name/` for a folder). A folder whose `mod.rs` has
//! no `# Layout` section is mapped by the nearest folder above it that
//! has one, which then names its files by their path from there
//! (`core/quota.rs` in `src/lib.rs`). The top of `src/` is mapped by
//! `src/lib.rs`, where a file or folder may also be named as a link to
//! its module (``[`core`]``).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The `# Layout` section of a module doc: its `//!` lines from the
/// heading to the next heading (or the doc's end), or `None`.
fn layout_section(file: &Path) -> Option<String> {
    let text = fs::read_to_string(file).ok()?;
    let doc: Vec<&str> = text
        .lines()
        .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let start = doc.iter().position(|l| l.trim() == "# Layout")?;
    let end = doc[start + 1..]
        .iter()
        .position(|l| l.starts_with("# "))
        .map_or(doc.len(), |n| start + 1 + n);
    Some(doc[start + 1..end].join("\n"))
}

/// The entries of `dir` that a layout names: its `.rs` files and its
/// subfolders that hold Rust files.
fn entries(dir: &Path) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if holds_rust(&path) {
                out.push((name, true));
            }
        } else if name.ends_with(".rs") {
            out.push((name, false));
        }
    }
    out.sort();
    out
}

fn holds_rust(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().any(|e| {
        let p = e.unwrap().path();
        p.extension().is_some_and(|x| x == "rs") || (p.is_dir() && holds_rust(&p))
    })
}

/// The file whose `# Layout` maps `dir`, with `dir`'s path from that
/// file's folder (empty for its own folder).
fn mapper(src: &Path, dir: &Path) -> Option<(PathBuf, String)> {
    let mut at = dir.to_path_buf();
    loop {
        let doc = if at == src {
            src.join("lib.rs")
        } else {
            at.join("mod.rs")
        };
        if layout_section(&doc).is_some() {
            let rel = dir
                .strip_prefix(&at)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            return Some((doc, rel));
        }
        if at == src {
            return None;
        }
        at = at.parent()?.to_path_buf();
    }
}

fn names(section: &str, rel: &str, name: &str, is_dir: bool, top: bool) -> bool {
    let prefix = if rel.is_empty() {
        String::new()
    } else {
        format!("{rel}/")
    };
    let shown = if is_dir {
        format!("{prefix}{name}/")
    } else {
        format!("{prefix}{name}")
    };
    if section.contains(&format!("`{shown}`")) || section.contains(&format!("`{shown}")) {
        return true;
    }
    // The crate doc may name a top-level module by a link to it.
    let module = name.trim_end_matches(".rs");
    top && rel.is_empty() && section.contains(&format!("[`{module}`]"))
}

#[test]
fn every_file_in_src_is_named_in_its_folders_layout() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut missing = BTreeSet::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        let Some((doc, rel)) = mapper(&src, &dir) else {
            missing.insert(format!("{}: no # Layout above it", dir.display()));
            continue;
        };
        let section = layout_section(&doc).unwrap();
        let top = doc == src.join("lib.rs");
        for (name, is_dir) in entries(&dir) {
            if is_dir {
                dirs.push(dir.join(&name));
            }
            if name == "mod.rs" || (name == "lib.rs" && dir == src) {
                continue;
            }
            if !names(&section, &rel, &name, is_dir, top) {
                let shown = if is_dir { format!("{name}/") } else { name };
                let path = dir.join(&shown);
                missing.insert(format!(
                    "{} is not named in the # Layout of {}",
                    path.strip_prefix(&src).unwrap().display(),
                    doc.strip_prefix(&src).unwrap().display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files missing from their layout lists:\n{}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
}
