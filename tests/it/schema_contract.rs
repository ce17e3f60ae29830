//! The database contract as it stands: `migrations/` applied V1 → latest on a fresh database,
//! its catalogue rendered one file per object, compared with `schema/` at the repository's root
//! (schema/README.md), and the conventions every function keeps.
//!
//! `TOMBSTONED_UPDATE_SCHEMA=1 cargo test --test it schema_contract` writes `schema/` from the
//! catalogue instead of comparing (a new migration's review is then the diff of `schema/`); the
//! conventions and the endpoint's function bodies are checked either way.
//!
//! What is rendered, and from where: a table's columns (`format_type`, defaults, identity, NOT
//! NULL), its storage options, constraints (`pg_get_constraintdef`), the indexes no constraint
//! makes (`pg_get_indexdef`), its triggers (`pg_get_triggerdef`) and its ACL; a view's
//! definition (`pg_get_viewdef`) and ACL; a function's `pg_get_functiondef` (security, SET
//! clauses, body) and ACL. An ACL names the owner `owner` and keeps only the owner's and
//! PUBLIC's entries: grants to other roles depend on the roles a database has when it is
//! migrated (V6 grants the endpoint's functions to every role that may already write the
//! tables) and are tested where they are made (`endpoint_functions.rs`).
//!
//! Stable across PostgreSQL majors: the same text on 15 and 18 (CI runs this on both). What the
//! two catalogues render differently is normalised here, in [`rendered`]: PostgreSQL 18 records
//! a column's NOT NULL as a constraint too (`pg_constraint.contype = 'n'`), which the column
//! line already says, so such constraints are left out. Anything else that differs fails the
//! comparison on the major where it differs, naming the file.
//!
//! Which schemas are rendered, and where to: [`RENDERED`], one line per schema. Which functions
//! are the SQL API and which are internal: `tombstoned::schema::API_FUNCTIONS`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tokio_postgres::Client;
use tombstoned::claim::sql::{CLAIM_AND_CREATE, CLAIM_REJECTED};
use tombstoned::schema::{self, API_FUNCTIONS, API_VERSION};

use crate::harness::TestDb;

/// The schemas rendered, each with the directory under `schema/` its files go to (`""`: the
/// product's schema, at the top). A second schema is one more line here.
const RENDERED: &[(&str, &str)] = &[("tombstoned", "")];

/// Regenerates `schema/` instead of comparing with it.
const UPDATE: &str = "TOMBSTONED_UPDATE_SCHEMA";

/// Functions that do not keep every convention of schema/README.md, each with the reason. The
/// test fails for any other function that breaks one, and for an exception that no longer
/// breaks any (so the list stays short and true).
const CONVENTION_EXCEPTIONS: &[(&str, &str)] = &[(
    "replay_window_open",
    "the replay window's rule (V7), which the planner inlines into every statement that judges a \
     window, the endpoint's included: SECURITY DEFINER or a SET clause would stop the inlining, \
     and every role that runs the endpoint's statements must execute it; it reads nothing but its \
     two arguments, writes nothing and reveals nothing",
)];

/// Internal functions that run with their caller's privileges on purpose (V8: a service role
/// must not be able to call them however it was granted), and why. They keep every other
/// convention: a pinned search_path with pg_temp last, no EXECUTE for PUBLIC.
const SECURITY_INVOKER: &[(&str, &str)] = &[
    (
        "require_scope",
        "runs as its caller, the API function's owner; refuses a caller that may not read the \
         grants, as every service role (42501)",
    ),
    (
        "require_fingerprint",
        "the same refusal as require_scope; reads no table",
    ),
    (
        "record_outcome",
        "a service role calling it directly has no privilege on the tables it reads (42501)",
    ),
    ("find_scope", "as record_outcome"),
    ("ensure_scope", "as record_outcome"),
    (
        "endpoint_claim_order",
        "the endpoint's: runs with the daemon's own table privileges, so it gives no role a right \
         it does not already hold",
    ),
    (
        "endpoint_claim_rejected",
        "the endpoint's: as endpoint_claim_order",
    ),
];

fn schema_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("schema")
}

