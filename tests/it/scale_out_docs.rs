//! docs/scale-out.md's Citus plan lists what it must change, and the lists are complete (issue
//! 42 items 2 and 11, "Keep them true"): its table of unique constraints and foreign keys is the
//! catalogue's (a migrated database's, read here), each marked as led by `tenant_id` or not,
//! and its table of locking statements is every SQL constant of `src/` with a row-locking clause,
//! each with the clauses it has, exactly as written. A new constraint, a new locking statement or
//! a changed clause fails here until the page says what it means for Citus.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use regex::Regex;

use crate::harness::TestDb;
use crate::ops_support::repo_root;

fn page() -> String {
    std::fs::read_to_string(repo_root().join("docs/scale-out.md")).unwrap()
}

/// The rows of the Markdown table right after the line `<!-- list: NAME -->`, as cells.
fn table(text: &str, name: &str) -> Vec<Vec<String>> {
    let marker = format!("<!-- list: {name} -->\n");
    let after = text
        .split(&marker)
        .nth(1)
        .unwrap_or_else(|| panic!("docs/scale-out.md has no line {marker:?}"));
    after
        .lines()
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The `code spans` of a cell.
fn spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// (kind, table, columns) of every primary key, unique constraint, unique index and foreign
/// key of the product's tables, by name.
async fn catalogue() -> BTreeMap<String, (String, String, Vec<String>)> {
    let db = TestDb::new().await;
    let client = db.client().await;
    let schema = db.config().database.schema;
    let rows = client
        .query(
            "WITH keys AS (
                 SELECT i.relname AS name, x.indrelid AS rel, x.indkey::int2[] AS columns,
                        CASE c.contype WHEN 'p' THEN 'primary key' WHEN 'u' THEN 'unique'
                                       ELSE 'unique index' END AS kind
                 FROM pg_index x
                 JOIN pg_class i ON i.oid = x.indexrelid
                 LEFT JOIN pg_constraint c
                        ON c.conindid = x.indexrelid AND c.contype IN ('p', 'u')
                 WHERE x.indisunique
                 UNION ALL
                 SELECT conname, conrelid, conkey, 'foreign key'
                 FROM pg_constraint WHERE contype = 'f'
             )
             SELECT k.name::text, t.relname::text, k.kind,
                    array(SELECT a.attname::text
                          FROM unnest(k.columns) WITH ORDINALITY AS n(attnum, position)
                          JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = n.attnum
                          ORDER BY n.position)
             FROM keys k
             JOIN pg_class t ON t.oid = k.rel
             JOIN pg_namespace s ON s.oid = t.relnamespace
             WHERE s.nspname = $1",
            &[&schema],
        )
        .await
        .unwrap();
    rows.iter()
        .map(|r| (r.get(0), (r.get(2), r.get(1), r.get(3))))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_citus_constraint_list_is_the_catalogues() {
    let catalogue = catalogue().await;
    let text = page();
    let mut listed = BTreeMap::new();
    let mut problems = Vec::new();
    for row in table(&text, "citus-constraints") {
        let [name, kind, table, columns, led, ..] = row.as_slice() else {
            problems.push(format!("a row without its five cells: {row:?}"));
            continue;
        };
        let name = spans(name).concat();
        let columns: Vec<String> = columns
            .trim_matches(|c| c == '`' || c == '(' || c == ')')
            .split(", ")
            .map(str::to_owned)
            .collect();
        listed.insert(
            name,
            (kind.clone(), spans(table).concat(), columns, led.clone()),
        );
    }
    for (name, (kind, table, columns)) in &catalogue {
        let led = if columns.first().map(String::as_str) == Some("tenant_id") {
            "yes"
        } else {
            "no"
        };
        match listed.remove(name) {
            None => problems.push(format!(
                "not listed: | `{name}` | {kind} | `{table}` | `({})` | {led} |",
                columns.join(", ")
            )),
            Some((k, t, c, l)) => {
                if (&k, &t, &c, l.as_str()) != (kind, table, columns, led) {
                    problems.push(format!(
                        "`{name}` listed as {k}, `{t}`, {c:?}, led by tenant_id: {l}; the \
                         catalogue has {kind}, `{table}`, {columns:?}, {led}"
                    ));
                }
            }
        }
    }
    for name in listed.keys() {
        problems.push(format!("listed, but not in the catalogue: `{name}`"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The row-locking clauses (`FOR UPDATE`, `FOR NO KEY UPDATE`, `FOR SHARE`, `FOR KEY SHARE`,
/// with `SKIP LOCKED` or `NOWAIT`) of every `const NAME: &str` of `src/`, by its path
/// (`claim::sql::READ_FOR_REPLAY`): the string literals of the constant and of the macros of its
/// file it invokes (`concat!(existing_cte!(), ...)`), however deep.
fn locking_statements() -> BTreeMap<String, BTreeSet<String>> {
    let clause = Regex::new(
        r"\bFOR\s+(?:NO\s+KEY\s+UPDATE|KEY\s+SHARE|UPDATE|SHARE)(?:\s+(?:SKIP\s+LOCKED|NOWAIT))?\b",
    )
    .unwrap();
    let constant = Regex::new(
        r"(?m)^\s*(?:pub(?:\([a-z]+\))?\s+)?const\s+([A-Z0-9_]+)\s*:\s*&(?:'static\s+)?str\s*=",
    )
    .unwrap();
    let macro_def = Regex::new(r"macro_rules!\s*([a-z_0-9]+)\s*\{").unwrap();
    let invocation = Regex::new(r"\b([a-z_0-9]+)!\s*\(").unwrap();
    let mut found = BTreeMap::new();
    let mut files = vec![repo_root().join("src")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let macros: BTreeMap<String, &str> = macro_def
            .captures_iter(&text)
            .map(|c| {
                let body_start = c.get(0).unwrap().end();
                (c[1].to_owned(), item(&text[body_start..], '}'))
            })
            .collect();
        for c in constant.captures_iter(&text) {
            let mut literals = Vec::new();
            let mut pending = vec![item(&text[c.get(0).unwrap().end()..], ';')];
            let mut expanded = BTreeSet::new();
            while let Some(code) = pending.pop() {
                literals.extend(string_literals(code));
                for call in invocation.captures_iter(code) {
                    if let Some(body) = macros.get(&call[1]) {
                        if expanded.insert(call[1].to_owned()) {
                            pending.push(body);
                        }
                    }
                }
            }
            let clauses: BTreeSet<String> = literals
                .iter()
                .flat_map(|l| clause.find_iter(l).map(|m| words(m.as_str())))
                .collect();
            if !clauses.is_empty() {
                found.insert(format!("{}::{}", module_path(&path), &c[1]), clauses);
            }
        }
    }
    found
}

/// `text` up to the first `end` outside string literals and brackets (the end of a `const`
/// item at `;`, of a macro's body at its closing `}`).
fn item(text: &str, end: char) -> &str {
    let bytes = text.as_bytes();
    let mut depth = 0i32;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' | b'r' if literal_at(text, i).is_some() => {
                i += literal_at(text, i).map_or(1, |(_, len)| len);
                continue;
            }
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth > 0 => depth -= 1,
            b if b == end as u8 && depth == 0 => return &text[..i],
            _ => {}
        }
        i += 1;
    }
    text
}

/// The string literal starting at byte `i` (`"..."` or `r#"..."#`): its contents, its length.
fn literal_at(text: &str, i: usize) -> Option<(String, usize)> {
    let rest = &text[i..];
    if let Some(raw) = rest.strip_prefix('r') {
        if text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            return None; // the end of an identifier (`for`), not a raw string
        }
        let hashes = raw.len() - raw.trim_start_matches('#').len();
        let body = raw[hashes..].strip_prefix('"')?;
        let close = format!("\"{}", "#".repeat(hashes));
        let end = body.find(&close)?;
        return Some((body[..end].to_owned(), 1 + hashes + 1 + end + close.len()));
    }
    let body = rest.strip_prefix('"')?;
    let mut escaped = false;
    for (n, ch) in body.char_indices() {
        match ch {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => {
                // A `\` at a line's end continues the literal on the next line, without the
                // break and the indentation.
                let contents = continuation().replace_all(&body[..n], "").into_owned();
                return Some((contents, 1 + n + 1));
            }
            _ => {}
        }
    }
    None
}

/// A `\` at a line's end inside a string literal, with the indentation after it.
fn continuation() -> &'static Regex {
    static CONTINUATION: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    CONTINUATION.get_or_init(|| Regex::new(r"\\\n\s*").unwrap())
}

/// The string literals of `code`, skipping `//` comments.
fn string_literals(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < code.len() {
        if code[i..].starts_with("//") {
            i += code[i..].find('\n').unwrap_or(code.len() - i);
            continue;
        }
        if let Some((contents, len)) = literal_at(code, i) {
            out.push(contents);
            i += len;
            continue;
        }
        i += code[i..].chars().next().map_or(1, char::len_utf8);
    }
    out
}

/// `FOR  NO KEY\n UPDATE` → `FOR NO KEY UPDATE`.
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `src/claim/sql.rs` → `claim::sql`; `src/cleanup/mod.rs` → `cleanup`.
fn module_path(path: &Path) -> String {
    let relative = path.strip_prefix(repo_root().join("src")).unwrap();
    let mut parts: Vec<String> = relative
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

#[test]
fn the_citus_locking_statement_list_is_srcs() {
    let found = locking_statements();
    // The scanner itself: the statements the protocol and the cleaner are known to lock with.
    for (name, clause) in [
        ("claim::sql::READ_FOR_REPLAY", "FOR SHARE"),
        (
            "cleanup::sql::TOMBSTONE_BATCH_SKIP_LOCKED",
            "FOR NO KEY UPDATE SKIP LOCKED",
        ),
        ("outbox::sql::PICK", "FOR UPDATE SKIP LOCKED"),
    ] {
        assert!(
            found.get(name).is_some_and(|c| c.contains(clause)),
            "the scan missed {name}'s {clause}: {found:?}"
        );
    }
    assert!(
        !found.contains_key("cleanup::sql::TOMBSTONE_BATCH"),
        "the waiting batch has no locking clause: {found:?}"
    );
    let text = page();
    let mut listed = BTreeMap::new();
    let mut problems = Vec::new();
    for row in table(&text, "citus-locking") {
        let [name, clauses, ..] = row.as_slice() else {
            problems.push(format!("a row without its cells: {row:?}"));
            continue;
        };
        let clauses: BTreeSet<String> = spans(clauses).into_iter().collect();
        listed.insert(spans(name).concat(), clauses);
    }
    for (name, clauses) in &found {
        match listed.remove(name) {
            None => problems.push(format!("not listed: `{name}` ({clauses:?})")),
            Some(l) if &l != clauses => problems.push(format!(
                "`{name}` listed with {l:?}; its SQL has {clauses:?}"
            )),
            Some(_) => {}
        }
    }
    for name in listed.keys() {
        problems.push(format!(
            "listed, but no locking statement of src/: `{name}`"
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
