//! The generated files checked in under `dist/` (man pages, shell completions) and the README's
//! exit status table are what the current command line and `exit::Exit` render; the man pages
//! render without a groff warning, document every flag of every (nested) command, and every page
//! they point at exists (issue 27 item 5).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use clap::CommandFactory as _;
use tombstoned::cli::generate::{self, GeneratedFile};
use tombstoned::cli::Cli;

use crate::ops_support::repo_root;

const REFRESH: &str = "cargo run -- generate man dist/man && \
                       cargo run -- generate completions dist/completions && \
                       cargo run -- generate readme README.md";

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
            "tombstoned-outbox-deliver.8",
            "tombstoned-outbox-list.8",
            "tombstoned-outbox-requeue.8",
            "tombstoned-keys.8",
            "tombstoned-keys-explain.8",
            "tombstoned-conformance.8",
            "tombstoned-operations.8",
            "tombstoned-operations-grant.8",
            "tombstoned-operations-revoke.8",
            "tombstoned-operations-list.8",
        ],
        "one page per visible command and nested command; the hidden `generate` has none"
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

/// The checked-in man pages as groff renders them to text, by file name.
fn rendered_pages() -> Vec<(String, String)> {
    let dir = repo_root().join("dist/man");
    let mut pages: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let text = String::from_utf8_lossy(&groff(&path).stdout).into_owned();
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                text,
            )
        })
        .collect();
    pages.sort();
    pages
}

/// Every visible long flag of every command and nested command, with the command's path.
fn every_flag(command: &clap::Command, path: &str, out: &mut Vec<(String, String)>) {
    for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
        if let Some(long) = arg.get_long() {
            out.push((path.to_owned(), format!("--{long}")));
        }
    }
    for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
        every_flag(sub, &format!("{path} {}", sub.get_name()), out);
    }
}

#[test]
fn every_flag_of_every_command_is_documented_on_its_own_man_page() {
    let pages = rendered_pages();
    let mut flags = Vec::new();
    every_flag(&Cli::command(), "tombstoned", &mut flags);
    assert!(
        flags.iter().any(|(_, f)| f == "--all-dead-letters"),
        "{flags:?}"
    );
    for (path, flag) in &flags {
        let page = format!("{}.8", path.replace(' ', "-"));
        let text = pages
            .iter()
            .find(|(name, _)| *name == page)
            .map(|(_, text)| text.as_str())
            .unwrap_or_else(|| panic!("no man page {page} for `{path}`"));
        assert!(
            text.contains(flag.as_str()),
            "{page} does not document {flag}"
        );
    }
}

#[test]
fn every_man_page_a_man_page_points_at_exists() {
    let pages = rendered_pages();
    let names: BTreeSet<&str> = pages.iter().map(|(name, _)| name.as_str()).collect();
    let mut references = 0;
    for (name, text) in &pages {
        // "tombstoned-outbox-deliver(8)": in SEE ALSO and in a COMMANDS list.
        for (at, _) in text.match_indices("(8)") {
            let start = text[..at]
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .map_or(0, |i| i + 1);
            let page = &text[start..at];
            if page.starts_with("tombstoned") {
                references += 1;
                assert!(
                    names.contains(format!("{page}.8").as_str()),
                    "{name} points at {page}(8), which is not generated"
                );
            }
        }
    }
    assert!(references >= 20, "{references} references found");
}

#[test]
fn the_readme_exit_status_table_is_the_generated_one() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let regenerated = generate::with_exit_table(&readme).unwrap_or_else(|| {
        panic!(
            "README.md lacks the exit status markers {:?} ... {:?}",
            generate::EXIT_TABLE_BEGIN,
            generate::EXIT_TABLE_END
        )
    });
    assert!(
        regenerated == readme,
        "README.md's exit status table is not what src/exit.rs says; refresh with:\n  \
         cargo run -- generate readme README.md"
    );
    // The man page's EXIT STATUS says the same, case by case.
    let main = rendered_pages()
        .into_iter()
        .find(|(name, _)| name == "tombstoned.8")
        .unwrap()
        .1;
    let flat = main.split_whitespace().collect::<Vec<_>>().join(" ");
    for exit in tombstoned::exit::Exit::ALL {
        let meaning = exit.meaning().replace('`', "");
        let flat_meaning = meaning.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains(&flat_meaning),
            "tombstoned(8) lacks {}: {meaning}",
            exit.code()
        );
    }
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
        // -P-cbou: plain text (no overstriking for bold and underline), to read it back;
        // -rHY=0: no hyphenation, so a sentence reads back word for word wherever it breaks.
        .args(["-man", "-Tutf8", "-ww", "-P-cbou", "-rHY=0"])
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
