//! Where the database password comes from, in this order: the connection string's `password`,
//! `database.password_file` (e.g. a systemd credential), or libpq's password file (`passfile`,
//! `$PGPASSFILE`, `~/.pgpass`) with libpq's format and matching rules.
//!
//! Files are read when a connection is opened, not once at start-up: a rotated password file is
//! picked up by the next new connection without a restart.

use std::collections::HashSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::conninfo::{default_socket_dir, ConnInfo, HostKind, Secret, Target};

/// Why `database.password_file` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    /// The file could not be read.
    #[error("cannot read password file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not a regular file (a FIFO would block the reader).
    #[error("password file {path} is not a regular file")]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Group or others may read it.
    #[error(
        "password file {path} is readable by group or others (mode {mode:04o}); make it \
         readable by its owner only (chmod 0600 or 0400), as libpq requires of ~/.pgpass"
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Nothing in it once the trailing newline is removed.
    #[error("password file {path} is empty")]
    Empty {
        /// The file.
        path: PathBuf,
    },
}

/// Reads `database.password_file`: the whole file, one trailing newline (`\n` or `\r\n`)
/// removed. Refused when group or others can read it.
pub fn read_password_file(path: &Path) -> Result<Secret, PasswordFileError> {
    let read_error = |source| PasswordFileError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_error)?;
    if !meta.is_file() {
        return Err(PasswordFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o044 != 0 {
        return Err(PasswordFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = std::fs::read_to_string(path).map_err(read_error)?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err(PasswordFileError::Empty {
            path: path.to_owned(),
        });
    }
    Ok(Secret::new(text))
}

/// Where a connection's password comes from (for `check-config` and error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasswordSource {
    /// The connection string's `password`.
    Url,
    /// `database.password_file`.
    File(PathBuf),
    /// libpq's password file (which may not exist or hold no matching line).
    Pgpass(PathBuf),
    /// None: only authentication methods without a password can work.
    None,
}

impl std::fmt::Display for PasswordSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PasswordSource::Url => f.write_str("the connection string (database.url)"),
            PasswordSource::File(p) => write!(f, "database.password_file {}", p.display()),
            PasswordSource::Pgpass(p) => write!(f, "the libpq password file {}", p.display()),
            PasswordSource::None => f.write_str("none"),
        }
    }
}

/// Which source applies to `conninfo` with `password_file`.
pub fn password_source(conninfo: &ConnInfo, password_file: Option<&Path>) -> PasswordSource {
    if conninfo.password().is_some() {
        PasswordSource::Url
    } else if let Some(file) = password_file {
        PasswordSource::File(file.to_owned())
    } else if let Some(pgpass) = pgpass_path(conninfo) {
        PasswordSource::Pgpass(pgpass)
    } else {
        PasswordSource::None
    }
}

/// The password for one connection attempt to `target` as `user` on `dbname`.
pub fn password_for(
    source: &PasswordSource,
    conninfo: &ConnInfo,
    target: &Target,
    user: &str,
    dbname: &str,
) -> Result<Option<Secret>, PasswordFileError> {
    Ok(match source {
        PasswordSource::Url => conninfo.password().cloned(),
        PasswordSource::File(path) => Some(read_password_file(path)?),
        PasswordSource::Pgpass(path) => pgpass_lookup(path, target, user, dbname),
        PasswordSource::None => None,
    })
}

/// libpq's password file: `passfile`, else `$PGPASSFILE`, else `~/.pgpass`.
pub fn pgpass_path(conninfo: &ConnInfo) -> Option<PathBuf> {
    if let Some(p) = conninfo.passfile() {
        return Some(p.to_owned());
    }
    if let Some(p) = std::env::var_os("PGPASSFILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    home_dir().map(|h| h.join(".pgpass"))
}

/// `$HOME`, else the home directory of the effective user in the password database.
pub fn home_dir() -> Option<PathBuf> {
    if let Some(h) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(h));
    }
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.dir)
}

/// The operating-system user name: libpq's default `user`.
pub fn os_user_name() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map(|u| u.name)
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
}

/// The host name a pgpass line is matched with, as libpq chooses it: `host`, else
/// `hostaddr`; `localhost` for no host or the default socket directory.
pub fn pgpass_host(target: &Target) -> String {
    match (&target.host, target.hostaddr) {
        (HostKind::Tcp(h), _) if !h.is_empty() => h.clone(),
        (_, Some(addr)) => addr.to_string(),
        (HostKind::Unix(dir), None) if *dir == default_socket_dir() => "localhost".to_owned(),
        (HostKind::Unix(dir), None) => dir.display().to_string(),
        (HostKind::Tcp(_), None) => "localhost".to_owned(),
    }
}

/// Looks `target` up in the password file at `path`. A missing file means no password; a file
/// group or others can access is ignored with a warning (once per file), as libpq does.
pub fn pgpass_lookup(path: &Path, target: &Target, user: &str, dbname: &str) -> Option<Secret> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() {
        warn_once(path, "is not a plain file");
        return None;
    }
    if meta.mode() & 0o077 != 0 {
        warn_once(
            path,
            "has group or world access; permissions should be u=rw (0600) or less",
        );
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    pgpass_match(
        &text,
        &pgpass_host(target),
        &target.port.to_string(),
        dbname,
        user,
    )
    .map(Secret::new)
}

fn warn_once(path: &Path, problem: &str) {
    static WARNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned
        .get_or_insert_with(HashSet::new)
        .insert(path.to_owned())
    {
        tracing::warn!(file = %path.display(), "password file {problem}; ignoring it");
    }
}

