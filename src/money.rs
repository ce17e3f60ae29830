//! Money: ISO 4217 currencies with their real minor units (from `iso_currency`), and the exact
//! conversion between decimal strings in major units (`"100.50"`) and integer minor units
//! (`10050`). No floating point anywhere: amounts are parsed digit by digit with checked
//! arithmetic, so every accepted spelling of an amount maps to exactly one integer.

use std::fmt;

/// Longest decimal string accepted for an amount. i64 has 19 digits; the bound only keeps
/// absurd inputs from being scanned.
pub const MAX_AMOUNT_CHARS: usize = 40;

/// A currency orders can use: an ISO 4217 code that has a minor unit (so not XAU, XDR, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency {
    iso: iso_currency::Currency,
    minor_digits: u8,
}

/// Why a currency code was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CurrencyError {
    /// Not three ASCII letters naming an ISO 4217 currency.
    #[error("is not an ISO 4217 currency code")]
    Unknown,
    /// An ISO 4217 code without a minor unit (precious metals, fund codes, ...).
    #[error("has no minor unit and cannot be used for orders")]
    NoMinorUnit,
}

impl Currency {
    /// Looks up a code case-insensitively (`"cny"` is CNY). Surrounding spaces are not trimmed.
    pub fn parse(code: &str) -> Result<Self, CurrencyError> {
        if code.len() != 3 || !code.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(CurrencyError::Unknown);
        }
        let upper = code.to_ascii_uppercase();
        let iso = iso_currency::Currency::from_code(&upper).ok_or(CurrencyError::Unknown)?;
        let digits = iso.exponent().ok_or(CurrencyError::NoMinorUnit)?;
        let minor_digits = u8::try_from(digits).map_err(|_| CurrencyError::NoMinorUnit)?;
        if minor_digits > 18 {
            return Err(CurrencyError::NoMinorUnit);
        }
        Ok(Self { iso, minor_digits })
    }

    /// The upper-case ISO 4217 code.
    pub fn code(&self) -> &'static str {
        self.iso.code()
    }

    /// Digits after the decimal point: JPY 0, CNY 2, KWD 3.
    pub fn minor_digits(&self) -> u8 {
        self.minor_digits
    }

    /// `amount_minor` as a decimal string with exactly this currency's minor digits.
    pub fn format(&self, amount_minor: i64) -> String {
        format_minor(amount_minor, self.minor_digits)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Why a decimal amount was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    /// Not of the form `123` or `123.45` (no sign, exponent, spaces or separators).
    #[error("must be a decimal string of digits with an optional fraction, e.g. \"100.00\"")]
    Malformed,
    /// More fraction digits than the currency has.
    #[error("has more decimals than {currency} allows ({max})")]
    TooManyDecimals {
        /// The currency.
        currency: &'static str,
        /// Its minor digits.
        max: u8,
    },
    /// Longer than [`MAX_AMOUNT_CHARS`].
    #[error("is longer than 40 characters")]
    TooLong,
    /// Zero.
    #[error("must be greater than zero")]
    Zero,
    /// Beyond i64 minor units.
    #[error("is too large (more than 9223372036854775807 minor units)")]
    TooLarge,
}

/// Parses a decimal string in major units into minor units of `currency`: `"100"`, `"100.0"` and
/// `"100.00"` are all 10000 in CNY. Leading zeros are accepted (`"007.5"`); a sign, an exponent,
/// a leading or trailing point, spaces and thousands separators are not. The result is > 0.
pub fn parse_amount(text: &str, currency: Currency) -> Result<i64, AmountError> {
    if text.len() > MAX_AMOUNT_CHARS {
        return Err(AmountError::TooLong);
    }
    if !is_decimal(text) {
        return Err(AmountError::Malformed);
    }
    let (int_part, frac_part) = match text.split_once('.') {
        Some((i, f)) => (i, f),
        None => (text, ""),
    };
    let digits = usize::from(currency.minor_digits());
    if frac_part.len() > digits {
        return Err(AmountError::TooManyDecimals {
            currency: currency.code(),
            max: currency.minor_digits(),
        });
    }
    let mut value: i64 = 0;
    let padding = digits - frac_part.len();
    let all_digits = int_part
        .bytes()
        .chain(frac_part.bytes())
        .chain(std::iter::repeat_n(b'0', padding));
    for b in all_digits {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(b - b'0')))
            .ok_or(AmountError::TooLarge)?;
    }
    if value == 0 {
        return Err(AmountError::Zero);
    }
    Ok(value)
}

/// `123` or `123.45`: ASCII digits, at most one point with digits on both sides.
fn is_decimal(text: &str) -> bool {
    let (int_part, frac_part) = match text.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (text, None),
    };
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    all_digits(int_part) && frac_part.is_none_or(all_digits)
}

