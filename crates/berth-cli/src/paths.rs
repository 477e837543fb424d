//! Whether two paths name one file, for commands that refuse an output naming another of
//! their files (`berth memviz -o` its snapshot, `berth train`'s `--save` / `--profile` /
//! `--memory-snapshot`).

use std::path::{Path, PathBuf};

/// Whether `a` and `b` name one file: an existing file by identity (on Unix the same inode, so
/// two hard links to one file count, as do symlinks and the same path), and a file that need
/// not exist yet by its path with the folder resolved (links, `.`, `..`).
pub fn same_file(a: &Path, b: &Path) -> bool {
    existing_same_file(a, b)
        || a == b
        || matches!((resolved(a), resolved(b)), (Some(x), Some(y)) if x == y)
}

#[cfg(unix)]
fn existing_same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    matches!(
        (std::fs::metadata(a), std::fs::metadata(b)),
        (Ok(x), Ok(y)) if x.dev() == y.dev() && x.ino() == y.ino()
    )
}

#[cfg(not(unix))]
fn existing_same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// `path` with its folder resolved, whether or not the file exists yet.
fn resolved(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = std::fs::canonicalize(path) {
        return Some(p);
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Some(std::fs::canonicalize(parent).ok()?.join(path.file_name()?))
}