/// The password of the first line matching host, port, database and user: fields separated by
/// `:`, `*` matching anything in the first four, `\:` and `\\` escaping; `#` starts a comment
/// line.
pub fn pgpass_match(
    text: &str,
    host: &str,
    port: &str,
    dbname: &str,
    user: &str,
) -> Option<String> {
    for line in text.lines() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut rest = line;
        let mut matched = true;
        for wanted in [host, port, dbname, user] {
            match field_matches(rest, wanted) {
                Some(after) => rest = after,
                None => {
                    matched = false;
                    break;
                }
            }
        }
        if matched {
            // The password runs to the next unescaped ':' (libpq ignores anything after it).
            let mut password = String::new();
            let mut chars = rest.chars();
            while let Some(c) = chars.next() {
                match c {
                    ':' => break,
                    '\\' => match chars.next() {
                        Some(escaped) => password.push(escaped),
                        None => password.push('\\'),
                    },
                    c => password.push(c),
                }
            }
            return Some(password);
        }
    }
    None
}

/// If the field at the start of `line` matches `wanted` (or is `*`), what follows its `:`.
fn field_matches<'a>(line: &'a str, wanted: &str) -> Option<&'a str> {
    if let Some(rest) = line.strip_prefix("*:") {
        return Some(rest);
    }
    let mut wanted = wanted.chars();
    let mut chars = line.char_indices();
    while let Some((i, c)) = chars.next() {
        let c = match c {
            ':' => {
                return wanted.next().is_none().then(|| &line[i + 1..]);
            }
            '\\' => match chars.next() {
                Some((_, escaped)) => escaped,
                None => return None,
            },
            c => c,
        };
        if wanted.next() != Some(c) {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn pgpass_matching_follows_libpq() {
        let text = "\
# comment:*:*:*:nope
db1:5432:app:alice:first
*:*:app:bob:bob\\:pass\\\\word:ignored
h\\:6:5432:*:*:escaped-host
*:*:*:*:fallback
";
        assert_eq!(
            pgpass_match(text, "db1", "5432", "app", "alice").as_deref(),
            Some("first")
        );
        assert_eq!(
            pgpass_match(text, "db2", "5433", "app", "bob").as_deref(),
            Some("bob:pass\\word")
        );
        assert_eq!(
            pgpass_match(text, "h:6", "5432", "x", "y").as_deref(),
            Some("escaped-host")
        );
        assert_eq!(
            pgpass_match(text, "db1", "5433", "app", "alice").as_deref(),
            Some("fallback"),
            "first match wins, and the port must match"
        );
        assert_eq!(
            pgpass_match("db1:5432:app:alice:", "db1", "5432", "app", "alice").as_deref(),
            Some("")
        );
        assert_eq!(
            pgpass_match("db1:5432:app", "db1", "5432", "app", "alice"),
            None
        );
        assert_eq!(
            pgpass_match("db1:5432:app:alice", "db1", "5432", "app", "alice"),
            None,
            "libpq needs the ':' before the password field"
        );
        assert_eq!(
            pgpass_match("db:5432:app:al:pw\r\n", "db", "5432", "app", "al").as_deref(),
            Some("pw")
        );
        assert_eq!(
            pgpass_match("db*:5432:app:al:pw", "db1", "5432", "app", "al"),
            None,
            "no globbing"
        );
    }

    #[test]
    fn pgpass_host_is_localhost_for_the_default_socket() {
        let t = |host: HostKind, hostaddr: Option<&str>| Target {
            host,
            hostaddr: hostaddr.map(|a| a.parse().unwrap()),
            port: 5432,
        };
        assert_eq!(
            pgpass_host(&t(HostKind::Unix(default_socket_dir()), None)),
            "localhost"
        );
        assert_eq!(
            pgpass_host(&t(HostKind::Unix("/srv/pg".into()), None)),
            "/srv/pg"
        );
        assert_eq!(
            pgpass_host(&t(HostKind::Tcp("db".into()), Some("10.0.0.1"))),
            "db"
        );
        assert_eq!(
            pgpass_host(&t(HostKind::Tcp(String::new()), Some("10.0.0.1"))),
            "10.0.0.1"
        );
    }

    #[test]
    fn password_file_strips_one_newline_and_refuses_loose_modes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        let write = |content: &str, mode: u32| {
            let mut f = std::fs::File::create(&path).unwrap();
            f.write_all(content.as_bytes()).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("s3cret\n\n", 0o600);
        assert_eq!(read_password_file(&path).unwrap().expose(), "s3cret\n");
        write("s3cret\r\n", 0o400);
        assert_eq!(read_password_file(&path).unwrap().expose(), "s3cret");
        write("s3cret", 0o640);
        let e = read_password_file(&path).unwrap_err().to_string();
        assert!(
            e.contains("readable by group or others") && !e.contains("s3cret"),
            "{e}"
        );
        write("s3cret", 0o604);
        assert!(read_password_file(&path).is_err());
        write("\n", 0o600);
        assert!(read_password_file(&path)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(read_password_file(dir.path()).is_err(), "a directory");
        assert!(read_password_file(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn sources_in_order_url_then_file_then_pgpass() {
        let url = ConnInfo::parse("host=h password=x").unwrap();
        assert_eq!(
            password_source(&url, Some(Path::new("/f"))),
            PasswordSource::Url
        );
        let bare = ConnInfo::parse("host=h passfile=/pp").unwrap();
        assert_eq!(
            password_source(&bare, Some(Path::new("/f"))),
            PasswordSource::File("/f".into())
        );
        assert_eq!(
            password_source(&bare, None),
            PasswordSource::Pgpass("/pp".into())
        );
    }
}
