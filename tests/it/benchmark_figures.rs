//! Every figure of docs/ that BENCHMARKS.md states comes from one place (issue 42 item 1, "Keep
//! them true"): BENCHMARKS.md marks the blocks other pages quote, `<!-- figures of record: NAME
//! -->` … `<!-- end of figures: NAME -->`, and a page quotes one word for word between
//! `<!-- quoted from BENCHMARKS.md: NAME -->` and `<!-- end of quote: NAME -->`. So a
//! re-measure updates one place, and a quote that was not copied again fails here;
//! `SNAPSHOTS=overwrite` (snapbox's convention) copies every record into its quotes instead of
//! failing. Outside quotes a page of docs/ states no figure BENCHMARKS.md states — a decimal or
//! a range with its unit, "0.85 ×", "1.2–1.8 KB", "64–79 ms" — but the few listed below, which
//! are the page's own measurement and only happen to be written the same way.
//!
//! To see it fail: change a cell of BENCHMARKS.md's forever table and run
//! `cargo test --test it benchmark_figures`.

use std::collections::BTreeMap;

use regex::Regex;

use crate::doc_samples::docs_pages;
use crate::ops_support::repo_root;

/// Figures a page states of its own (not from BENCHMARKS.md) that BENCHMARKS.md also happens to
/// state: (page, figure as written, what it is).
const OWN_FIGURES: &[(&str, &str, &str)] = &[
    (
        "docs/cleanup.md",
        "0.5 ms",
        "the keyset cursor's pick, in the page's own EXPLAIN table",
    ),
    (
        "docs/cleanup.md",
        "2-3 ms",
        "a batch's COMMIT waiting for its WAL flush, in the page's own EXPLAIN analysis",
    ),
];

/// The blocks between `<!-- {open}NAME -->` and `<!-- {close}NAME -->` lines: name → (byte
/// range of the text between the two lines).
fn blocks(text: &str, open: &str, close: &str) -> BTreeMap<String, std::ops::Range<usize>> {
    let mut found = BTreeMap::new();
    let mut offset = 0;
    let mut current: Option<(String, usize)> = None;
    for line in text.split_inclusive('\n') {
        let marker = line
            .trim_end()
            .strip_prefix("<!-- ")
            .and_then(|l| l.strip_suffix(" -->"));
        match (marker, &current) {
            (Some(m), None) if m.starts_with(open) => {
                current = Some((m[open.len()..].to_owned(), offset + line.len()));
            }
            (Some(m), Some((name, start))) if m == format!("{close}{name}") => {
                assert!(
                    found.insert(name.clone(), *start..offset).is_none(),
                    "{name} twice"
                );
                current = None;
            }
            (Some(m), Some((name, _))) if m.starts_with(open) => {
                panic!("{m:?} inside the block {name}")
            }
            _ => {}
        }
        offset += line.len();
    }
    assert!(current.is_none(), "{current:?} is never closed");
    found
}

/// The blocks, the last in the text first: replacing one leaves the earlier ranges valid.
fn from_the_end(
    blocks: &BTreeMap<String, std::ops::Range<usize>>,
) -> Vec<(&String, std::ops::Range<usize>)> {
    let mut sorted: Vec<_> = blocks.iter().map(|(n, r)| (n, r.clone())).collect();
    sorted.sort_by_key(|(_, r)| std::cmp::Reverse(r.start));
    sorted
}

fn relative(path: &std::path::Path) -> String {
    path.strip_prefix(repo_root())
        .unwrap()
        .display()
        .to_string()
}