#[tokio::test]
async fn the_migrated_schema_is_the_committed_contract() {
    let db = TestDb::empty().await;
    let applied = schema::migrate(&db.config().database).await.unwrap();
    assert_eq!(
        applied,
        schema::migrations::known(),
        "V1 to the latest, in order"
    );
    let client = db.client().await;

    let mut broken = Vec::new();
    for (name, _) in RENDERED {
        broken.extend(convention_breaches(&client, name).await);
    }
    assert!(
        broken.is_empty(),
        "functions break the conventions of schema/README.md (fix the migration, or add an \
         exception with its reason to CONVENTION_EXCEPTIONS):\n{}",
        broken.join("\n")
    );
    endpoint_functions_are_the_endpoints_statements(&client).await;
    the_api_is_the_version_this_binary_knows_and_closed_to_strangers(&db, &client).await;

    let mut files = BTreeMap::new();
    for (name, dir) in RENDERED {
        files.extend(rendered(&client, name, dir).await);
    }
    if std::env::var_os(UPDATE).is_some_and(|v| v == "1") {
        write(&files);
        return;
    }
    let committed = committed();
    let mut drift = Vec::new();
    for (path, text) in &files {
        match committed.get(path) {
            None => drift.push(format!("schema/{} is missing", path.display())),
            Some(old) if old != text => drift.push(format!(
                "schema/{} differs:\n{}",
                path.display(),
                first_difference(old, text)
            )),
            Some(_) => {}
        }
    }
    for path in committed.keys().filter(|p| !files.contains_key(*p)) {
        drift.push(format!(
            "schema/{} is no longer in the catalogue",
            path.display()
        ));
    }
    assert!(
        drift.is_empty(),
        "schema/ is not what the migrations make (a new migration: regenerate it with \
         {UPDATE}=1 cargo test --test it schema_contract, and review the diff):\n{}",
        drift.join("\n")
    );
}

/// Every function of `schema_name`: SECURITY DEFINER (or on [`SECURITY_INVOKER`]), a pinned
/// search_path with `pg_temp` last, not executable by PUBLIC — or on [`CONVENTION_EXCEPTIONS`],
/// which must still be needed.
async fn convention_breaches(client: &Client, schema_name: &str) -> Vec<String> {
    let rows = client
        .query(
            "SELECT p.proname::text, p.prosecdef, coalesce(p.proconfig, '{}'),
                    has_function_privilege('public', p.oid, 'EXECUTE')
             FROM pg_proc p
             WHERE p.pronamespace = $1::text::regnamespace
             ORDER BY 1",
            &[&schema_name],
        )
        .await
        .unwrap();
    let mut broken = Vec::new();
    let mut excepted_and_breaking = Vec::new();
    for row in &rows {
        let name: String = row.get(0);
        let mut breaches = Vec::new();
        let invoker = SECURITY_INVOKER.iter().find(|(n, _)| *n == name);
        match (row.get::<_, bool>(1), invoker) {
            (false, None) => breaches.push("is not SECURITY DEFINER".to_owned()),
            (true, Some((_, reason))) => breaches.push(format!(
                "is SECURITY DEFINER but listed in SECURITY_INVOKER ({reason}): take it off"
            )),
            _ => {}
        }
        let config: Vec<String> = row.get(2);
        let path = config
            .iter()
            .find_map(|setting| setting.strip_prefix("search_path="));
        match path {
            None => breaches.push("has no pinned search_path".to_owned()),
            Some(path) if path.split(',').map(str::trim).next_back() != Some("pg_temp") => {
                breaches.push(format!("has search_path {path}, without pg_temp last"))
            }
            Some(_) => {}
        }
        if row.get::<_, bool>(3) {
            breaches.push("is executable by PUBLIC".to_owned());
        }
        let excepted = CONVENTION_EXCEPTIONS.iter().any(|(n, _)| *n == name);
        if excepted {
            if !breaches.is_empty() {
                excepted_and_breaking.push(name);
            }
        } else {
            broken.extend(
                breaches
                    .into_iter()
                    .map(|b| format!("{schema_name}.{name} {b}")),
            );
        }
    }
    if schema_name == RENDERED[0].0 {
        for (name, _) in SECURITY_INVOKER {
            if !rows.iter().any(|r| r.get::<_, String>(0) == *name) {
                broken.push(format!(
                    "{name} is listed in SECURITY_INVOKER but does not exist"
                ));
            }
        }
        for (name, reason) in CONVENTION_EXCEPTIONS {
            if !excepted_and_breaking.iter().any(|n| n == name) {
                broken.push(format!(
                    "{name} is a convention exception ({reason}) but breaks none: take it off \
                     the list"
                ));
            }
        }
    }
    broken
}

