//! The dependency rules of ARCHITECTURE.md, checked on the source text of `src/` (no database,
//! no build of anything but this file: it reads the files).
//!
//! The rules, each with the reason it exists:
//!
//! 1. **`cli` and `stdout` are the edge.** Only `src/main.rs` and the files of `src/cli/` name
//!    the `cli` module or `stdout` (printing that a closed pipe ends quietly); everything else is
//!    called by it, never calls it (a service that imported `cli` made a circle: cli → cleanup →
//!    cli), and what it has to show it returns, or writes through what the edge gives it (the
//!    demo's story: `demo::Print`).
//! 2. **Services know nothing of the edge or of HTTP.** The files of `cleanup/`, `claim/`,
//!    `outbox/`, `lookup.rs`, `scheduler.rs`, `keys/` and `schema/` do not reach the crate modules `http`, `daemon`,
//!    `ops` or `cli`, nor the crate `axum`; and they never print (`print!`, `println!`,
//!    `eprint!`, `eprintln!`, `dbg!`, `stdout`, `stderr`): what they have to say is a return
//!    value or a `tracing` event, and the edge decides how it is shown.
//! 3. **SQL text lives in `sql` modules.** A string literal whose first word is an upper-case SQL
//!    command (`SELECT`, `INSERT`, `UPDATE`, `DELETE`, `WITH`, `CREATE`, `ALTER`, `DROP`,
//!    `TRUNCATE`, `LOCK`) followed by a blank or `(` is allowed only in files named `sql.rs`, in
//!    an inline `mod sql { … }` (`lookup.rs`), under `src/db/` (the shared statements and session
//!    checks) and in `src/demo.rs` (a scripted *client* that checks, as an operator would with
//!    psql, what the daemon wrote — not a statement of the product). The schema itself is in
//!    `migrations/` (and, as it stands, in `schema/`).
//!    Statements are written upper-case throughout the project; that convention is what makes
//!    this rule checkable (`"DELETE"` alone, an HTTP method's name, is not a statement).
//! 4. **The pure core stays pure.** `schedule`, `cleanup/keyset`, `fingerprint`, `money`,
//!    `order_request`, `auth`, `exit` and `toml_diagnostic` name none of the crates `tokio`,
//!    `tokio_postgres`, `deadpool_postgres`, `axum`, `hyper`, and of the crate's own modules
//!    only each other: they are unit-tested without a runtime or a database. So is `settings`,
//!    the leaf every settings section validates with.
//! 5. **No circles.** Between the top-level modules of `src/` (a folder counts as one module),
//!    and between the files of one folder (`cleanup/engine.rs` ↔ `cleanup/run.rs`), the
//!    references run one way: a circle is reported with the `file:line` of each of its edges.
//!    A folder's `mod.rs` is the folder itself, not one of its files (it declares and
//!    re-exports them). Test modules count too: a unit test takes what it needs from below.
//!    The benchmark's scenarios (`benches/scenarios/`) keep this rule as well.
//! 6. **Settings flow one way.** A settings type lives with the lowest module that reads it:
//!    the `[database]` section in `db/settings.rs` (the database layer opens sessions with it),
//!    every other section in `config/` (one file each), which also owns the file/env/flag
//!    merge and re-exports all of them. So `db/` never names `config`, and `config/` names of
//!    the crate only what sits below it (`db`, `settings`, `money`, `schedule`,
//!    `toml_diagnostic`): never a service, the composition or the edge.
//! 7. **One owner of the schema.** Only the files of `src/schema/` name the migration files (a
//!    string with `migrations/` in it: `include_str!`, `embed_migrations!`) and the migration
//!    library (`refinery`): which schema this binary needs, and how it gets there, is decided in
//!    one place, and everything else asks `schema::check` or calls `schema::migrate`.
//!
//! How: a small lexer blanks out comments and string literals (keeping the literals aside for
//! rule 3), so that a word in a doc comment or an error message never counts; module
//! references are read from paths (`crate::x`, `crate::{x, y}`, `super::x` resolved against the
//! file's own module path). The module graph of rule 5 is made of the same paths, followed to
//! their end (`crate::http::state::X` → `http`, then `http::state`), one graph per folder. The
//! `scanner` tests below show that every rule fails on a small broken fixture.

use std::path::{Path, PathBuf};

/// A source file as the rules see it.
struct Source {
    /// Path relative to `src/`, with `/` separators: `cleanup/run.rs`.
    path: String,
    /// The code with comments and the contents of string and char literals blanked out.
    code: String,
    /// The string literals: (offset in `code`, contents as written).
    strings: Vec<(usize, String)>,
}

