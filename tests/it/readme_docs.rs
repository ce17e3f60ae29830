//! What README.md states about the repository holds (issue 27 item 9): the configuration table
//! has a row for every key of `config/tombstoned.toml`, every file "Installing without the
//! package" copies from the checkout exists, and no bullet of "What the unit does and why" stops
//! mid-sentence; the command synopsis names every flag of every command (issue 27).

use std::path::Path;

use crate::ops_support::repo_root;

fn readme() -> String {
    std::fs::read_to_string(repo_root().join("README.md")).unwrap()
}

/// The text after the heading (or other text) `title`, up to the next heading (`##` or deeper).
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let after = text
        .split(title)
        .nth(1)
        .unwrap_or_else(|| panic!("README has no {title:?}"));
    after.split("\n##").next().unwrap_or_default()
}

#[test]
fn the_configuration_table_has_a_row_for_every_key_of_the_shipped_configuration() {
    let text = std::fs::read_to_string(repo_root().join("config/tombstoned.toml")).unwrap();
    let config: toml::Table = text.parse().unwrap();
    let rows: Vec<String> = readme()
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| line.split(" | ").next().unwrap_or_default().to_owned())
        .collect();
    let mut missing = Vec::new();
    for (section, keys) in &config {
        let keys = keys.as_table().unwrap_or_else(|| panic!("[{section}]"));
        for key in keys.keys() {
            let name = format!("`{section}.{key}`");
            if !rows.iter().any(|row| row.contains(&name)) {
                missing.push(name);
            }
        }
    }
    assert!(missing.is_empty(), "no README table row for {missing:?}");
}

/// The sources of one `install` command line (its options and destination left out).
fn install_sources(line: &str) -> Vec<&str> {
    let line = line.split(" #").next().unwrap_or_default();
    let mut words = line.split_whitespace().skip(1);
    let (mut args, mut target_dir, mut directory) = (Vec::new(), false, false);
    while let Some(word) = words.next() {
        match word {
            "-m" | "-o" | "-g" => {
                words.next();
            }
            "-t" => {
                words.next();
                target_dir = true;
            }
            "-d" => directory = true,
            "-D" | "\\" => {}
            _ => args.push(word),
        }
    }
    if directory {
        return Vec::new();
    }
    if !target_dir {
        args.pop();
    }
    args
}

