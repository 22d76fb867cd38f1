//! The commit `capstan --version` names: `CAPSTAN_COMMIT` when the build sets it (a container
//! build has no `.git`), else `git rev-parse`, else `unknown`. Rebuilt when HEAD moves.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=CAPSTAN_COMMIT");
    let commit = std::env::var("CAPSTAN_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| {
            // HEAD and the branch it points at: a commit moves the one, a checkout the other.
            for path in ["HEAD", "packed-refs"] {
                if let Some(file) = git(&["rev-parse", "--git-path", path]) {
                    println!("cargo:rerun-if-changed={file}");
                }
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"])
                && let Some(file) = git(&["rev-parse", "--git-path", &branch])
            {
                println!("cargo:rerun-if-changed={file}");
            }
            git(&["rev-parse", "--short=12", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CAPSTAN_COMMIT={commit}");
}
