//! Names the git commit the `pn` binary is built from (`pn --version`) in `PN_GIT_COMMIT`:
//! `git rev-parse --short HEAD`, or `unknown` outside a git checkout (a crates.io tarball) or
//! without git.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    Some(s).filter(|s| !s.is_empty())
}

fn main() {
    let commit = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=PN_GIT_COMMIT={commit}");
    // Rebuild when HEAD moves: the HEAD file (a worktree's own), and the branch it points at
    // (loose ref or packed-refs, in the common git directory). Only files that exist: cargo
    // reruns a script whose watched file is missing every time.
    let git_dir = git(&["rev-parse", "--git-dir"]);
    let common = git(&["rev-parse", "--git-common-dir"]);
    let mut watch = Vec::new();
    if let Some(dir) = &git_dir {
        let head = Path::new(dir).join("HEAD");
        if let Ok(text) = std::fs::read_to_string(&head) {
            if let (Some(r), Some(common)) = (text.trim().strip_prefix("ref: "), &common) {
                watch.push(Path::new(common).join(r));
                watch.push(Path::new(common).join("packed-refs"));
            }
        }
        watch.push(head);
    }
    for path in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
