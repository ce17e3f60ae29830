//! TOML errors told without the document: where (line, column, key) and what kind of mistake,
//! never the offending text or value. The configuration file holds the database password and the
//! tokens file sits next to bearer tokens; the TOML crate's own message quotes the whole line
//! (and serde's quotes the value), so neither is ever shown as is.

use std::fmt;

/// Which reading of the document failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Parsing the TOML syntax: the parser's messages come from its grammar and name no input.
    Syntax,
    /// Reading the parsed values into typed settings: serde's messages quote values.
    Types,
}

/// A TOML error, described without the text of the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TomlProblem {
    /// 1-based line, when the error points into the document.
    pub line: Option<usize>,
    /// 1-based column (characters), with `line`.
    pub column: Option<usize>,
    /// The dotted key concerned, when known.
    pub key: Option<String>,
    /// What kind of mistake it is (never a value).
    pub what: String,
}

impl fmt::Display for TomlProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut wrote = false;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, "line {line}, column {column}")?;
            wrote = true;
        }
        if let Some(key) = &self.key {
            if wrote {
                f.write_str(", ")?;
            }
            write!(f, "key `{key}`")?;
            wrote = true;
        }
        if wrote {
            f.write_str(": ")?;
        }
        f.write_str(&self.what)
    }
}

/// Describes `error`, raised at `stage` while reading `document` (pass the document only when the
/// error's span points into it).
pub fn describe(error: &toml::de::Error, document: Option<&str>, stage: Stage) -> TomlProblem {
    let position = match (document, error.span()) {
        (Some(text), Some(span)) => Some((text, span.start)),
        _ => None,
    };
    let (line, column) = match position {
        Some((text, offset)) => match line_and_column(text, offset) {
            Some((l, c)) => (Some(l), Some(c)),
            None => (None, None),
        },
        None => (None, None),
    };
    let key = match position {
        Some((text, offset)) => key_at(text, offset),
        None => key_path(error),
    };
    TomlProblem {
        line,
        column,
        key,
        what: kind_of(error.message(), stage),
    }
}

/// The mistake's kind, from the message's shape; values are cut out, and a message of a shape not
/// known here is replaced rather than trusted.
fn kind_of(message: &str, stage: Stage) -> String {
    if let Some(rest) = message.strip_prefix("invalid type: ") {
        return format!("wrong type: {}", found_expected(rest));
    }
    if let Some(rest) = message.strip_prefix("invalid value: ") {
        return format!("invalid value: {}", found_expected(rest));
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        return match rest.rfind(", expected ") {
            Some(i) => format!("not one of the accepted values ({})", &rest[i + 2..]),
            None => "not one of the accepted values".to_owned(),
        };
    }
    // These quote a key (the document's or the program's), never a value.
    for shape in [
        "unknown field `",
        "missing field `",
        "duplicate field `",
        "duplicate key `",
        "invalid length ",
    ] {
        if message.starts_with(shape) {
            return one_line(message);
        }
    }
    match stage {
        // The parser describes its grammar ("invalid basic string", "expected `.`, `=`").
        Stage::Syntax => one_line(message),
        Stage::Types => "invalid value".to_owned(),
    }
}

/// `string "s3cret", expected i64` → `found a string, expected i64`: serde quotes the value
/// after its type (`string "..."`, ``integer `5` ``), so everything from the first quote goes.
fn found_expected(rest: &str) -> String {
    let (found, expected) = match rest.rfind(", expected ") {
        Some(i) => (&rest[..i], Some(&rest[i + ", expected ".len()..])),
        None => (rest, None),
    };
    let found = found
        .find(['"', '`', '\''])
        .map_or(found, |i| &found[..i])
        .trim();
    match (found.is_empty(), expected) {
        (false, Some(expected)) => format!("found {found}, expected {}", one_line(expected)),
        (true, Some(expected)) => format!("expected {}", one_line(expected)),
        (false, None) => format!("found {found}"),
        (true, None) => "unexpected value".to_owned(),
    }
}

fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// 1-based line and column (in characters) of a byte offset.
fn line_and_column(text: &str, offset: usize) -> Option<(usize, usize)> {
    let offset = offset.min(text.len());
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    Some((line, column))
}

/// The dotted key of the `key = value` line holding `offset`, prefixed with the table header
/// above it. Only a bare key followed by `=` counts: anything else on the line might be the
/// secret itself.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or_default();
    let key = assigned_key(line)?;
    let table = text[..line_start].lines().rev().find_map(table_header);
    Some(match table {
        Some(table) => format!("{table}.{key}"),
        None => key.to_owned(),
    })
}

/// `  pool_size = 5` → `pool_size`; `a.b = 1` → `a.b`.
fn assigned_key(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    is_bare_dotted_key(key).then_some(key)
}

