//! libpq connection strings (`database.url`), both forms. For every input: parsing never panics;
//! an error never quotes the password planted at its end; an accepted string prints (secrets
//! masked) without the password and prints back with its secrets into a string that parses to
//! the same parameters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tombstoned::db::conninfo::ConnInfo;

const PLANTED: &str = "Zq8xYw4kPlanted";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ConnInfo::parse(text);
    let with_password = if text.starts_with("postgres") {
        format!("{text}&password={PLANTED}")
    } else {
        format!("{text} password={PLANTED}")
    };
    match ConnInfo::parse(&with_password) {
        Err(e) => assert!(!e.to_string().contains(PLANTED), "{e}"),
        Ok(c) => {
            let shown = c.to_string();
            if c.password().is_some_and(|p| p.expose() == PLANTED) {
                assert!(!shown.contains(PLANTED), "{shown}");
            }
            let again = ConnInfo::parse(&c.to_string_with_secrets())
                .unwrap_or_else(|e| panic!("{e}: {}", c.to_string_with_secrets()));
            assert_eq!(again, c);
        }
    }
});