#[test]
fn every_quote_of_benchmarks_md_is_its_record_word_for_word() {
    let source = std::fs::read_to_string(repo_root().join("BENCHMARKS.md")).unwrap();
    let records = blocks(&source, "figures of record: ", "end of figures: ");
    assert!(
        records.contains_key("forever-table"),
        "BENCHMARKS.md has no record forever-table: {:?}",
        records.keys()
    );
    let overwrite = std::env::var("SNAPSHOTS").is_ok_and(|v| v == "overwrite");
    let mut problems = Vec::new();
    let mut quoted = 0;
    for page in docs_pages() {
        let mut text = std::fs::read_to_string(&page).unwrap();
        let quotes = blocks(&text, "quoted from BENCHMARKS.md: ", "end of quote: ");
        for (name, range) in from_the_end(&quotes) {
            quoted += 1;
            let Some(record) = records.get(name).map(|r| &source[r.clone()]) else {
                problems.push(format!(
                    "{}: quotes {name}, which BENCHMARKS.md has no record of",
                    relative(&page)
                ));
                continue;
            };
            if text[range.clone()] != *record {
                if overwrite {
                    text.replace_range(range, record);
                } else {
                    problems.push(format!(
                        "{}: the quote of {name} is not BENCHMARKS.md's record; copy it with \
                         `SNAPSHOTS=overwrite cargo test --test it benchmark_figures`\n--- quote:\n{}--- record:\n{record}",
                        relative(&page),
                        &text[range]
                    ));
                }
            }
        }
        if overwrite {
            std::fs::write(&page, &text).unwrap();
        }
    }
    assert!(quoted >= 2, "no page of docs/ quotes BENCHMARKS.md");
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// A figure as written: a decimal, or a range, with its unit ("0.85 ×", "64–79 ms").
fn figures(text: &str) -> Vec<String> {
    static FIGURE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let figure = FIGURE.get_or_init(|| {
        let number = r"\d[\d,]*(?:\.\d+)?";
        let unit = r"\s?(?:ms|µs|s|×|MB|GB|KB|kB|MiB|GiB|%|bytes)\b";
        Regex::new(&format!(
            r"(?:^|[^\w.,])((?:\d[\d,]*\.\d+|{number}\s?[–-]\s?{number})(?:{unit}|\s?×))"
        ))
        .unwrap()
    });
    figure
        .captures_iter(text)
        .map(|c| normalise(&c[1]))
        .collect()
}

/// One spelling for the comparison: no spaces, ranges with an en dash.
fn normalise(figure: &str) -> String {
    figure
        .chars()
        .filter(|c| !c.is_whitespace())
        .map(|c| if c == '-' { '–' } else { c })
        .collect()
}

#[test]
fn docs_state_no_figure_of_benchmarks_md_outside_a_quote() {
    let source = std::fs::read_to_string(repo_root().join("BENCHMARKS.md")).unwrap();
    let stated: std::collections::BTreeSet<String> = figures(&source).into_iter().collect();
    let mut problems = Vec::new();
    for page in docs_pages() {
        let name = relative(&page);
        let text = std::fs::read_to_string(&page).unwrap();
        let quotes = blocks(&text, "quoted from BENCHMARKS.md: ", "end of quote: ");
        let mut outside = text.clone();
        for (_, range) in from_the_end(&quotes) {
            outside.replace_range(range, "");
        }
        for (n, line) in outside.lines().enumerate() {
            for figure in figures(line) {
                let own = OWN_FIGURES
                    .iter()
                    .any(|(p, f, _)| *p == name && normalise(f) == figure);
                if stated.contains(&figure) && !own {
                    problems.push(format!(
                        "{name}: {figure:?} is a figure of BENCHMARKS.md, stated outside a quote \
                         (line {} of the page without its quotes): {line}",
                        n + 1
                    ));
                }
            }
        }
    }
    for (page, figure, _) in OWN_FIGURES {
        assert!(
            stated.contains(&normalise(figure)),
            "{page}'s {figure:?} is no longer a figure of BENCHMARKS.md: drop it from OWN_FIGURES"
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn figures_are_read_as_written() {
    assert_eq!(
        figures("at 0.85 × and 1.2–1.8 KB, p99 64-79 ms; 1.01 ×, 5 s, 2 GB, v1.2, 15.18"),
        ["0.85×", "1.2–1.8KB", "64–79ms", "1.01×"]
    );
}