/// Formats minor units with `digits` decimals: `format_minor(10050, 2) == "100.50"`,
/// `format_minor(5, 3) == "0.005"`, `format_minor(7, 0) == "7"`. Negative values keep their sign.
pub fn format_minor(amount_minor: i64, digits: u8) -> String {
    let digits = usize::from(digits);
    let sign = if amount_minor < 0 { "-" } else { "" };
    let magnitude = amount_minor.unsigned_abs().to_string();
    if digits == 0 {
        return format!("{sign}{magnitude}");
    }
    let padded = format!("{magnitude:0>width$}", width = digits + 1);
    let (int_part, frac_part) = padded.split_at(padded.len() - digits);
    format!("{sign}{int_part}.{frac_part}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cur(code: &str) -> Currency {
        Currency::parse(code).unwrap()
    }

    #[test]
    fn real_minor_units() {
        assert_eq!(cur("JPY").minor_digits(), 0);
        assert_eq!(cur("cny").minor_digits(), 2);
        assert_eq!(cur("Kwd").minor_digits(), 3);
        assert_eq!(cur("cny").code(), "CNY");
        assert_eq!(Currency::parse("XAU"), Err(CurrencyError::NoMinorUnit));
        assert_eq!(Currency::parse("ZZZ"), Err(CurrencyError::Unknown));
        assert_eq!(Currency::parse(" CNY"), Err(CurrencyError::Unknown));
        assert_eq!(Currency::parse("ÇNY"), Err(CurrencyError::Unknown));
    }

    #[test]
    fn spellings_of_one_amount_agree() {
        let cny = cur("CNY");
        for s in ["100", "100.0", "100.00", "0100.00"] {
            assert_eq!(parse_amount(s, cny), Ok(10000), "{s}");
        }
        assert_eq!(parse_amount("0.01", cny), Ok(1));
        assert_eq!(parse_amount("1.5", cur("KWD")), Ok(1500));
        assert_eq!(parse_amount("15", cur("JPY")), Ok(15));
    }

    #[test]
    fn refusals() {
        let cny = cur("CNY");
        let jpy = cur("JPY");
        for s in [
            "", " 1", "1 ", "+1", "-1", "1e3", "1.", ".5", "1,000", "1..0", "١", "0x10", "NaN",
        ] {
            assert_eq!(parse_amount(s, cny), Err(AmountError::Malformed), "{s:?}");
        }
        assert!(matches!(
            parse_amount("1.234", cny),
            Err(AmountError::TooManyDecimals { max: 2, .. })
        ));
        assert!(matches!(
            parse_amount("1.0", jpy),
            Err(AmountError::TooManyDecimals { max: 0, .. })
        ));
        assert_eq!(parse_amount("0", cny), Err(AmountError::Zero));
        assert_eq!(parse_amount("0.00", cny), Err(AmountError::Zero));
        assert_eq!(parse_amount("92233720368547758.07", cny), Ok(i64::MAX));
        assert_eq!(
            parse_amount("92233720368547758.08", cny),
            Err(AmountError::TooLarge)
        );
        assert_eq!(
            parse_amount(&"9".repeat(30), cny),
            Err(AmountError::TooLarge)
        );
        assert_eq!(
            parse_amount(&"9".repeat(41), cny),
            Err(AmountError::TooLong)
        );
    }

    #[test]
    fn formatting() {
        assert_eq!(format_minor(10050, 2), "100.50");
        assert_eq!(format_minor(5, 3), "0.005");
        assert_eq!(format_minor(7, 0), "7");
        assert_eq!(format_minor(i64::MAX, 2), "92233720368547758.07");
        assert_eq!(format_minor(-5, 2), "-0.05");
    }

    proptest! {
        #[test]
        fn format_then_parse_is_identity(minor in 1..=i64::MAX, code in prop::sample::select(vec!["JPY", "CNY", "KWD", "USD", "CLF"])) {
            let c = cur(code);
            prop_assert_eq!(parse_amount(&c.format(minor), c), Ok(minor));
        }

        #[test]
        fn trailing_zeros_and_leading_zeros_do_not_change_the_amount(
            int_part in 0u64..1_000_000_000, frac in 0u32..100, lead in 0usize..3, trail in 0usize..1
        ) {
            let c = cur("CNY");
            let base = format!("{int_part}.{frac:02}");
            let expected = parse_amount(&base, c);
            let respelled = format!("{}{base}", "0".repeat(lead));
            prop_assert_eq!(parse_amount(&respelled, c), expected.clone());
            if frac % 10 == 0 && trail == 0 {
                let shorter = format!("{int_part}.{}", frac / 10);
                prop_assert_eq!(parse_amount(&shorter, c), expected);
            }
        }

        #[test]
        fn never_panics_and_accepts_only_positive_values(s in "\\PC{0,45}") {
            if let Ok(v) = parse_amount(&s, cur("CNY")) {
                prop_assert!(v > 0);
                prop_assert!(s.bytes().all(|b| b.is_ascii_digit() || b == b'.'));
            }
        }
    }
}
