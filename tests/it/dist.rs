//! The generated files checked in under `dist/` (man pages, shell completions) are what the
//! current command line renders, and the man pages render without a groff warning.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use clap::CommandFactory as _;
use tombstoned::cli::generate::{self, GeneratedFile};
use tombstoned::cli::Cli;

use crate::ops_support::repo_root;

const REFRESH: &str = "cargo run -- generate man dist/man && \
                       cargo run -- generate completions dist/completions";

/// Every file of `expected` is in `dir` with the same bytes, and `dir` holds nothing else.
fn assert_current(dir: &str, expected: &[GeneratedFile]) {
    let dir_path = repo_root().join(dir);
    for file in expected {
        let path = dir_path.join(&file.name);
        let on_disk = std::fs::read(&path).unwrap_or_default();
        assert!(
            on_disk == file.contents,
            "{dir}/{} is missing or stale: the command line changed. Refresh with:\n  {REFRESH}",
            file.name
        );
    }
    let names: BTreeSet<&str> = expected.iter().map(|f| f.name.as_str()).collect();
    for entry in std::fs::read_dir(&dir_path).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            names.contains(name.as_str()),
            "{dir}/{name} is no longer generated (a command was removed?): delete it, then \
             refresh with:\n  {REFRESH}"
        );
    }
}

#[test]
fn checked_in_man_pages_and_completions_match_the_command_line() {
    let pages = generate::man_pages(Cli::command()).unwrap();
    let names: Vec<&str> = pages.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "tombstoned.8",
            "tombstoned-serve.8",
            "tombstoned-cleanup.8",
            "tombstoned-migrate.8",
            "tombstoned-check-config.8",
            "tombstoned-status.8",
            "tombstoned-demo.8",
            "tombstoned-outbox.8",
        ],
        "one page per visible command; the hidden `generate` has none"
    );
    assert_current("dist/man", &pages);

    let completions = generate::completions(Cli::command());
    for file in &completions {
        let text = String::from_utf8_lossy(&file.contents);
        assert!(text.contains("check-config"), "{}", file.name);
        assert!(
            !text.contains("generate"),
            "{} offers the hidden command",
            file.name
        );
    }
    assert_current("dist/completions", &completions);
}

/// `groff -man -Tutf8 -ww` (all warnings) on each page, as `man --warnings` would.
#[test]
fn man_pages_render_without_warnings() {
    let dir = repo_root().join("dist/man");
    let mut pages: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pages.sort();
    assert!(pages.len() >= 6, "{pages:?}");
    for page in &pages {
        let output = groff(page);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stderr.is_empty(),
            "groff warns about {}:\n{stderr}",
            page.display()
        );
        let text = String::from_utf8_lossy(&output.stdout);
        assert!(text.contains("NAME") && text.contains("SYNOPSIS"), "{text}");
    }
}

fn groff(page: &Path) -> std::process::Output {
    Command::new("groff")
        // -P-cbou: plain text (no overstriking for bold and underline), to read it back.
        .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
        .arg(page)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run groff ({e}): install it with `apt-get install groff-base` \
                 (CI's .ci/run does)"
            )
        })
}

/// The package's changelog names the crate's version (cargo deb takes the version from
/// Cargo.toml; the changelog must agree).
#[test]
fn the_debian_changelog_is_at_the_crate_version() {
    let changelog = std::fs::read_to_string(repo_root().join("dist/debian/changelog")).unwrap();
    let first = changelog.lines().next().unwrap();
    let expected = format!("tombstoned ({}) ", env!("CARGO_PKG_VERSION"));
    assert!(
        first.starts_with(&expected),
        "dist/debian/changelog starts with {first:?}; add an entry for {expected:?}"
    );
}

/// The tokens file the package installs in /etc parses, and grants nothing until the operator
/// adds a token.
#[test]
fn the_packaged_tokens_file_is_valid_and_empty() {
    let path = repo_root().join("dist/debian/tokens.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let tokens = tombstoned::auth::TokenSet::parse(&text, &path).unwrap();
    assert!(tokens.is_empty());
}
