//! Bearer-token authentication: the tokens file (SHA-256 digests only, never plain tokens), the
//! constant-time lookup of a presented token, and what a principal may do (permissions and
//! approval limits).
//!
//! ```toml
//! [[token]]
//! sha256 = "<hex SHA-256 of the token>"
//! tenant = "acme"
//! principal = "alice"
//! permissions = ["orders:create", "orders:read"]
//! approval_limit = "5000.00 CNY"          # or a list, one per currency; omit for no limit
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::money::{self, Currency};
use crate::toml_diagnostic::{self, Stage};

/// Longest tenant or principal name accepted in the tokens file.
pub const MAX_NAME_CHARS: usize = 255;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// `orders:create`: `POST /v1/orders` (replays included) and `GET /v1/idempotency-keys/{key}`.
    CreateOrders,
    /// `orders:read`: `GET /v1/orders/{order_id}` for orders of the token's tenant.
    ReadOrders,
}

impl Permission {
    /// Every permission, with its name in the tokens file.
    pub const ALL: [(Permission, &'static str); 2] = [
        (Permission::CreateOrders, "orders:create"),
        (Permission::ReadOrders, "orders:read"),
    ];

    /// The name used in the tokens file.
    pub fn name(self) -> &'static str {
        match self {
            Permission::CreateOrders => "orders:create",
            Permission::ReadOrders => "orders:read",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Permission::CreateOrders => 1,
            Permission::ReadOrders => 2,
        }
    }
}

/// The authenticated caller: the scope of its idempotency records and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Tenant: the scope's first part; orders are visible tenant-wide.
    pub tenant: String,
    /// Principal within the tenant: the scope's second part.
    pub principal: String,
    permissions: u8,
    /// `None`: no limit. `Some(list)`: at most this many minor units per currency; a currency not
    /// listed cannot be approved at all.
    approval_limits: Option<Vec<(Currency, i64)>>,
    /// `tenant` NUL `principal`: the rate limiter's key (tokens of one principal share a budget).
    rate_key: Arc<str>,
}

/// What the approval limit says about an amount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    /// Within the limit, or the principal has none.
    Approved,
    /// Over the limit in this currency (`limit_minor`), or no limit exists in the currency
    /// (`None`) while limits exist in others.
    Exceeded {
        /// The limit in minor units, when the currency has one.
        limit_minor: Option<i64>,
    },
}

impl Principal {
    /// Whether the token carries `permission`.
    pub fn may(&self, permission: Permission) -> bool {
        self.permissions & permission.bit() != 0
    }

    /// Checks an amount against the principal's approval limit. An amount equal to the limit is
    /// approved.
    pub fn approve(&self, amount_minor: i64, currency: Currency) -> Approval {
        let Some(limits) = &self.approval_limits else {
            return Approval::Approved;
        };
        match limits.iter().find(|(c, _)| *c == currency) {
            Some((_, limit)) if amount_minor <= *limit => Approval::Approved,
            Some((_, limit)) => Approval::Exceeded {
                limit_minor: Some(*limit),
            },
            None => Approval::Exceeded { limit_minor: None },
        }
    }

    /// The rate limiter's key for this principal.
    pub fn rate_key(&self) -> &Arc<str> {
        &self.rate_key
    }
}

/// Why the tokens file was refused. The previous set stays in force on reload.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file could not be read.
    #[error("cannot read tokens file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, an unknown key, or a wrong type.
    #[error("invalid tokens file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where (line, column, key) and what kind of mistake; never the line's text or a value
        /// ([`crate::toml_diagnostic`]).
        message: String,
    },
    /// An entry's value is not acceptable.
    #[error(
        "invalid tokens file {path}: [[token]] entry {index} ({tenant}/{principal}): {reason}"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based entry number.
        index: usize,
        /// The entry's tenant, for finding it.
        tenant: String,
        /// The entry's principal.
        principal: String,
        /// Why.
        reason: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    token: Vec<RawToken>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    sha256: String,
    tenant: String,
    principal: String,
    #[serde(default)]
    permissions: Vec<String>,
    #[serde(default)]
    approval_limit: Option<OneOrMany>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The loaded tokens: digest → principal, searched in constant time.
#[derive(Debug, Default)]
pub struct TokenSet {
    digests: Vec<[u8; 32]>,
    principals: Vec<Arc<Principal>>,
}