/// `[database]` → `database`; `[[token]]` → `token`.
fn table_header(line: &str) -> Option<&str> {
    let line = line.split('#').next().unwrap_or_default().trim();
    let inner = line
        .strip_prefix("[[")
        .and_then(|l| l.strip_suffix("]]"))
        .or_else(|| line.strip_prefix('[').and_then(|l| l.strip_suffix(']')))?
        .trim();
    is_bare_dotted_key(inner).then_some(inner)
}

fn is_bare_dotted_key(key: &str) -> bool {
    !key.is_empty()
        && key.split('.').all(|part| {
            let part = part.trim();
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        })
}

/// The key path a value-level error carries (its `Display` ends with "in `a.b`" when it has
/// one). Only that last line is read, and only when the message itself has fewer lines.
fn key_path(error: &toml::de::Error) -> Option<String> {
    let display = error.to_string();
    if display.lines().count() <= error.message().lines().count() {
        return None;
    }
    let last = display.lines().rev().find(|l| !l.trim().is_empty())?;
    let path = last.strip_prefix("in `")?.strip_suffix('`')?;
    is_bare_dotted_key(path).then(|| path.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    const SECRET: &str = "s3cret";

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct File {
        #[serde(default)]
        token: Vec<Entry>,
        #[serde(default)]
        database: Option<Database>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Database {
        url: Option<String>,
        pool_size: Option<i64>,
        mode: Option<Mode>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Entry {
        sha256: String,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Mode {
        Wait,
        Skip,
    }

    /// Reads `text` the way the configuration does: syntax, then types (with the document's
    /// positions), and returns the description.
    fn problem(text: &str) -> TomlProblem {
        if let Err(e) = text.parse::<toml::Table>() {
            return describe(&e, Some(text), Stage::Syntax);
        }
        let e = toml::from_str::<File>(text).unwrap_err();
        describe(&e, Some(text), Stage::Types)
    }

    #[test]
    fn syntax_errors_say_where_and_what_without_the_line() {
        let cases = [
            (
                "[database]\nurl = \"postgresql://u:s3cret@h/db\npool_size = 2\n",
                (2, 34),
                Some("database.url"),
                "invalid basic string",
            ),
            (
                "[database]\nurl = postgresql://u:s3cret@h/db\n",
                (2, 7),
                Some("database.url"),
                "invalid string",
            ),
            (
                "[database]\nurl = \"postgresql://u:s3\\qcret@h/db\"\n",
                (2, 27),
                Some("database.url"),
                "invalid escape sequence",
            ),
            ("s3cret\n", (1, 7), None, "expected `.`, `=`"),
            (
                "x = 's3cret\n",
                (1, 12),
                Some("x"),
                "invalid literal string",
            ),
        ];
        for (text, (line, column), key, what) in cases {
            let p = problem(text);
            assert_eq!((p.line, p.column), (Some(line), Some(column)), "{text:?}");
            assert_eq!(p.key.as_deref(), key, "{text:?}");
            assert!(p.what.starts_with(what), "{text:?}: {p}");
            assert!(!p.to_string().contains(SECRET), "{text:?}: {p}");
        }
    }

    #[test]
    fn type_errors_name_the_key_and_the_types_never_the_value() {
        let cases = [
            (
                "token = \"s3cret-bearer-token\"\n",
                "line 1, column 9, key `token`: wrong type: found string, expected a sequence",
            ),
            (
                "[[token]]\nsha256 = [\"s3cret\"]\n",
                "line 2, column 10, key `token.sha256`: wrong type: found sequence, expected a string",
            ),
            (
                "[database]\npool_size = \"s3cret\"\n",
                "line 2, column 13, key `database.pool_size`: wrong type: found string, expected i64",
            ),
            (
                "[database]\nmode = \"s3cret\"\n",
                "line 2, column 8, key `database.mode`: not one of the accepted values \
                 (expected `wait` or `skip`)",
            ),
            (
                "[database]\ns3cret_typo = 1\n",
                "line 2, column 1, key `database.s3cret_typo`: unknown field `s3cret_typo`, \
                 expected one of `url`, `pool_size`, `mode`",
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(problem(text).to_string(), expected, "{text:?}");
        }
        // A value-level error (no document): the key path, nothing else.
        let table: toml::Table = "[database]\npool_size = \"s3cret\"\n".parse().unwrap();
        let e = toml::Value::Table(table).try_into::<File>().unwrap_err();
        let p = describe(&e, None, Stage::Types);
        assert_eq!(
            p.to_string(),
            "key `database.pool_size`: wrong type: found string, expected i64"
        );
    }

    #[test]
    fn messages_of_unknown_shape_are_not_trusted_at_the_type_stage() {
        assert_eq!(
            kind_of("custom: s3cret is bad", Stage::Types),
            "invalid value"
        );
        assert_eq!(
            kind_of(
                "invalid value: string \"s3cret\", expected a date",
                Stage::Types
            ),
            "invalid value: found string, expected a date"
        );
        assert_eq!(
            kind_of(
                "invalid type: string \"a, expected b\", expected i64",
                Stage::Types
            ),
            "wrong type: found string, expected i64"
        );
    }
}