/// Runs of whitespace as one space: the comparison is of the SQL, not of its layout.
fn normalised(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The endpoint's claim functions (V6, recreated by V7) run exactly `claim/sql.rs`'s statements:
/// each body is the READ COMMITTED check, the lock timeout from its last argument, then `RETURN
/// QUERY` of the Rust constant, its schema prefix left out (the search_path is pinned). A changed
/// statement needs a migration that replaces the function.
async fn endpoint_functions_are_the_endpoints_statements(client: &Client) {
    for (function, statement, lock_timeout) in [
        (
            "tombstoned.endpoint_claim_order(text, text, text, text, bytea, uuid, text, bigint, \
             text, text, text, integer, text, bigint, uuid, jsonb, text)",
            CLAIM_AND_CREATE,
            17,
        ),
        (
            "tombstoned.endpoint_claim_rejected(text, text, text, text, bytea, smallint, jsonb, \
             bigint, text)",
            CLAIM_REJECTED,
            9,
        ),
    ] {
        let source: String = client
            .query_one(
                "SELECT prosrc FROM pg_proc WHERE oid = $1::text::regprocedure",
                &[&function],
            )
            .await
            .unwrap()
            .get(0);
        let expected = format!(
            "#variable_conflict use_column
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the endpoint''s claim runs under READ COMMITTED, not %',
                        current_setting('transaction_isolation')
            USING ERRCODE = 'TS005';
    END IF;
    PERFORM set_config('lock_timeout', ${lock_timeout}, true);
    RETURN QUERY
{};
END",
            statement.replace("{schema}.", "")
        );
        assert_eq!(
            normalised(&source),
            normalised(&expected),
            "{function} drifted from the Rust constant: a changed statement needs a migration \
             that replaces the function"
        );
    }
}

/// `api_version()` answers this binary's [`API_VERSION`]; a role with only USAGE on the schema
/// (no EXECUTE grant) cannot call it.
async fn the_api_is_the_version_this_binary_knows_and_closed_to_strangers(
    db: &TestDb,
    client: &Client,
) {
    let version: i32 = client
        .query_one("SELECT api_version()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(version, API_VERSION, "bump both together");
    let role = format!("nogrant_{}", db.name);
    client
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA tombstoned TO {role}"
        ))
        .await
        .unwrap();
    let mut as_role = crate::harness::server().clone();
    as_role.user(&role);
    as_role.dbname(&db.name);
    let (stranger, connection) = as_role.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let refused = stranger
        .query_one("SELECT tombstoned.api_version()", &[])
        .await
        .unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("42501"), "{refused}");
}