impl TokenSet {
    /// Reads and validates a tokens file.
    pub fn load(path: &Path) -> Result<Self, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|source| TokensError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Validates the text of a tokens file (`path` only names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, TokensError> {
        // Syntax first, then types, each described by line, column and key only: a misplaced
        // line may hold a bearer token in clear.
        let parse_error = |problem: toml_diagnostic::TomlProblem| TokensError::Parse {
            path: path.to_owned(),
            message: problem.to_string(),
        };
        text.parse::<toml::Table>()
            .map_err(|e| parse_error(toml_diagnostic::describe(&e, Some(text), Stage::Syntax)))?;
        let raw: RawFile = toml::from_str(text)
            .map_err(|e| parse_error(toml_diagnostic::describe(&e, Some(text), Stage::Types)))?;
        let mut set = TokenSet::default();
        for (i, t) in raw.token.into_iter().enumerate() {
            let invalid = |reason: String| TokensError::Invalid {
                path: path.to_owned(),
                index: i + 1,
                tenant: t.tenant.clone(),
                principal: t.principal.clone(),
                reason,
            };
            let digest = parse_digest(&t.sha256).map_err(&invalid)?;
            if set.digests.contains(&digest) {
                return Err(invalid(
                    "the same sha256 appears in an earlier entry".into(),
                ));
            }
            for (what, name) in [("tenant", &t.tenant), ("principal", &t.principal)] {
                check_name(name).map_err(|r| invalid(format!("{what} {r}")))?;
            }
            let mut permissions = 0;
            for p in &t.permissions {
                let Some((perm, _)) = Permission::ALL.iter().find(|(_, n)| n == p) else {
                    return Err(invalid(format!(
                        "unknown permission {p:?} (known: orders:create, orders:read)"
                    )));
                };
                permissions |= perm.bit();
            }
            let approval_limits = match &t.approval_limit {
                None => None,
                Some(OneOrMany::One(s)) => Some(vec![parse_limit(s).map_err(&invalid)?]),
                Some(OneOrMany::Many(list)) => {
                    let mut limits: Vec<(Currency, i64)> = Vec::new();
                    for s in list {
                        let limit = parse_limit(s).map_err(&invalid)?;
                        if limits.iter().any(|(c, _)| *c == limit.0) {
                            return Err(invalid(format!("approval_limit names {} twice", limit.0)));
                        }
                        limits.push(limit);
                    }
                    Some(limits)
                }
            };
            let rate_key: Arc<str> = format!("{}\0{}", t.tenant, t.principal).into();
            set.digests.push(digest);
            set.principals.push(Arc::new(Principal {
                tenant: t.tenant,
                principal: t.principal,
                permissions,
                approval_limits,
                rate_key,
            }));
        }
        Ok(set)
    }

    /// The principal a presented bearer token belongs to. The token is hashed and the digest
    /// compared with every stored digest in constant time (no early exit), so timing reveals
    /// neither which entry matched nor how much of a digest did.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Principal>> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = u64::MAX;
        for (i, digest) in self.digests.iter().enumerate() {
            let index = u64::try_from(i).unwrap_or(u64::MAX);
            found.conditional_assign(&index, same_digest(digest, &presented));
        }
        usize::try_from(found)
            .ok()
            .and_then(|i| self.principals.get(i))
            .cloned()
    }

    /// How many tokens are loaded.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no token is loaded (every request then gets 401).
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }
}

/// Whether two digests are equal, in constant time: every byte's difference is folded in
/// without a branch, and only the fold meets `subtle`'s barrier — one barrier per digest, where
/// `[u8]::ct_eq` puts one on every byte (with 16 tokens, 60 % of authentication's instructions
/// per request, for the same guarantee).
fn same_digest(stored: &[u8; 32], presented: &[u8; 32]) -> subtle::Choice {
    let difference = stored
        .iter()
        .zip(presented)
        .fold(0u8, |folded, (a, b)| folded | (a ^ b));
    difference.ct_eq(&0)
}