impl Source {
    fn new(path: &str, text: &str) -> Self {
        let (code, strings) = lex(text);
        Source {
            path: path.to_owned(),
            code,
            strings,
        }
    }

    /// The module path of the file: `cleanup/run.rs` → [cleanup, run]; `cleanup/mod.rs` →
    /// [cleanup]; `lib.rs` and `main.rs` → [].
    fn module_path(&self) -> Vec<String> {
        let mut parts: Vec<String> = self
            .path
            .trim_end_matches(".rs")
            .split('/')
            .map(str::to_owned)
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        parts
    }

    fn line_of(&self, offset: usize) -> usize {
        self.code[..offset].matches('\n').count() + 1
    }

    fn under(&self, prefix: &str) -> bool {
        self.path == format!("{prefix}.rs") || self.path.starts_with(&format!("{prefix}/"))
    }
}

/// Splits Rust source into code (comments and literal contents replaced by blanks, newlines
/// kept so offsets map to the same lines) and its string literals with their offsets.
fn lex(text: &str) -> (String, Vec<(usize, String)>) {
    let chars: Vec<char> = text.chars().collect();
    let mut code = String::with_capacity(text.len());
    let mut strings = Vec::new();
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let prev_ident = i > 0 && is_ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                code.push(' ');
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    code.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    code.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    code.push(blank(chars[i]));
                    i += 1;
                }
            }
            continue;
        }
        // Raw strings: r"..", r#".."#, br#".."#.
        if !prev_ident && (c == 'r' || (c == 'b' && next == Some('r'))) {
            let start = if c == 'b' { i + 2 } else { i + 1 };
            let mut j = start;
            while chars.get(j) == Some(&'#') {
                j += 1;
            }
            if chars.get(j) == Some(&'"') {
                let hashes = j - start;
                let literal_at = code.len();
                let mut contents = String::new();
                code.extend(std::iter::repeat_n(' ', j + 1 - i));
                i = j + 1;
                while i < chars.len() {
                    if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
                        code.extend(std::iter::repeat_n(' ', hashes + 1));
                        i += hashes + 1;
                        break;
                    }
                    contents.push(chars[i]);
                    code.push(blank(chars[i]));
                    i += 1;
                }
                strings.push((literal_at, contents));
                continue;
            }
        }
        if c == '"' {
            let literal_at = code.len();
            let mut contents = String::new();
            code.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' && i + 1 < chars.len() {
                    contents.push(chars[i]);
                    code.push(' ');
                    i += 1;
                }
                contents.push(chars[i]);
                code.push(blank(chars[i]));
                i += 1;
            }
            code.push(' ');
            i += 1;
            strings.push((literal_at, contents));
            continue;
        }
        // Char literals ('x', '\n', '"'); a lifetime ('a) has no closing quote after one char.
        if c == '\'' {
            let len = if next == Some('\\') {
                (i + 2..chars.len())
                    .find(|&k| chars[k] == '\'')
                    .map(|k| k + 1 - i)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            if let Some(len) = len {
                code.extend(std::iter::repeat_n(' ', len));
                i += len;
                continue;
            }
        }
        code.push(c);
        i += 1;
    }
    (code, strings)
}

