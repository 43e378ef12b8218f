//! Build metadata for `unmask --version`: the commit the binary was built from. Written by hand
//! (a few lines of `git`), because the crates that do this (vergen, built) bring libgit2 or
//! gitoxide for one hash.

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=UNMASK_COMMIT={commit}");
    // Rebuilt when HEAD moves: HEAD itself (a checkout) and the ref it names (a commit), where
    // git keeps them (`--git-path`: a worktree's refs live in the main checkout). A path that
    // does not exist would rerun this script on every build, so only existing ones are named.
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(p) = git(&["rev-parse", "--git-path", &name]) {
            if Path::new(&p).exists() {
                println!("cargo:rerun-if-changed={p}");
            }
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// `git ARGS` in the crate's folder, its trimmed output; `None` outside a git checkout or
/// without git (a crate unpacked from a tarball).
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then(|| s.trim().to_string())
}