#[test]
fn installing_without_the_package_copies_files_that_exist() {
    let text = readme();
    let script = section(&text, "Installing without the package")
        .split("```sh")
        .nth(1)
        .unwrap_or_default();
    let script = script.split("```").next().unwrap_or_default();
    // Continuation lines joined: `install -D ... \` + `    /usr/local/...`.
    let script = script.replace("\\\n", " ");
    let mut checked = 0;
    for line in script.lines().filter(|l| l.starts_with("install ")) {
        for source in install_sources(line) {
            // Built by the line before, not in the checkout.
            if source.starts_with("target/") {
                continue;
            }
            let found = match source.strip_suffix("*.8") {
                Some(dir) => std::fs::read_dir(repo_root().join(dir))
                    .map(|mut d| d.next().is_some())
                    .unwrap_or(false),
                None => Path::new(&repo_root().join(source)).is_file(),
            };
            assert!(
                found,
                "README installs {source:?}, which the repository lacks: {line}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 5, "{checked} sources found in:\n{script}");
}

#[test]
fn every_bullet_of_what_the_unit_does_ends_its_sentence() {
    let text = readme();
    let section = section(&text, "### What the unit does and why");
    let bullets: Vec<&str> = section.split("\n- ").skip(1).map(str::trim).collect();
    assert!(bullets.len() >= 5, "{section}");
    for bullet in bullets {
        assert!(
            bullet.ends_with('.') || bullet.ends_with(".)"),
            "a bullet stops mid-sentence: {bullet:?}"
        );
    }
}

/// The long flags of every visible command and nested command ("cleanup", "outbox deliver"),
/// without the global ones every command has.
fn flags_by_command() -> Vec<(String, Vec<String>)> {
    use clap::CommandFactory as _;
    fn walk(command: &clap::Command, path: &str, out: &mut Vec<(String, Vec<String>)>) {
        for sub in command.get_subcommands().filter(|c| !c.is_hide_set()) {
            let name = format!("{path}{}", sub.get_name()).trim().to_owned();
            let flags: Vec<String> = sub
                .get_arguments()
                .filter(|a| !a.is_hide_set() && !a.is_global_set())
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                .filter(|f| f != "--help")
                .collect();
            // A command of commands (`outbox`) has its nested commands' lines, not one of its own.
            if sub.get_subcommands().all(|c| c.is_hide_set()) {
                out.push((name.clone(), flags));
            }
            walk(sub, &format!("{name} "), out);
        }
    }
    let mut out = Vec::new();
    walk(&tombstoned::cli::Cli::command(), "", &mut out);
    out
}

/// The synopsis under "Commands and exit codes" names every command with every flag it has, and
/// no flag it lacks (`demo --replay-window`, issue 27: the README says how to keep the demo up).
#[test]
fn the_command_synopsis_names_every_flag_of_every_command() {
    let text = readme();
    let synopsis = section(&text, "## Commands and exit codes")
        .split("```text")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .unwrap_or_else(|| panic!("no ```text synopsis under \"Commands and exit codes\""))
        .to_owned();
    // "  outbox deliver [--max-events N] ...": a command line starts two spaces in.
    let mut lines: Vec<(String, String)> = Vec::new();
    for line in synopsis.lines().skip(1) {
        if line.starts_with("  ") && !line.starts_with("   ") {
            lines.push((line.trim().to_owned(), String::new()));
        }
    }
    let mut problems = Vec::new();
    for (command, flags) in flags_by_command() {
        let Some((line, _)) = lines.iter().find(|(l, _)| {
            l.strip_prefix(command.as_str())
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
        }) else {
            problems.push(format!("no synopsis line for `{command}`"));
            continue;
        };
        let named: Vec<&str> = line
            .split(|c: char| c.is_whitespace() || "[]()|".contains(c))
            .filter(|w| w.starts_with("--"))
            .collect();
        for flag in &flags {
            if !named.contains(&flag.as_str()) {
                problems.push(format!("`{command}` line lacks {flag}: {line}"));
            }
        }
        for flag in named {
            if !flags.iter().any(|f| f == flag) {
                problems.push(format!(
                    "`{command}` has no {flag}, its line names it: {line}"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The command of a ```` ```sh ```` line: its text before a `#` comment, with the `NAME=value`
/// words before it (the environment it runs with) left out.
fn command_of(line: &str) -> String {
    let words = line
        .split('#')
        .next()
        .unwrap_or_default()
        .split_whitespace();
    words
        .skip_while(|w| {
            w.split_once('=').is_some_and(|(name, _)| {
                !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            })
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The first ```` ```sh ```` block of `section`, line by line.
fn sh_block(section: &str) -> Vec<&str> {
    section
        .split("```sh\n")
        .nth(1)
        .and_then(|s| s.split("```").next())
        .unwrap_or_else(|| panic!("no ```sh block in:\n{section}"))
        .lines()
        .collect()
}

/// The quick start's test command and the Development section's are the command `.ci/run` runs
/// the suite with (issue 42 item 0): one script that sets a fresh Debian/Ubuntu machine up and
/// runs the whole suite, so a newcomer's run is CI's. `.ci/run` also takes its package install
/// from the same script (`--setup-only`).
#[test]
fn the_readme_test_command_is_the_one_ci_runs() {
    let text = readme();
    let quick_start: Vec<String> = sh_block(section(&text, "## Quick start"))
        .into_iter()
        .map(command_of)
        .filter(|c| !c.starts_with("cargo run"))
        .collect();
    let [test_command] = quick_start.as_slice() else {
        panic!("the quick start should have one test command besides the demo: {quick_start:?}");
    };
    let development = command_of(sh_block(section(&text, "## Development"))[0]);
    assert_eq!(&development, test_command, "Development's first command");

    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    let script = test_command.split_whitespace().next().unwrap_or_default();
    let runs: Vec<String> = ci
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim_start().starts_with("step "))
        .map(command_of)
        .filter(|c| c.split_whitespace().next() == Some(script))
        .collect();
    assert_eq!(
        runs,
        [format!("{script} --setup-only"), test_command.clone()],
        ".ci/run sets up with the README's script, then runs the suite with exactly its command"
    );

    let path = repo_root().join(script);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert!(mode & 0o111 != 0, "{script} is not executable");
    let body = std::fs::read_to_string(&path).unwrap();
    assert!(
        body.lines()
            .any(|l| l.trim() == "exec cargo test --locked \"$@\""),
        "{script} no longer ends in the whole suite"
    );
}
