//! `tombstoned generate` (hidden): the man pages — `tombstoned(8)` and one `tombstoned-<command>(8)`
//! per command and nested command (`tombstoned-outbox-deliver(8)`) — the bash, zsh and fish
//! completions, rendered from the clap definition of the command line it is given, and the
//! README's exit status table, rendered from [`Exit`] like the man page's EXIT STATUS. The copies
//! checked in (`dist/`, shipped by the Debian package, and README.md) are compared with a fresh
//! rendering by a test, so they cannot go stale.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

use crate::exit::Exit;

/// `tombstoned generate`
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// What to write.
    #[command(subcommand)]
    pub what: Generated,
}

/// The kinds of generated files.
#[derive(Debug, Subcommand)]
pub enum Generated {
    /// The man pages: tombstoned.8 and tombstoned-COMMAND.8 for every command.
    Man {
        /// Directory to write them to (created if missing), e.g. dist/man.
        #[arg(value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
    /// The completion scripts: tombstoned.bash, _tombstoned (zsh) and tombstoned.fish.
    Completions {
        /// Directory to write them to (created if missing), e.g. dist/completions.
        #[arg(value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
    /// The exit status table of a Markdown file (README.md), between its markers.
    Readme {
        /// The file to rewrite in place, e.g. README.md.
        #[arg(value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
        file: PathBuf,
    },
}

/// The line before the README's generated exit status table.
pub const EXIT_TABLE_BEGIN: &str =
    "<!-- exit-status: generated from src/exit.rs by `cargo run -- generate readme README.md`; do not edit -->";
/// The line after it.
pub const EXIT_TABLE_END: &str = "<!-- /exit-status -->";

/// One generated file: its name (no directory) and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    /// File name, e.g. `tombstoned-cleanup.8`.
    pub name: String,
    /// Contents.
    pub contents: Vec<u8>,
}

/// Why `tombstoned generate` failed.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// Rendering a man page failed (only writing to memory happens there, so this is an encoding
    /// problem in clap_mangen).
    #[error("cannot render the man page {name}: {source}")]
    Render {
        /// The page.
        name: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file given to `generate readme` has no (or a broken) pair of markers.
    #[error("{}: no line {EXIT_TABLE_BEGIN:?} followed by a line {EXIT_TABLE_END:?}", path.display())]
    Markers {
        /// The file.
        path: PathBuf,
    },
    /// The file given to `generate readme` could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The output directory or a file in it could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Man pages are in section 8: tombstoned is a daemon and its administration tool.
const SECTION: &str = "8";

/// Writes what `args` asks for, rendered from `cli`; returns the paths written.
pub fn run(cli: clap::Command, args: &GenerateArgs) -> Result<Vec<PathBuf>, GenerateError> {
    let (dir, files) = match &args.what {
        Generated::Man { dir } => (dir, man_pages(cli)?),
        Generated::Completions { dir } => (dir, completions(cli)),
        Generated::Readme { file } => return rewrite_exit_table(file).map(|()| vec![file.clone()]),
    };
    write_all(dir, &files)
}

/// The exit status table in Markdown, one row per [`Exit::ALL`] with [`Exit::meaning`].
pub fn exit_status_markdown() -> String {
    let mut table = String::from("| exit status | meaning |\n|---|---|\n");
    for exit in Exit::ALL {
        table.push_str(&format!(
            "| {} | {} |\n",
            exit.code(),
            exit.meaning().replace('|', "\\|")
        ));
    }
    table
}

/// The exit statuses as `tombstoned --help` ends with them: one entry per [`Exit::ALL`] with
/// [`Exit::meaning`] (its code spans plain, as on the man page), wrapped to 100 columns.
pub fn exit_status_help() -> String {
    const WIDTH: usize = 100;
    const INDENT: &str = "       ";
    let mut text = String::from("Exit status:\n");
    for exit in Exit::ALL {
        let mut line = format!("  {:<4} ", exit.code());
        for word in exit.meaning().replace('`', "").split_whitespace() {
            if line.len() + 1 + word.len() > WIDTH && line.len() > INDENT.len() {
                text.push_str(line.trim_end());
                text.push('\n');
                line = INDENT.to_owned();
            } else if line.len() > INDENT.len() {
                line.push(' ');
            }
            line.push_str(word);
        }
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// `text` with the lines between its markers replaced by [`exit_status_markdown`]; `None` when
/// the markers are missing or out of order.
pub fn with_exit_table(text: &str) -> Option<String> {
    let begin = text.find(&format!("{EXIT_TABLE_BEGIN}\n"))? + EXIT_TABLE_BEGIN.len() + 1;
    // The end marker on a line of its own, right after the begin marker's line or later.
    let end = begin
        + if text[begin..].starts_with(&format!("{EXIT_TABLE_END}\n")) {
            0
        } else {
            text[begin..].find(&format!("\n{EXIT_TABLE_END}\n"))? + 1
        };
    Some(format!(
        "{}{}{}",
        &text[..begin],
        exit_status_markdown(),
        &text[end..]
    ))
}

fn rewrite_exit_table(path: &Path) -> Result<(), GenerateError> {
    let text = std::fs::read_to_string(path).map_err(|source| GenerateError::Read {
        path: path.to_owned(),
        source,
    })?;
    let new = with_exit_table(&text).ok_or_else(|| GenerateError::Markers {
        path: path.to_owned(),
    })?;
    std::fs::write(path, new).map_err(|source| GenerateError::Write {
        path: path.to_owned(),
        source,
    })
}

fn write_all(dir: &Path, files: &[GeneratedFile]) -> Result<Vec<PathBuf>, GenerateError> {
    std::fs::create_dir_all(dir).map_err(|source| GenerateError::Write {
        path: dir.to_owned(),
        source,
    })?;
    files
        .iter()
        .map(|file| {
            let path = dir.join(&file.name);
            std::fs::write(&path, &file.contents).map_err(|source| GenerateError::Write {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        })
        .collect()
}

/// The completion scripts for bash, zsh and fish, under the names their packaging conventions
/// use (`/usr/share/bash-completion/completions/tombstoned`, `.../zsh/vendor-completions/_tombstoned`,
/// `.../fish/vendor_completions.d/tombstoned.fish`).
pub fn completions(cli: clap::Command) -> Vec<GeneratedFile> {
    let mut cli = without_hidden_commands(cli);
    let bin = cli.get_name().to_owned();
    [
        (Shell::Bash, format!("{bin}.bash")),
        (Shell::Zsh, format!("_{bin}")),
        (Shell::Fish, format!("{bin}.fish")),
    ]
    .into_iter()
    .map(|(shell, name)| {
        let mut contents = Vec::new();
        clap_complete::generate(shell, &mut cli, bin.clone(), &mut contents);
        GeneratedFile { name, contents }
    })
    .collect()
}

/// The same command line without its hidden commands (`generate`), which clap_complete would
/// otherwise offer: rebuilt from the name, texts, arguments and visible commands.
fn without_hidden_commands(cli: clap::Command) -> clap::Command {
    let mut pruned = clap::Command::new(cli.get_name().to_owned())
        .args(cli.get_arguments().cloned())
        .subcommands(cli.get_subcommands().filter(|c| !c.is_hide_set()).cloned())
        .subcommand_required(cli.is_subcommand_required_set());
    if let Some(about) = cli.get_about() {
        pruned = pruned.about(about.clone());
    }
    if let Some(version) = cli.get_version() {
        pruned = pruned.version(version.to_owned());
    }
    pruned
}

/// `tombstoned.8` and one page per visible command (`tombstoned-cleanup.8`, ...) and nested
/// command (`tombstoned-outbox-deliver.8`, after its parent's page).
pub fn man_pages(mut cli: clap::Command) -> Result<Vec<GeneratedFile>, GenerateError> {
    // Built once so that the global options (--config, --log-format) and the display names
    // ("tombstoned-cleanup") reach the commands' pages.
    cli = cli
        .disable_help_subcommand(true)
        .subcommand_help_heading("COMMANDS");
    cli.build();
    let name = cli.get_name().to_owned();
    let version = cli.get_version().unwrap_or_default().to_owned();
    // (command, its parent's page unless that is the main page), parents before children.
    let mut commands: Vec<(clap::Command, Option<String>)> = Vec::new();
    for command in visible_subcommands(&cli) {
        let parent = display_name(command);
        commands.push((command.clone(), None));
        for nested in visible_subcommands(command) {
            commands.push((nested.clone(), Some(parent.clone())));
        }
    }
    let see_also: Vec<String> = commands.iter().map(|(c, _)| display_name(c)).collect();

    let mut pages = vec![render_page(&cli, &version, &main_page(&see_also))?];
    for (command, parent) in &commands {
        let mut related = vec![name.clone()];
        related.extend(parent.iter().cloned());
        related.extend(visible_subcommands(command).map(display_name));
        pages.push(render_page(
            command,
            &version,
            &command_page(&name, &display_name(command), &related),
        )?);
    }
    Ok(pages)
}

fn visible_subcommands(command: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    command.get_subcommands().filter(|c| !c.is_hide_set())
}

fn display_name(command: &clap::Command) -> String {
    command
        .get_display_name()
        .unwrap_or_else(|| command.get_name())
        .to_owned()
}

/// What a page adds to clap_mangen's rendering of its command.
struct Extra {
    /// Replaces the DESCRIPTION (clap's would repeat the NAME line).
    description: Option<Roff>,
    /// Sections after the options and commands.
    sections: Roff,
}

/// One page: our title line, clap_mangen's name, synopsis, description, options and commands,
/// then our sections, then the version.
fn render_page(
    command: &clap::Command,
    version: &str,
    extra: &Extra,
) -> Result<GeneratedFile, GenerateError> {
    let man = Man::new(command.clone()).section(SECTION);
    let name = man.get_filename();
    let failed = |source| GenerateError::Render {
        name: name.clone(),
        source,
    };
    // Each render_* call starts with the same preamble (a string definition for apostrophes);
    // it is kept once, at the top.
    let preamble = Roff::new().render();
    let mut out: Vec<u8> = preamble.clone().into_bytes();
    // Written by hand: roff drops an empty argument, which would shift the source into the date
    // field (the pages carry no date, so that they change only when the CLI does).
    writeln!(
        out,
        ".TH {} {SECTION} \"\" \"tombstoned {version}\" \"System Administration\"",
        display_name(command).to_uppercase().replace('-', "\\-")
    )
    .map_err(failed)?;
    let mut part = |render: &dyn Fn(&mut Vec<u8>) -> std::io::Result<()>| {
        let mut buf = Vec::new();
        render(&mut buf)?;
        let body = buf
            .strip_prefix(preamble.as_bytes())
            .map_or(buf.as_slice(), |rest| rest);
        out.write_all(body)
    };
    part(&|w| man.render_name_section(w)).map_err(failed)?;
    part(&|w| man.render_synopsis_section(w)).map_err(failed)?;
    match &extra.description {
        Some(description) => part(&|w| description.to_writer(w)).map_err(failed)?,
        None => part(&|w| man.render_description_section(w)).map_err(failed)?,
    }
    if command.get_arguments().any(|a| !a.is_hide_set()) {
        part(&|w| man.render_options_section(w)).map_err(failed)?;
    }
    if command.get_subcommands().any(|c| !c.is_hide_set()) {
        part(&|w| man.render_subcommands_section(w)).map_err(failed)?;
    }
    part(&|w| extra.sections.to_writer(w)).map_err(failed)?;
    if command.get_version().is_some() {
        part(&|w| man.render_version_section(w)).map_err(failed)?;
    }
    Ok(GeneratedFile {
        name,
        contents: out,
    })
}

fn heading(roff: &mut Roff, title: &str) {
    roff.control("SH", [title]);
}

fn paragraph(roff: &mut Roff, text: &str) {
    roff.control("PP", []);
    roff.text([roman(text)]);
}

/// A tagged paragraph: `tag` in bold, `text` indented below it.
fn item(roff: &mut Roff, tag: &str, text: &str) {
    roff.control("TP", []);
    roff.text([bold(tag)]);
    roff.text([roman(text)]);
}

fn see_also(roff: &mut Roff, pages: &[String]) {
    heading(roff, "SEE ALSO");
    let mut inlines = Vec::new();
    for (i, page) in pages.iter().enumerate() {
        if i > 0 {
            inlines.push(roman(", "));
        }
        let (name, section) = page.rsplit_once('(').unwrap_or((page.as_str(), ""));
        inlines.push(bold(name));
        if !section.is_empty() {
            inlines.push(roman(format!("({section}")));
        }
    }
    roff.text(inlines);
}

fn main_page(commands: &[String]) -> Extra {
    let mut description = Roff::new();
    heading(&mut description, "DESCRIPTION");
    paragraph(
        &mut description,
        "tombstoned keeps the idempotency records of a write API on PostgreSQL honest over time. \
         A client retry of one business intent carries the same idempotency key; the daemon \
         claims the key, performs the write and stores the response in one transaction, and \
         replays the stored response to every later retry. Expired records are never deleted by \
         the scheduled cleaner but turned into tombstones, so a key can never be reused for \
         another purchase.",
    );
    paragraph(
        &mut description,
        "Run it as a system service (tombstoned.service, with tombstoned-cleanup.timer as an \
         alternative to the resident scheduler); apply the schema with tombstoned migrate before \
         the first start and after every upgrade that brings migrations.",
    );
    let mut roff = Roff::new();
    heading(&mut roff, "EXIT STATUS");
    for exit in Exit::ALL {
        // The README's table renders the backticks as code; a man page has no such markup.
        item(
            &mut roff,
            &exit.code().to_string(),
            &exit.meaning().replace('`', ""),
        );
    }
    heading(&mut roff, "ENVIRONMENT");
    for (variable, meaning) in [
        (
            "TOMBSTONED_CONFIG",
            "The configuration file, when --config is not given.",
        ),
        (
            "TOMBSTONED_DATABASE_URL, DATABASE_URL",
            "The database URL, highest first: TOMBSTONED_DATABASE_URL, \
             TOMBSTONED_DATABASE__URL, DATABASE_URL, database.url of the file, the default; \
             any of the variables wins over the file. check-config says which one applied.",
        ),
        (
            "TOMBSTONED_<SECTION>__<KEY>",
            "Any configuration key, e.g. TOMBSTONED_CLEANUP__BATCH_SIZE=500; wins over the file.",
        ),
        (
            "RUST_LOG",
            "Log level and filters (tracing EnvFilter syntax); the default is info.",
        ),
        (
            "NOTIFY_SOCKET, WATCHDOG_USEC, WATCHDOG_PID",
            "Set by systemd: serve reports readiness and status, and pings the watchdog.",
        ),
    ] {
        item(&mut roff, variable, meaning);
    }
    heading(&mut roff, "FILES");
    for (file, meaning) in [
        (
            "/etc/tombstoned/tombstoned.toml",
            "The configuration (root:tombstoned, 0640). Every key is described in it.",
        ),
        (
            "/etc/tombstoned/tokens.toml",
            "The API bearer tokens (SHA-256 digests), re-read on SIGHUP.",
        ),
        (
            "/etc/tombstoned/database-password",
            "The database password (root:root, 0600), handed to the service as the systemd \
             credential database-password when the database-password.conf drop-in is enabled.",
        ),
        (
            "/etc/tombstoned/tombstoned.env",
            "Optional environment for the services (root:root, 0600).",
        ),
        (
            "/lib/systemd/system/tombstoned.service",
            "The daemon. tombstoned-cleanup.service and tombstoned-cleanup.timer run the cleanup \
             as a timer-driven one-shot instead.",
        ),
        (
            "/usr/share/doc/tombstoned/",
            "README, Prometheus alerting rules, the Grafana dashboard, examples.",
        ),
    ] {
        item(&mut roff, file, meaning);
    }
    let mut pages: Vec<String> = commands.iter().map(|c| format!("{c}(8)")).collect();
    pages.extend(
        ["systemd.exec(5)", "systemd-creds(1)", "sysusers.d(5)"]
            .iter()
            .map(|s| (*s).to_owned()),
    );
    see_also(&mut roff, &pages);
    Extra {
        description: Some(description),
        sections: roff,
    }
}

/// What some commands' pages say beyond their options, by page: (heading, paragraphs). The
/// README says the same at more length.
const PAGE_SECTIONS: &[(&str, &str, &[&str])] = &[
    (
        "tombstoned-cleanup",
        "PROGRESS",
        &[
            PROGRESS,
            "The line shows rows tombstoned of those due when the run started, the rate, the \
             time elapsed and left, batches, lock timeouts and rows skipped so far; it stays at \
             its last state, and the report follows on standard output.",
        ],
    ),
    (
        "tombstoned-outbox-deliver",
        "PROGRESS",
        &[
            PROGRESS,
            "The line shows events attempted of those due when the run started (at most \
             --max-events), the rate, delivered, retries scheduled and dead letters.",
        ],
    ),
    (
        "tombstoned-migrate",
        "PROGRESS",
        &[
            PROGRESS,
            "The line shows the migration running and for how long; while it builds an index, \
             the build's phase and blocks (pg_stat_progress_create_index); otherwise the strong \
             table locks it holds and the lock it waits for, with the pid holding it up. It is \
             cleared when the migrations are applied.",
        ],
    ),
];

const PROGRESS: &str = "When standard error is a terminal, a live progress line is drawn there \
     while the command works. There is none when standard error is not a terminal, with --json, \
     under systemd (INVOCATION_ID or JOURNAL_STREAM set) or with --quiet: the logs and the report \
     are then exactly what they are without it. Standard output never carries it.";

/// Examples some commands' pages show, by page: (what it shows, the command). Each is a command
/// the README's samples run (`tests/it/doc_samples.rs` holds them to it), which also show its
/// output.
const EXAMPLES: &[(&str, &[(&str, &str)])] = &[(
    "tombstoned-keys-explain",
    &[
        (
            "What a retry of this order gets, and why (the README's \"Why did this key answer \
             that?\" shows the output):",
            "tombstoned --config /etc/tombstoned/tombstoned.toml keys explain --tenant acme \
             --principal alice --operation create-order --key checkout-42 --intent \
             '{\"request_id\": \"PR-42\", \"amount\": \"100.00\", \"item\": \"SKU-42\", \
             \"recipient\": \"Li Wei\"}'",
        ),
        (
            "Whether the key has a record in another operation (exit status 3 when it has none):",
            "tombstoned --config /etc/tombstoned/tombstoned.toml keys explain --tenant acme \
             --principal alice --operation refund --key checkout-42",
        ),
    ],
)];

/// A command's page points at the main page for what every command shares, and at its parent's
/// and its nested commands' pages (`related`, the main page first); some pages add sections of
/// their own ([`PAGE_SECTIONS`], [`EXAMPLES`]).
fn command_page(main: &str, page: &str, related: &[String]) -> Extra {
    let mut roff = Roff::new();
    for (_, title, paragraphs) in PAGE_SECTIONS.iter().filter(|(p, _, _)| *p == page) {
        heading(&mut roff, title);
        for text in *paragraphs {
            paragraph(&mut roff, text);
        }
    }
    for (_, examples) in EXAMPLES.iter().filter(|(p, _)| *p == page) {
        heading(&mut roff, "EXAMPLES");
        for (what, command) in *examples {
            paragraph(&mut roff, what);
            roff.control("PP", []);
            roff.control("nf", []);
            roff.text([roman(*command)]);
            roff.control("fi", []);
        }
    }
    heading(&mut roff, "EXIT STATUS");
    roff.text([
        roman("As for every command: see "),
        bold(main),
        roman("(8), which also lists the environment and the files."),
    ]);
    let pages: Vec<String> = related.iter().map(|page| format!("{page}(8)")).collect();
    see_also(&mut roff, &pages);
    Extra {
        description: None,
        sections: roff,
    }
}