/// The catalogue of `schema_name`, one file per object, under `dir`: `tables/`, `views/`,
/// `functions/api/`, `functions/internal/`.
async fn rendered(client: &Client, schema_name: &str, dir: &str) -> BTreeMap<PathBuf, String> {
    let dir = Path::new(dir);
    unknown_objects_fail(client, schema_name).await;
    // Every name the catalogue prints is then schema-qualified, whatever the session's path.
    client
        .batch_execute("SET search_path = pg_catalog")
        .await
        .unwrap();
    let mut files = BTreeMap::new();
    let header = "-- Rendered from the migrated catalogue by tests/it/schema_contract.rs; do not\n\
                  -- edit: TOMBSTONED_UPDATE_SCHEMA=1 regenerates it (schema/README.md).\n";

    let tables = client
        .query(
            "SELECT c.oid, c.relname::text, pg_get_userbyid(c.relowner)::text,
                    coalesce(c.reloptions, '{}')
                    || coalesce((SELECT array_agg('toast.' || o) FROM pg_class t,
                                        unnest(t.reloptions) AS o
                                 WHERE t.oid = c.reltoastrelid), '{}'),
                    c.relacl::text[]
             FROM pg_class c
             WHERE c.relnamespace = $1::text::regnamespace AND c.relkind IN ('r', 'p')
               AND c.relname <> $2
             ORDER BY 2",
            &[&schema_name, &schema::HISTORY_TABLE],
        )
        .await
        .unwrap();
    for table in &tables {
        let oid: u32 = table.get(0);
        let name: String = table.get(1);
        let owner: String = table.get(2);
        let options: Vec<String> = table.get(3);
        let acl: Option<Vec<String>> = table.get(4);
        let mut text = format!("{header}\nCREATE TABLE {schema_name}.{name} (\n");
        let columns = client
            .query(
                "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                        pg_get_expr(d.adbin, d.adrelid), a.attidentity::text
                 FROM pg_attribute a
                 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
                 ORDER BY a.attnum",
                &[&oid],
            )
            .await
            .unwrap();
        let lines: Vec<String> = columns
            .iter()
            .map(|c| {
                let mut line = format!("    {} {}", c.get::<_, String>(0), c.get::<_, String>(1));
                match c.get::<_, String>(4).as_str() {
                    "a" => line.push_str(" GENERATED ALWAYS AS IDENTITY"),
                    "d" => line.push_str(" GENERATED BY DEFAULT AS IDENTITY"),
                    _ => {}
                }
                if c.get::<_, bool>(2) {
                    line.push_str(" NOT NULL");
                }
                if let Some(default) = c.get::<_, Option<String>>(3) {
                    line.push_str(&format!(" DEFAULT {default}"));
                }
                line
            })
            .collect();
        text.push_str(&lines.join(",\n"));
        text.push_str("\n)");
        if !options.is_empty() {
            text.push_str(&format!("\nWITH (\n    {}\n)", options.join(",\n    ")));
        }
        text.push_str(";\n");
        // PostgreSQL 18 also records each NOT NULL as a constraint (contype 'n'); the column
        // line says it already, and 15 has none: left out (module docs). A constraint trigger
        // (contype 't') is rendered as the trigger it is, below.
        let alter = format!("ALTER TABLE {schema_name}.{name} ");
        let parts = [
            (
                alter.as_str(),
                "SELECT format('ADD CONSTRAINT %s %s', conname, pg_get_constraintdef(oid))
                 FROM pg_constraint WHERE conrelid = $1 AND contype NOT IN ('n', 't')
                 ORDER BY conname",
            ),
            (
                "",
                "SELECT pg_get_indexdef(i.indexrelid)
                 FROM pg_index i
                 WHERE i.indrelid = $1
                   AND NOT EXISTS (SELECT FROM pg_constraint c WHERE c.conindid = i.indexrelid)
                 ORDER BY i.indexrelid::regclass::text",
            ),
            (
                "",
                "SELECT pg_get_triggerdef(oid) FROM pg_trigger
                 WHERE tgrelid = $1 AND NOT tgisinternal ORDER BY tgname",
            ),
        ];
        for (prefix, query) in parts {
            let statements: Vec<String> = client
                .query(query, &[&oid])
                .await
                .unwrap()
                .iter()
                .map(|r| format!("{prefix}{};\n", r.get::<_, String>(0)))
                .collect();
            if !statements.is_empty() {
                text.push('\n');
                text.push_str(&statements.concat());
            }
        }
        text.push_str(&format!("\n{}\n", acl_line(acl, &owner, "the owner only")));
        files.insert(dir.join("tables").join(format!("{name}.sql")), text);
    }

    let views = client
        .query(
            "SELECT c.relname::text, pg_get_viewdef(c.oid, true), pg_get_userbyid(c.relowner)::text,
                    c.relacl::text[]
             FROM pg_class c
             WHERE c.relnamespace = $1::text::regnamespace AND c.relkind = 'v'
             ORDER BY 1",
            &[&schema_name],
        )
        .await
        .unwrap();
    for view in &views {
        let name: String = view.get(0);
        let definition: String = view.get(1);
        let owner: String = view.get(2);
        let acl: Option<Vec<String>> = view.get(3);
        let text = format!(
            "{header}\nCREATE VIEW {schema_name}.{name} AS\n{};\n\n{}\n",
            definition.trim_end().trim_end_matches(';'),
            acl_line(acl, &owner, "the owner only")
        );
        files.insert(dir.join("views").join(format!("{name}.sql")), text);
    }

    let functions = client
        .query(
            "SELECT p.proname::text, pg_get_functiondef(p.oid), pg_get_userbyid(p.proowner)::text,
                    p.proacl::text[]
             FROM pg_proc p
             WHERE p.pronamespace = $1::text::regnamespace
             ORDER BY 1, pg_get_function_identity_arguments(p.oid)",
            &[&schema_name],
        )
        .await
        .unwrap();
    for function in &functions {
        let name: String = function.get(0);
        let definition: String = function.get(1);
        let owner: String = function.get(2);
        let acl: Option<Vec<String>> = function.get(3);
        let kind = if API_FUNCTIONS.contains(&name.as_str()) {
            "api"
        } else {
            "internal"
        };
        let path = dir.join("functions").join(kind).join(format!("{name}.sql"));
        let text = files.entry(path).or_insert_with(|| header.to_owned());
        text.push_str(&format!(
            "\n{}\n\n{}\n",
            definition.trim_end(),
            acl_line(acl, &owner, "the owner and PUBLIC may execute")
        ));
    }
    files
}