/// Identifiers of the code with their byte offsets.
fn identifiers(code: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in code
        .char_indices()
        .chain(std::iter::once((code.len(), ' ')))
    {
        let part = c.is_alphanumeric() || c == '_';
        match (start, part) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push((s, &code[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// What follows `offset` once blanks are skipped.
fn after(code: &str, offset: usize) -> &str {
    code[offset..].trim_start()
}

/// Inline modules (`mod tests { … }`) of the code: (start, end, name), so that `super::` inside
/// them resolves to the file's own module.
fn inline_modules(code: &str) -> Vec<(usize, usize, String)> {
    let ids = identifiers(code);
    let mut out = Vec::new();
    for pair in ids.windows(2) {
        let ((_, word), (name_at, name)) = (pair[0], pair[1]);
        let rest = after(code, name_at + name.len());
        if word != "mod" || !rest.starts_with('{') {
            continue;
        }
        let open = code.len() - rest.len();
        let mut depth = 0;
        for (i, c) in code[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        out.push((open, open + i, name.to_owned()));
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// The crate modules the file refers to, as absolute paths down to the first segment named after
/// the path root, with the offset of each reference: `crate::x::y` → [x]; `crate::{x, y::z}` →
/// [x], [y]; `super::x` in `cleanup/run.rs` → [cleanup, x]; `tombstoned::x` → [x]. Globs and
/// `self` add nothing.
fn crate_modules(src: &Source) -> Vec<(usize, Vec<String>)> {
    crate_paths(src, false)
}

/// The crate paths the file names, whole: `crate::http::c::X` → [http, c, X]; `super::{a::B,
/// c}` in `cleanup/run.rs` → [cleanup, a, B], [cleanup, c]. What the module graph is made of.
fn full_paths(src: &Source) -> Vec<(usize, Vec<String>)> {
    crate_paths(src, true)
}

fn crate_paths(src: &Source, whole: bool) -> Vec<(usize, Vec<String>)> {
    let code = &src.code;
    let inline = inline_modules(code);
    let ids = identifiers(code);
    let mut out = Vec::new();
    let mut k = 0;
    while k < ids.len() {
        let (offset, word) = ids[k];
        k += 1;
        let preceded_by_path = code[..offset].trim_end().ends_with("::");
        if preceded_by_path || !matches!(word, "crate" | "super" | "tombstoned") {
            continue;
        }
        let mut base: Vec<String> = Vec::new();
        if word == "super" {
            base = src.module_path();
            base.extend(
                inline
                    .iter()
                    .filter(|(start, end, _)| (*start..*end).contains(&offset))
                    .map(|(_, _, name)| name.clone()),
            );
            base.pop();
        }
        let mut rest = after(code, offset + word.len());
        while let Some(tail) = rest.strip_prefix("::") {
            let tail = tail.trim_start();
            if let Some(group) = tail.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    let mut path = base.clone();
                    for seg in item.split("::") {
                        let seg = seg.split_whitespace().next().unwrap_or("");
                        let ident =
                            !seg.is_empty() && seg.chars().all(|c| c.is_alphanumeric() || c == '_');
                        if !ident || seg == "self" {
                            break;
                        }
                        path.push(seg.to_owned());
                        if !whole {
                            break;
                        }
                    }
                    if path.len() > base.len() {
                        out.push((offset, path));
                    }
                }
                break;
            }
            let seg: String = tail
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if seg == "super" {
                base.pop();
                rest = after(tail, seg.len());
                continue;
            }
            if seg.is_empty() {
                if whole && base.len() > usize::from(word == "super") {
                    out.push((offset, base.clone()));
                }
                break;
            }
            base.push(seg.clone());
            if !whole {
                out.push((offset, base.clone()));
                break;
            }
            rest = after(tail, seg.len());
            if !rest.starts_with("::") {
                out.push((offset, base.clone()));
                break;
            }
        }
    }
    out
}

/// External crates or other path roots named as `name::…` (and macro calls `name!`).
fn path_roots(src: &Source) -> Vec<(usize, &str)> {
    identifiers(&src.code)
        .into_iter()
        .filter(|&(offset, word)| {
            !src.code[..offset].trim_end().ends_with("::")
                && after(&src.code, offset + word.len()).starts_with("::")
        })
        .collect()
}

const SQL_COMMANDS: &[&str] = &[
    "SELECT", "INSERT", "UPDATE", "DELETE", "WITH", "CREATE", "ALTER", "DROP", "TRUNCATE", "LOCK",
];

/// Whether a string literal's text is a SQL statement by rule 3.
fn is_sql(literal: &str) -> bool {
    // Leading blanks, escaped newlines/tabs and line continuations are not the statement.
    let mut text = literal;
    loop {
        let trimmed = text
            .trim_start()
            .trim_start_matches("\\n")
            .trim_start_matches("\\t")
            .trim_start_matches('\\');
        if trimmed.len() == text.len() {
            break;
        }
        text = trimmed;
    }
    SQL_COMMANDS.iter().any(|command| {
        text.strip_prefix(command)
            .and_then(|rest| rest.chars().next())
            .is_some_and(|c| c.is_whitespace() || c == '(' || c == '\\')
    })
}

const SERVICES: &[&str] = &[
    "cleanup",
    "claim",
    "outbox",
    "lookup",
    "scheduler",
    "conformance",
    "schema",
    "operations",
    "keys",
];
const EDGE_AND_HTTP: &[&str] = &["http", "daemon", "ops", "cli"];
const PURE_CORE: &[&str] = &[
    "schedule",
    "cleanup/keyset",
    "fingerprint",
    "money",
    "order_request",
    "auth",
    "exit",
    "toml_diagnostic",
    "settings",
];
const RUNTIME_CRATES: &[&str] = &[
    "tokio",
    "tokio_postgres",
    "deadpool_postgres",
    "axum",
    "hyper",
];
const EDGE: &[&str] = &["cli", "stdout"];
/// What `config/` may name of the crate besides itself (rule 6).
const BELOW_CONFIG: &[&str] = &["db", "settings", "money", "schedule", "toml_diagnostic"];
const PRINTING_MACROS: &[&str] = &["print", "println", "eprint", "eprintln", "dbg"];
/// The migration library (rule 7).
const MIGRATION_LIBRARY: &str = "refinery";

/// Every rule broken by the files, one line each (`path:line: what`).
fn violations(files: &[Source]) -> Vec<String> {
    let mut out = Vec::new();
    for src in files {
        let at = |offset: usize| format!("{}:{}", src.path, src.line_of(offset));

        // Rule 1.
        if src.path != "main.rs" && !src.under("cli") {
            let service = SERVICES.iter().any(|s| src.under(s));
            for (offset, module) in crate_modules(src) {
                // A service naming stdout is rule 2's (it prints), said once.
                let said_by_rule_2 = service && module[0] == "stdout";
                if EDGE.contains(&module[0].as_str()) && !said_by_rule_2 {
                    let module = &module[0];
                    out.push(format!(
                        "{}: imports {module}, the edge (only main.rs and cli/ may)",
                        at(offset)
                    ));
                }
            }
        }

        // Rule 6.
        if src.under("db") {
            for (offset, module) in crate_modules(src) {
                if module[0] == "config" {
                    out.push(format!(
                        "{}: db names config (settings flow one way: config composes db's \
                         section, db never reads config's)",
                        at(offset)
                    ));
                }
            }
        }
        if src.under("config") {
            for (offset, module) in crate_modules(src) {
                if module[0] != "config" && !BELOW_CONFIG.contains(&module[0].as_str()) {
                    let module = module.join("::");
                    out.push(format!(
                        "{}: config names {module}, which sits above it (settings flow one \
                         way: a section read by a service lives in config/, the service \
                         reads it)",
                        at(offset)
                    ));
                }
            }
        }

        // Rule 2.
        if SERVICES.iter().any(|s| src.under(s)) {
            for (offset, module) in crate_modules(src) {
                if EDGE_AND_HTTP.contains(&module[0].as_str()) {
                    let module = module.join("::");
                    out.push(format!("{}: a service imports {module}", at(offset)));
                }
            }
            for (offset, root) in path_roots(src) {
                if root == "axum" {
                    out.push(format!("{}: a service imports axum", at(offset)));
                }
            }
            for (offset, word) in identifiers(&src.code) {
                let printing = (PRINTING_MACROS.contains(&word)
                    && after(&src.code, offset + word.len()).starts_with('!'))
                    || word == "stdout"
                    || word == "stderr";
                if printing {
                    out.push(format!("{}: a service prints ({word})", at(offset)));
                }
            }
        }

        // Rule 3.
        let file_allowed = src.path.ends_with("/sql.rs")
            || src.path == "sql.rs"
            || src.under("db")
            || src.path == "demo.rs";
        let sql_modules: Vec<_> = inline_modules(&src.code)
            .into_iter()
            .filter(|(_, _, name)| name == "sql")
            .collect();
        for (offset, literal) in &src.strings {
            let in_sql_module = sql_modules
                .iter()
                .any(|(start, end, _)| (*start..*end).contains(offset));
            if !file_allowed && !in_sql_module && is_sql(literal) {
                let first: String = literal.trim().chars().take(40).collect();
                out.push(format!(
                    "{}: SQL outside a sql module: \"{first}…\"",
                    at(*offset)
                ));
            }
        }

        // Rule 4.
        if PURE_CORE.iter().any(|p| src.path == format!("{p}.rs")) {
            for (offset, root) in path_roots(src) {
                if RUNTIME_CRATES.contains(&root) {
                    out.push(format!("{}: pure core names {root}", at(offset)));
                }
            }
            let own = src.module_path();
            for (offset, module) in crate_modules(src) {
                let inside_itself = module.starts_with(&own);
                let pure = PURE_CORE
                    .iter()
                    .any(|p| module.join("/") == *p || (module.len() == 1 && module[0] == *p));
                if !inside_itself && !pure {
                    let module = module.join("::");
                    out.push(format!(
                        "{}: pure core imports {module}, which is not pure core",
                        at(offset)
                    ));
                }
            }
        }

        // Rule 7.
        if !src.under("schema") {
            for (offset, root) in path_roots(src) {
                if root == MIGRATION_LIBRARY {
                    out.push(format!(
                        "{}: names {MIGRATION_LIBRARY}, the migration library (only schema/ may)",
                        at(offset)
                    ));
                }
            }
            for (offset, literal) in &src.strings {
                if literal.contains("migrations/") {
                    out.push(format!(
                        "{}: names the migration files (\"{literal}\"; only schema/ may)",
                        at(*offset)
                    ));
                }
            }
        }
    }
    // Rule 5.
    out.extend(circle_violations(files));
    out
}

/// Where one module names another: the first reference in file order, for the report.
type Edges = std::collections::BTreeMap<(Vec<String>, Vec<String>), String>;

/// The module graph, one per directory: for each file and each directory above it, an edge from
/// the file's entry in that directory (a file or a folder) to the entry a `crate::`/`super::`
/// path it names leads to in the same directory, when they differ. Paths that end in an item
/// (`super::RunReport`) stop at the module that holds it; `mod.rs` is its folder, not an entry
/// among its files (it declares and re-exports them). Keyed by (from, to), valued by the
/// `file:line` of the first reference.
fn module_edges(files: &[Source]) -> Edges {
    // Every file's module and the folders above it.
    let modules: std::collections::BTreeSet<Vec<String>> = files
        .iter()
        .flat_map(|f| {
            let path = f.module_path();
            (1..=path.len()).map(move |n| path[..n].to_vec())
        })
        .collect();
    let mut edges = Edges::new();
    for src in files {
        let own = src.module_path();
        for (offset, target) in full_paths(src) {
            for level in 0..own.len() {
                let (from, to) = (&own[..=level], target.get(..=level));
                let Some(to) = to else { break };
                if own[..level] != target[..level] {
                    break;
                }
                if from != to && modules.contains(to) {
                    edges
                        .entry((from.to_vec(), to.to_vec()))
                        .or_insert_with(|| format!("{}:{}", src.path, src.line_of(offset)));
                }
            }
        }
    }
    edges
}

/// Every circle of the module graph, shortest first from each module, each once: the modules
/// in order with the `file:line` of each edge.
fn circles(edges: &Edges) -> Vec<Vec<(Vec<String>, String)>> {
    let nodes: std::collections::BTreeSet<&Vec<String>> =
        edges.keys().map(|(from, _)| from).collect();
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for &start in &nodes {
        // Breadth first from `start` back to itself: the shortest circle through it.
        let mut previous: std::collections::BTreeMap<&Vec<String>, &Vec<String>> =
            std::collections::BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        while let Some(node) = queue.pop_front() {
            for (from, to) in edges.keys().filter(|(from, _)| from == node) {
                if to == start {
                    closing = Some(from);
                    break;
                }
                if !previous.contains_key(to) {
                    previous.insert(to, from);
                    queue.push_back(to);
                }
            }
            if closing.is_some() {
                break;
            }
        }
        let Some(mut node) = closing else { continue };
        let mut path = vec![node];
        while node != start {
            node = previous[node];
            path.push(node);
        }
        path.reverse();
        let mut key: Vec<&Vec<String>> = path.clone();
        key.sort();
        if !seen.insert(key) {
            continue;
        }
        let circle = path
            .iter()
            .enumerate()
            .map(|(i, &from)| {
                let to = path[(i + 1) % path.len()];
                (from.clone(), edges[&(from.clone(), to.clone())].clone())
            })
            .collect();
        out.push(circle);
    }
    out
}

/// Rule 5: no circle between the modules of one directory, as `path:line: what` lines.
fn circle_violations(files: &[Source]) -> Vec<String> {
    circles(&module_edges(files))
        .into_iter()
        .map(|circle| {
            let names: Vec<String> = circle.iter().map(|(m, _)| m.join("::")).collect();
            let steps: Vec<String> = circle
                .iter()
                .enumerate()
                .map(|(i, (m, at))| {
                    let to = &names[(i + 1) % names.len()];
                    format!("{} -> {to} at {at}", m.join("::"))
                })
                .collect();
            format!(
                "{}: a circle of modules {} -> {}: {}",
                circle[0].1,
                names.join(" -> "),
                names[0],
                steps.join(", ")
            )
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `.rs` file below `dir` of the repository, by path relative to it.
fn sources(dir: &str) -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut paths = Vec::new();
    rust_files(&root, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|p| {
            let relative = p
                .strip_prefix(&root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            Source::new(&relative, &std::fs::read_to_string(p).unwrap())
        })
        .collect()
}

#[test]
fn src_keeps_the_dependency_rules() {
    let files = sources("src");
    // The scan saw the tree it is meant to guard (a wrong root would pass vacuously).
    for expected in [
        "main.rs",
        "cli/mod.rs",
        "cleanup/run.rs",
        "claim/sql.rs",
        "exit.rs",
        "schema/migrations.rs",
    ] {
        assert!(
            files.iter().any(|f| f.path == expected),
            "{expected} not scanned"
        );
    }
    let broken = violations(&files);
    assert!(
        broken.is_empty(),
        "ARCHITECTURE.md's rules are broken:\n{}",
        broken.join("\n")
    );
}

/// The benchmark's scenarios (`benches/scenarios/`, a crate of their own) keep rule 5 too: no
/// circle between their modules.
#[test]
fn the_benchmark_has_no_circles() {
    let files = sources("benches/scenarios");
    assert!(
        files.iter().any(|f| f.path == "api_limit.rs"),
        "benches/scenarios not scanned"
    );
    let circles = circle_violations(&files);
    assert!(
        circles.is_empty(),
        "the benchmark's modules form circles:\n{}",
        circles.join("\n")
    );
}

/// The rules fail on small broken fixtures, so a pass on `src/` means something.
mod scanner {
    use super::*;

    fn check(path: &str, text: &str) -> Vec<String> {
        violations(&[Source::new(path, text)])
    }

    #[test]
    fn lexer_keeps_comments_and_strings_out_of_the_code() {
        let src = Source::new(
            "x.rs",
            "// crate::cli in a comment\nlet a = \"crate::cli \\\" still\"; /* println!( */\n\
             let c = '\"'; let r = r#\"a \"quoted\" b\"#; fn f<'a>(x: &'a str) {}\n",
        );
        assert!(!src.code.contains("cli"), "{}", src.code);
        assert!(!src.code.contains("println"));
        assert!(src.code.contains("fn f<'a>(x: &'a str)"), "{}", src.code);
        let texts: Vec<&str> = src.strings.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(texts, ["crate::cli \\\" still", "a \"quoted\" b"]);
        assert_eq!(src.line_of(src.code.find("let c").unwrap()), 3);
        assert_eq!(src.line_of(src.strings[1].0), 3);
    }

    #[test]
    fn cli_imported_outside_main_fails() {
        assert_eq!(check("daemon.rs", "use crate::cli::Exit;").len(), 1);
        assert_eq!(check("daemon.rs", "use crate::{db, cli::Exit};").len(), 1);
        assert_eq!(check("cleanup/run.rs", "use super::super::cli;").len(), 2);
        assert_eq!(check("daemon.rs", "fn f() { crate::cli::run() }").len(), 1);
        // Allowed: main.rs, cli itself, and a mention that is not a path.
        assert!(check("main.rs", "use tombstoned::cli;").is_empty());
        assert!(check("cli/cleanup.rs", "use crate::cli::Exit; use super::Cli;").is_empty());
        assert!(check("daemon.rs", "// crate::cli\nlet s = \"crate::cli\";").is_empty());
    }

    #[test]
    fn a_service_importing_http_or_printing_fails() {
        assert_eq!(
            check("cleanup/engine.rs", "use crate::http::AppState;").len(),
            1
        );
        assert_eq!(check("claim/mod.rs", "use crate::{db, ops};").len(), 1);
        assert_eq!(check("lookup.rs", "use axum::Json;").len(), 1);
        assert_eq!(
            check("scheduler.rs", "fn f() { crate::daemon::x() }").len(),
            1
        );
        assert_eq!(
            check("cleanup/run.rs", "fn f() { println!(\"x\"); }").len(),
            1
        );
        assert_eq!(check("cleanup/run.rs", "fn f() { dbg!(1); }").len(), 1);
        assert_eq!(
            check(
                "claim/sql.rs",
                "use std::io::Write; fn f() { std::io::stdout(); }"
            )
            .len(),
            1
        );
        assert_eq!(check("cleanup/run.rs", "use crate::stdout;").len(), 1);
        // Allowed: the services' own modules, the foundation, and http importing a service.
        assert!(check("cleanup/run.rs", "use super::engine; use crate::db;").is_empty());
        assert!(check("http/handlers.rs", "use crate::claim; use axum::Json;").is_empty());
        assert!(check("cleanup/run.rs", "tracing::info!(\"printed? no\");").is_empty());
    }

    #[test]
    fn sql_outside_sql_modules_fails() {
        assert_eq!(
            check("cleanup/run.rs", "const Q: &str = \"SELECT 1 FROM t\";").len(),
            1
        );
        assert_eq!(
            check(
                "outbox/inspect.rs",
                "tx.query(\"\\n  UPDATE t SET a = 1\", &[])"
            )
            .len(),
            1
        );
        assert_eq!(
            check(
                "claim/mod.rs",
                "const Q: &str = r#\"WITH x AS (SELECT 1) SELECT * FROM x\"#;"
            )
            .len(),
            1
        );
        assert_eq!(
            check("daemon.rs", "format!(\"CREATE SCHEMA \\\"{}\\\"\", s)").len(),
            1
        );
        assert_eq!(
            check("lookup.rs", "mod sqlx { const Q: &str = \"SELECT 1\"; }").len(),
            1
        );
        // Allowed: sql.rs, an inline `mod sql`, db/, the demo; words that are not statements.
        assert!(check(
            "lookup.rs",
            "pub mod sql { pub const Q: &str = \"SELECT 1\"; }"
        )
        .is_empty());
        assert!(check("cleanup/sql.rs", "const Q: &str = \"SELECT 1\";").is_empty());
        assert!(check("db/session.rs", "\"SELECT pg_backend_pid()\"").is_empty());
        assert!(check("demo.rs", "\"SELECT count(*) FROM orders\"").is_empty());
        assert!(check("http/middleware.rs", "Method::DELETE => \"DELETE\",").is_empty());
        assert!(check("cli/mod.rs", "\"Selected rows\"; \"WITHOUT\"").is_empty());
    }

    #[test]
    fn pure_core_naming_the_runtime_fails() {
        assert_eq!(check("money.rs", "use tokio::sync::Mutex;").len(), 1);
        assert_eq!(
            check("schedule.rs", "fn f(c: &tokio_postgres::Client) {}").len(),
            1
        );
        assert_eq!(check("order_request.rs", "use axum::Json;").len(), 1);
        assert_eq!(check("exit.rs", "#[tokio::test] async fn t() {}").len(), 1);
        assert_eq!(check("auth.rs", "use crate::db::ErrorClass;").len(), 1);
        assert_eq!(check("cleanup/keyset.rs", "use super::sql;").len(), 1);
        assert!(check(
            "cleanup/keyset.rs",
            "mod tests { use super::*; use super::Cursor; }"
        )
        .is_empty());
        assert_eq!(check("cleanup/keyset.rs", "use crate::metrics;").len(), 1);
        // Allowed: other pure-core modules, other crates, the words in text.
        assert!(check("auth.rs", "use crate::money::{self, Currency};").is_empty());
        assert!(check("fingerprint.rs", "use sha2::Sha256; // tokio::spawn").is_empty());
        assert!(check("money.rs", "\"tokio::x\"").is_empty());
    }

    fn check_files(files: &[(&str, &str)]) -> Vec<String> {
        let files: Vec<Source> = files.iter().map(|(p, t)| Source::new(p, t)).collect();
        violations(&files)
    }

    #[test]
    fn a_circle_between_top_level_modules_fails_naming_each_edge() {
        let broken = check_files(&[
            ("config/mod.rs", "use crate::db::settings::DatabaseConfig;"),
            ("db/settings.rs", "\nfn f() {}"),
            ("db/migrations.rs", "\n\nuse crate::config::Config;"),
            (
                "metrics.rs",
                "use crate::outbox::policy::DELIVERY_OUTCOMES;",
            ),
            ("outbox/relay.rs", "use crate::metrics::Metrics;"),
        ]);
        let circles: Vec<&String> = broken.iter().filter(|b| b.contains("circle")).collect();
        assert_eq!(circles.len(), 2, "{broken:#?}");
        assert!(
            circles
                .iter()
                .any(|c| c.contains("config -> db at config/mod.rs:1")
                    && c.contains("db -> config at db/migrations.rs:3")),
            "{circles:#?}"
        );
        assert!(
            circles
                .iter()
                .any(|c| c.contains("metrics -> outbox at metrics.rs:1")
                    && c.contains("outbox -> metrics at outbox/relay.rs:1")),
            "{circles:#?}"
        );
        // One way is fine; so is a file naming its own folder's items and a mod.rs its files.
        assert!(check_files(&[
            ("config/mod.rs", "use crate::db::settings::DatabaseConfig;"),
            ("db/settings.rs", "use crate::settings::Problems;"),
            ("settings.rs", "fn f() {}"),
            (
                "outbox/relay.rs",
                "use crate::metrics::Metrics; use crate::config::Config;"
            ),
            (
                "metrics.rs",
                "#[cfg(test)] mod tests { use crate::config::Config; }"
            ),
        ])
        .is_empty());
    }

    #[test]
    fn a_circle_inside_a_folder_fails_naming_each_edge() {
        let broken = check_files(&[
            ("cleanup/engine.rs", "use super::run::RunLimits;"),
            (
                "cleanup/run.rs",
                "use super::engine::Engine;\nuse super::workers::Crew;",
            ),
            ("cleanup/workers.rs", "use super::{engine::Team, run};"),
        ]);
        assert_eq!(broken.len(), 2, "{broken:#?}");
        assert!(broken
            .iter()
            .any(|b| b.starts_with("cleanup/engine.rs:1: a circle")
                && b.contains("cleanup::engine -> cleanup::run at cleanup/engine.rs:1")
                && b.contains("cleanup::run -> cleanup::engine at cleanup/run.rs:1")));
        assert!(broken.iter().any(|b| b
            .contains("cleanup::run -> cleanup::workers at cleanup/run.rs:2")
            && b.contains("cleanup::workers -> cleanup::run at cleanup/workers.rs:1")));
        // A longer circle is found too, once.
        let three = check_files(&[
            ("http/a.rs", "use super::b;"),
            ("http/b.rs", "use crate::http::c::X;"),
            ("http/c.rs", "use super::a::Y;"),
        ]);
        assert_eq!(three.len(), 1, "{three:#?}");
        assert!(
            three[0].contains("http::c -> http::a at http/c.rs:1"),
            "{three:#?}"
        );
        // The run composing the engine and the workers, every file naming mod.rs' items and
        // mod.rs re-exporting its files: no circle.
        assert!(check_files(&[
            (
                "cleanup/mod.rs",
                "pub use crate::cleanup::run::run_once; use crate::db;"
            ),
            ("cleanup/engine.rs", "use super::{sql, CleanupError};"),
            (
                "cleanup/run.rs",
                "use super::engine::{Engine, RunLimits}; use super::workers;"
            ),
            (
                "cleanup/workers.rs",
                "use super::engine::Team; use super::CleanupError;"
            ),
            ("cleanup/sql.rs", ""),
        ])
        .is_empty());
    }

    #[test]
    fn settings_flowing_the_other_way_fail() {
        assert_eq!(
            check("db/mod.rs", "use crate::config::DatabaseConfig;").len(),
            1
        );
        assert_eq!(
            check("db/migrations.rs", "fn f(c: &crate::config::Config) {}").len(),
            1
        );
        assert_eq!(
            check("config/cleanup.rs", "use crate::cleanup::RunReport;").len(),
            1
        );
        assert_eq!(
            check("config/mod.rs", "use crate::{db, outbox::policy};").len(),
            1
        );
        assert_eq!(
            check("config/merge.rs", "use crate::daemon::serve;").len(),
            1
        );
        assert_eq!(check("settings.rs", "use crate::db::Pooler;").len(), 1);
        // Allowed: config composing db's section with the leaf and the pure core; services
        // reading config.
        assert!(check(
            "config/mod.rs",
            "use crate::db::settings::{self, DatabaseConfig}; use crate::settings::Problems;\n\
             use crate::money::Currency; use crate::schedule::Schedule; use self::api::X;"
        )
        .is_empty());
        assert!(check(
            "db/settings.rs",
            "use crate::settings::{ConfigError, Problems};"
        )
        .is_empty());
        assert!(check(
            "cleanup/run.rs",
            "use crate::config::{CleanupConfig, DatabaseConfig};"
        )
        .is_empty());
    }

    #[test]
    fn naming_the_migrations_outside_schema_fails() {
        assert_eq!(
            check(
                "db/mod.rs",
                "mod m { refinery::embed_migrations!(\"migrations\"); }"
            )
            .len(),
            1
        );
        assert_eq!(check("daemon.rs", "use refinery::Runner;").len(), 1);
        assert_eq!(
            check(
                "sql_api.rs",
                "const V4: &str = include_str!(\"../migrations/V4__sql_api.sql\");"
            )
            .len(),
            1
        );
        // Allowed: schema/ itself; the word in a comment, or the schema's module named.
        assert!(check(
            "schema/migrations.rs",
            "mod e { refinery::embed_migrations!(\"migrations\"); } \
             const F: &str = include_str!(\"../../migrations/V1__x.sql\");"
        )
        .is_empty());
        assert!(check(
            "daemon.rs",
            "// migrations/V7\nuse crate::schema::migrations; fn f() { schema::migrate(); }"
        )
        .is_empty());
    }

    #[test]
    fn the_demo_reaching_into_the_edge_fails() {
        assert_eq!(
            check("demo.rs", "use crate::stdout::{self, StdoutError};").len(),
            1
        );
        assert_eq!(
            check("daemon.rs", "fn f() { crate::stdout::print(\"x\") }").len(),
            1
        );
        // Said once for a service (rule 2: it prints).
        assert_eq!(check("cleanup/run.rs", "use crate::stdout;").len(), 1);
        // Allowed: the edge itself, and the demo writing through what it is given.
        assert!(check("cli/demo.rs", "use crate::stdout; use crate::demo;").is_empty());
        assert!(check(
            "demo.rs",
            "pub type Print = fn(&str) -> anyhow::Result<()>;"
        )
        .is_empty());
    }
}