/// The hex SHA-256 digest of a token, as the tokens file stores it.
pub fn token_digest_hex(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

fn parse_digest(text: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(text.trim())
        .map_err(|_| "sha256 must be 64 hexadecimal characters".to_owned())?;
    bytes
        .try_into()
        .map_err(|_| "sha256 must be 64 hexadecimal characters (32 bytes)".to_owned())
}

fn check_name(name: &str) -> Result<(), String> {
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(format!("must be 1 to {MAX_NAME_CHARS} characters"));
    }
    if name.chars().any(|c| c.is_control()) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// `"5000.00 CNY"` → (CNY, 500000).
fn parse_limit(text: &str) -> Result<(Currency, i64), String> {
    let mut parts = text.split_whitespace();
    let (Some(amount), Some(code), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!(
            "approval_limit {text:?} must look like \"5000.00 CNY\" (amount, space, currency)"
        ));
    };
    let currency =
        Currency::parse(code).map_err(|e| format!("approval_limit currency {code:?} {e}"))?;
    let minor = money::parse_amount(amount, currency)
        .map_err(|e| format!("approval_limit amount {amount:?} {e}"))?;
    Ok((currency, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(text: &str) -> Result<TokenSet, TokensError> {
        TokenSet::parse(text, Path::new("tokens.toml"))
    }

    fn entry(token: &str, extra: &str) -> String {
        format!(
            "[[token]]\nsha256 = \"{}\"\ntenant = \"acme\"\nprincipal = \"p-{token}\"\n{extra}\n",
            token_digest_hex(token)
        )
    }

    #[test]
    fn lookup_permissions_and_limits() {
        let text = entry(
            "alpha",
            "permissions = [\"orders:create\"]\napproval_limit = [\"5000.00 CNY\", \"100 JPY\"]",
        ) + &entry("beta", "permissions = [\"orders:read\"]");
        let s = set(&text).unwrap();
        assert_eq!(s.len(), 2);
        let a = s.authenticate("alpha").unwrap();
        assert_eq!(a.principal, "p-alpha");
        assert!(a.may(Permission::CreateOrders) && !a.may(Permission::ReadOrders));
        let cny = Currency::parse("CNY").unwrap();
        assert_eq!(a.approve(500_000, cny), Approval::Approved);
        assert_eq!(
            a.approve(500_001, cny),
            Approval::Exceeded {
                limit_minor: Some(500_000)
            }
        );
        assert_eq!(
            a.approve(1, Currency::parse("USD").unwrap()),
            Approval::Exceeded { limit_minor: None }
        );
        let b = s.authenticate("beta").unwrap();
        assert_eq!(b.approve(i64::MAX, cny), Approval::Approved, "no limit");
        assert!(s.authenticate("gamma").is_none());
        assert!(s.authenticate("").is_none());
    }

    #[test]
    fn bad_files_name_the_problem() {
        for (text, needle) in [
            (
                "[[token]]\nsha256 = \"zz\"\ntenant = \"a\"\nprincipal = \"b\"\n",
                "hexadecimal",
            ),
            (
                &entry("x", "permissions = [\"orders:delete\"]"),
                "orders:delete",
            ),
            (&entry("x", "approval_limit = \"5000 ZZZ\""), "ZZZ"),
            (&entry("x", "approval_limit = \"5000.001 CNY\""), "decimals"),
            (
                &entry("x", "approval_limit = [\"1 CNY\", \"2 CNY\"]"),
                "twice",
            ),
            (&entry("x", "colour = \"red\""), "colour"),
            (&(entry("x", "") + &entry("x", "")), "earlier entry"),
            ("[[token]]\nsha256 = \"00\"\n", "tenant"),
        ] {
            let e = set(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        let e = set(&entry("x", "").replace("acme", ""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tenant must be"), "{e}");
    }

    #[test]
    fn parse_errors_never_quote_a_token() {
        let token = "raw-bearer-t0ken-abc";
        let valid = entry("x", "");
        for (text, line) in [
            // The raw token pasted as a top-level key, or in place of the digest's quotes.
            (format!("token = \"{token}\"\n"), 1),
            (format!("{valid}token = \"{token}\"\n"), 6),
            (format!("[[token]]\nsha256 = {token}\n"), 2),
            (
                format!("[[token]]\nsha256 = \"{token}\ntenant = \"a\"\n"),
                2,
            ),
            (format!("[[token]]\nsha256 = [\"{token}\"]\n"), 2),
            (format!("{token}\n"), 1),
        ] {
            let e = set(&text).unwrap_err();
            let shown = format!("{e} / {e:?}");
            assert!(!shown.contains(token), "{text:?}: {shown}");
            assert!(
                shown.contains(&format!("line {line}, column")),
                "{text:?}: {shown}"
            );
        }
        assert_eq!(
            set(&format!("token = \"{token}\"\n"))
                .unwrap_err()
                .to_string(),
            "invalid tokens file tokens.toml: line 1, column 9, key `token`: wrong type: found \
             string, expected a sequence"
        );
    }

    #[test]
    fn shipped_example_tokens_file_is_valid_and_matches_the_documented_tokens() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/tokens.toml");
        let s = TokenSet::load(&path).unwrap();
        let alice = s.authenticate("example-acme-alice-token").unwrap();
        assert_eq!(
            (alice.tenant.as_str(), alice.principal.as_str()),
            ("acme", "alice")
        );
        assert!(alice.may(Permission::CreateOrders) && alice.may(Permission::ReadOrders));
        assert!(s.authenticate("example-acme-bob-token").is_some());
        assert!(s.authenticate("example-globex-carol-token").is_some());
        let auditor = s.authenticate("example-acme-auditor-token").unwrap();
        assert!(!auditor.may(Permission::CreateOrders) && auditor.may(Permission::ReadOrders));
    }
}