/// An object the renderer would miss fails the test instead: every relation of the schema is a
/// table, a view, an index or a column's own sequence, and every type is a relation's row type
/// (or its array).
async fn unknown_objects_fail(client: &Client, schema_name: &str) {
    let unknown: Vec<String> = client
        .query(
            "SELECT format('%s (relkind %s)', c.relname, c.relkind)
             FROM pg_class c
             WHERE c.relnamespace = $1::text::regnamespace
               AND c.relkind NOT IN ('r', 'p', 'v', 'i', 'I')
               AND NOT (c.relkind = 'S' AND EXISTS (
                   SELECT FROM pg_depend d
                   WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                     AND d.deptype IN ('a', 'i')))
             UNION ALL
             SELECT format('type %s', t.typname)
             FROM pg_type t
             WHERE t.typnamespace = $1::text::regnamespace
               AND t.typrelid = 0
               AND NOT EXISTS (SELECT FROM pg_type e WHERE e.typarray = t.oid)",
            &[&schema_name],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        unknown.is_empty(),
        "schema {schema_name} has objects the contract test does not render (teach `rendered` \
         them): {unknown:?}"
    );
}

/// An ACL as one comment line: the owner named `owner`, only its and PUBLIC's entries kept
/// (module docs); `None` (never granted nor revoked) is the default, said in words.
fn acl_line(acl: Option<Vec<String>>, owner: &str, default: &str) -> String {
    let Some(items) = acl else {
        return format!("-- ACL: default ({default})");
    };
    let kept: Vec<String> = items
        .iter()
        .filter_map(|item| {
            let (grantee, rest) = item.split_once('=')?;
            let (privileges, grantor) = rest.split_once('/')?;
            let name = |role: &str| {
                if role == owner {
                    "owner".to_owned()
                } else {
                    role.to_owned()
                }
            };
            (grantee.is_empty() || grantee == owner)
                .then(|| format!("{}={privileges}/{}", name(grantee), name(grantor)))
        })
        .collect();
    format!("-- ACL: {{{}}}", kept.join(","))
}

/// The committed files under `schema/` (README.md aside), by path relative to it.
fn committed() -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "sql") {
                let text = std::fs::read_to_string(&path).unwrap();
                out.insert(path.strip_prefix(root).unwrap().to_owned(), text);
            }
        }
    }
    let root = schema_dir();
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// Replaces the committed `.sql` files with `files`.
fn write(files: &BTreeMap<PathBuf, String>) {
    let root = schema_dir();
    for old in committed().keys() {
        std::fs::remove_file(root.join(old)).unwrap();
    }
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
}

/// The first line where `old` and `new` differ, with its neighbours, for the failure message.
fn first_difference(old: &str, new: &str) -> String {
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let at = (0..old.len().max(new.len()))
        .find(|&i| old.get(i) != new.get(i))
        .unwrap_or(0);
    format!(
        "  line {}:\n  - {}\n  + {}",
        at + 1,
        old.get(at).unwrap_or(&"(end of file)"),
        new.get(at).unwrap_or(&"(end of file)")
    )
}
