//! Kubernetes resource quantities (`500m`, `4Gi`, `1.5`, `2e3`) as exact numbers, with what the webhook does with
//! them: sums, comparisons, and the roundings and the string form upstream's webhook writes into annotations.
//!
//! Hand-written: k8s-openapi keeps quantities as strings, no crate in the dependency tree parses them, and the
//! annotations must come out as apimachinery's `resource.Quantity` (the Go type upstream's webhook uses) makes
//! them. Its rules followed here:
//! - parsing rounds a value up (away from zero) to a whole number of nano units and caps its magnitude at
//!   2^63-1 units;
//! - sums and comparisons are exact;
//! - `Value()` is the whole number of units, rounded away from zero;
//! - the canonical decimal string has an integer mantissa and the largest SI suffix (or `eN`) that keeps it
//!   exact: `1500m`, `2`, `3k`.
//!
//! An amount is an `i128` count of nano units: that holds every parsed quantity exactly (at most ~9.2e27 nanos)
//! and sums of ten billion of the largest.

use std::fmt;

use crate::Error;

const NANOS_PER_UNIT: i128 = 1_000_000_000;
/// apimachinery caps every parsed quantity at 2^63-1 units.
const MAX_NANOS: i128 = i64::MAX as i128 * NANOS_PER_UNIT;
/// Significant digits kept of a mantissa; more are rounded up at the last kept digit. The API server sends
/// quantities in canonical form, whose mantissas have at most 19 digits unless a value above ten billion units
/// also has a fraction of a unit, where the rounding changes it by less than one part in 10^18.
const MAX_DIGITS: usize = 19;
/// The largest power of ten below 2^127, so `10^p` is computed without overflow.
const MAX_POW10: u32 = 38;
const MEBIBYTE: i128 = 1 << 20;

/// An exact resource quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

impl Quantity {
    pub const ZERO: Quantity = Quantity { nanos: 0 };

    /// Parses Kubernetes' quantity syntax: an optionally signed decimal number, then a binary suffix (`Ki` …
    /// `Ei`), a decimal SI suffix (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal exponent
    /// (`e3`, `E-2`).
    pub fn parse(text: &str) -> Result<Quantity, Error> {
        let fail = |problem| Error::Quantity {
            quantity: text.to_owned(),
            problem,
        };
        let (negative, unsigned) = match text.as_bytes().first() {
            Some(b'-') => (true, &text[1..]),
            Some(b'+') => (false, &text[1..]),
            _ => (false, text),
        };
        let number_end = unsigned
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(unsigned.len());
        let (number, suffix) = unsigned.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if fraction.contains('.') {
            return Err(fail("more than one decimal point"));
        }
        if whole.is_empty() && fraction.is_empty() {
            return Err(fail("no digits"));
        }
        let (binary_exponent, suffix_exponent) =
            suffix_exponents(suffix).ok_or_else(|| fail("unknown suffix"))?;

        let digits = format!("{whole}{fraction}");
        let significant = digits.trim_start_matches('0');
        let trimmed = significant.trim_end_matches('0');
        if trimmed.is_empty() {
            return Ok(Quantity::ZERO);
        }
        // The value is mantissa × 10^decimal_exponent × 2^binary_exponent.
        let mut decimal_exponent = i64::from(suffix_exponent)
            .saturating_sub(len_i64(fraction))
            .saturating_add(len_i64(significant) - len_i64(trimmed));
        let (kept, rest) = trimmed.split_at(trimmed.len().min(MAX_DIGITS));
        let mut mantissa: u128 = kept.parse().map_err(|_| fail("not a number"))?;
        if !rest.is_empty() {
            decimal_exponent = decimal_exponent.saturating_add(len_i64(rest));
            // `trimmed` ends in a non-zero digit, so something was cut off: round the magnitude up.
            mantissa += 1;
        }

        let nanos_exponent = decimal_exponent.saturating_add(9);
        let magnitude = if nanos_exponent >= 0 {
            u32::try_from(nanos_exponent)
                .ok()
                .filter(|p| *p <= MAX_POW10)
                .and_then(|p| mantissa.checked_mul(10u128.pow(p)))
                .and_then(|m| m.checked_mul(1u128 << binary_exponent))
                .map_or(MAX_NANOS, |m| i128::try_from(m).unwrap_or(MAX_NANOS))
        } else {
            // mantissa <= 10^19 < 2^64 and binary_exponent <= 60: the product fits.
            let scaled = mantissa << binary_exponent;
            match u32::try_from(nanos_exponent.unsigned_abs())
                .ok()
                .filter(|q| *q <= MAX_POW10)
            {
                Some(q) => {
                    let divisor = 10u128.pow(q);
                    let rounded_up = scaled / divisor + u128::from(!scaled.is_multiple_of(divisor));
                    i128::try_from(rounded_up).unwrap_or(MAX_NANOS)
                }
                // Less than one nano unit (scaled < 2^124 < 10^39): rounded up to one, as apimachinery does.
                None => 1,
            }
        };
        let magnitude = magnitude.min(MAX_NANOS);
        Ok(Quantity {
            nanos: if negative { -magnitude } else { magnitude },
        })
    }

    /// The exact sum, or `None` on overflow (past ~10^10 quantities of the largest size).
    pub fn checked_add(self, other: Quantity) -> Option<Quantity> {
        self.nanos
            .checked_add(other.nanos)
            .map(|nanos| Quantity { nanos })
    }

    pub fn is_zero(self) -> bool {
        self.nanos == 0
    }

    pub fn is_positive(self) -> bool {
        self.nanos > 0
    }

    /// Whole units, rounded away from zero (apimachinery's `Value()`): `200m` is 1, `1.5` is 2.
    pub fn value(self) -> i128 {
        let whole = self.nanos / NANOS_PER_UNIT;
        if self.nanos % NANOS_PER_UNIT == 0 {
            whole
        } else {
            whole + self.nanos.signum()
        }
    }

    /// This many bytes in MiB, rounded up (`RoundUpToMiB` of Kubernetes' cloud-provider volume helpers, which
    /// upstream's webhook uses): `None` at or above 2^63-1 bytes, where that helper fails.
    pub fn mebibytes_rounded_up(self) -> Option<i128> {
        if self.nanos >= MAX_NANOS {
            return None;
        }
        let bytes = self.value();
        // As in Go, `/` and `%` truncate toward zero; only a positive remainder rounds up.
        Some(bytes / MEBIBYTE + i128::from(bytes % MEBIBYTE > 0))
    }
}

impl std::str::FromStr for Quantity {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self, Error> {
        Quantity::parse(text)
    }
}

/// apimachinery's canonical decimal form: an integer mantissa with the largest exponent (a multiple of three)
/// that keeps it exact, written as an SI suffix or `eN`.
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let (mut mantissa, mut exponent) = (self.nanos, -9i32);
        while mantissa % 10 == 0 {
            mantissa /= 10;
            exponent += 1;
        }
        // Back down to a multiple of three; the mantissa stays no larger than the nanos it came from.
        let excess = exponent.rem_euclid(3);
        mantissa *= 10i128.pow(excess.unsigned_abs());
        exponent -= excess;
        match decimal_suffix(exponent) {
            Some(suffix) => write!(f, "{mantissa}{suffix}"),
            None => write!(f, "{mantissa}e{exponent}"),
        }
    }
}

/// (power of two, power of ten) a suffix stands for.
fn suffix_exponents(suffix: &str) -> Option<(u32, i32)> {
    let binary = match suffix {
        "Ki" => Some(10),
        "Mi" => Some(20),
        "Gi" => Some(30),
        "Ti" => Some(40),
        "Pi" => Some(50),
        "Ei" => Some(60),
        _ => None,
    };
    if let Some(power) = binary {
        return Some((power, 0));
    }
    let decimal = match suffix {
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "" => Some(0),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(power) = decimal {
        return Some((0, power));
    }
    // A decimal exponent: `e` or `E`, then a signed integer. (`E` alone is exa, matched above.)
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    exponent.parse().ok().map(|power| (0, power))
}

fn decimal_suffix(exponent: i32) -> Option<&'static str> {
    Some(match exponent {
        -9 => "n",
        -6 => "u",
        -3 => "m",
        0 => "",
        3 => "k",
        6 => "M",
        9 => "G",
        12 => "T",
        15 => "P",
        18 => "E",
        _ => return None,
    })
}

fn len_i64(s: &str) -> i64 {
    i64::try_from(s.len()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    fn nanos(text: &str) -> i128 {
        q(text).nanos
    }

    #[test]
    fn parses_every_suffix_kind() {
        assert_eq!(nanos("2"), 2 * NANOS_PER_UNIT);
        assert_eq!(nanos("500m"), 500_000_000);
        assert_eq!(nanos("0.5"), 500_000_000);
        assert_eq!(nanos(".5"), 500_000_000);
        assert_eq!(nanos("5."), 5 * NANOS_PER_UNIT);
        assert_eq!(nanos("+1"), NANOS_PER_UNIT);
        assert_eq!(nanos("-1500m"), -1_500_000_000);
        assert_eq!(nanos("3n"), 3);
        assert_eq!(nanos("7u"), 7_000);
        assert_eq!(nanos("1k"), 1_000 * NANOS_PER_UNIT);
        assert_eq!(nanos("1M"), 1_000_000 * NANOS_PER_UNIT);
        assert_eq!(nanos("2G"), 2_000_000_000 * NANOS_PER_UNIT);
        assert_eq!(nanos("1T"), 10i128.pow(12) * NANOS_PER_UNIT);
        assert_eq!(nanos("1P"), 10i128.pow(15) * NANOS_PER_UNIT);
        assert_eq!(nanos("1E"), 10i128.pow(18) * NANOS_PER_UNIT);
        assert_eq!(nanos("4Gi"), 4 * (1 << 30) * NANOS_PER_UNIT);
        assert_eq!(nanos("1.5Ki"), 1536 * NANOS_PER_UNIT);
        assert_eq!(nanos("1Ei"), (1i128 << 60) * NANOS_PER_UNIT);
        assert_eq!(nanos("2e3"), 2_000 * NANOS_PER_UNIT);
        assert_eq!(nanos("2E3"), 2_000 * NANOS_PER_UNIT);
        assert_eq!(nanos("2e+3"), 2_000 * NANOS_PER_UNIT);
        assert_eq!(nanos("25e-1"), 2_500_000_000);
        assert_eq!(nanos("0"), 0);
        assert_eq!(nanos("000.000Mi"), 0);
        assert_eq!(nanos("-0"), 0);
    }

    #[test]
    fn rounds_up_to_nano_units_and_caps_like_apimachinery() {
        assert_eq!(nanos("0.1n"), 1, "below a nano unit rounds up to one");
        assert_eq!(nanos("1e-30"), 1);
        assert_eq!(nanos("1e-2000000000"), 1);
        assert_eq!(nanos("-1.5n"), -2, "rounded away from zero");
        assert_eq!(nanos("1.0000000001"), NANOS_PER_UNIT + 1);
        assert_eq!(nanos("9223372036854775807"), MAX_NANOS);
        assert_eq!(nanos("9223372036854775808"), MAX_NANOS, "capped");
        assert_eq!(nanos("100Ei"), MAX_NANOS);
        assert_eq!(nanos("1e2000000000"), MAX_NANOS);
        assert_eq!(nanos("-1e40"), -MAX_NANOS);
        // More digits than are kept: rounded up at the last kept one.
        assert_eq!(nanos("1.00000000000000000000000001"), NANOS_PER_UNIT + 1);
        assert_eq!(
            nanos("12345678901.2345678901"),
            12_345_678_901_234_567_900,
            "19 significant digits kept, the rest rounds up"
        );
        assert_eq!(nanos("0.00000000000000000000000000000000000000001Ki"), 1);
    }

    #[test]
    fn refuses_what_is_not_a_quantity() {
        for text in [
            "",
            "+",
            "-",
            ".",
            "1..2",
            "1.2.3",
            "abc",
            "1K",
            "1ki",
            "1 Gi",
            " 1",
            "1e",
            "1e+",
            "1e1.5",
            "1Gi1",
            "1x",
            "0x10",
            "1e99999999999",
        ] {
            assert!(Quantity::parse(text).is_err(), "{text:?} parsed");
        }
        let error = Quantity::parse("12 cores").unwrap_err();
        assert_eq!(error.reason(), "InvalidQuantity");
        assert!(error.to_string().contains("\"12 cores\""), "{error}");
    }

    #[test]
    fn sums_and_comparisons_are_exact() {
        let sum = ["200m", "0.7", "1n"]
            .iter()
            .fold(Quantity::ZERO, |acc, t| acc.checked_add(q(t)).unwrap());
        assert_eq!(sum.nanos, 900_000_001);
        assert!(q("1500m") > q("1.499999999"));
        assert_eq!(
            q("1500m"),
            q("1.4999999999"),
            "the tenth decimal rounds up to the nano unit"
        );
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1k"), q("1000"));
        assert!(q("0").is_zero() && !q("0").is_positive() && q("1n").is_positive());
        let max = Quantity { nanos: i128::MAX };
        assert_eq!(max.checked_add(q("1n")), None);
    }

    #[test]
    fn value_rounds_away_from_zero() {
        assert_eq!(q("200m").value(), 1);
        assert_eq!(q("1500m").value(), 2);
        assert_eq!(q("1").value(), 1);
        assert_eq!(q("3").value(), 3);
        assert_eq!(q("1.2").value(), 2);
        assert_eq!(q("0").value(), 0);
        assert_eq!(q("-200m").value(), -1);
        assert_eq!(q("1k").value(), 1000);
    }

    #[test]
    fn mebibytes_round_up_and_refuse_int64_overflow() {
        assert_eq!(q("4Gi").mebibytes_rounded_up(), Some(4096));
        assert_eq!(q("5Gi").mebibytes_rounded_up(), Some(5120));
        assert_eq!(
            q("1").mebibytes_rounded_up(),
            Some(1),
            "one byte is one MiB"
        );
        assert_eq!(q("1Mi").mebibytes_rounded_up(), Some(1));
        assert_eq!(q("1048577").mebibytes_rounded_up(), Some(2));
        assert_eq!(
            q("1G").mebibytes_rounded_up(),
            Some(954),
            "10^9 / 2^20 = 953.67"
        );
        assert_eq!(q("128974848").mebibytes_rounded_up(), Some(123));
        assert_eq!(
            q("0.5").mebibytes_rounded_up(),
            Some(1),
            "half a byte is a byte"
        );
        assert_eq!(q("0").mebibytes_rounded_up(), Some(0));
        assert_eq!(q("-3Mi").mebibytes_rounded_up(), Some(-3));
        assert_eq!(q("7Ei").mebibytes_rounded_up(), Some(7 << 40));
        assert_eq!(
            q("9223372036854775806").mebibytes_rounded_up(),
            Some(1 << 43)
        );
        assert_eq!(q("9223372036854775807").mebibytes_rounded_up(), None);
        assert_eq!(q("8Ei").mebibytes_rounded_up(), None);
    }

    #[test]
    fn canonical_decimal_form() {
        for (input, canonical) in [
            ("0", "0"),
            ("1", "1"),
            ("2", "2"),
            ("1500m", "1500m"),
            ("1.5", "1500m"),
            ("0.1", "100m"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("2e3", "2k"),
            ("1Ki", "1024"),
            ("1Mi", "1048576"),
            ("10n", "10n"),
            ("1200u", "1200u"),
            ("0.001", "1m"),
            ("-2", "-2"),
            ("-0.5", "-500m"),
            ("1E", "1E"),
            ("5e18", "5E"),
            ("123e18", "9223372036854775807"),
        ] {
            assert_eq!(q(input).to_string(), canonical, "{input}");
        }
        let huge = q("9E")
            .checked_add(q("9E"))
            .unwrap()
            .checked_add(q("2E"))
            .unwrap();
        assert_eq!(huge.to_string(), "20E");
        let beyond_exa = Quantity {
            nanos: 10i128.pow(21 + 9),
        };
        assert_eq!(beyond_exa.to_string(), "1e21");
        assert_eq!("500m".parse::<Quantity>().unwrap(), q("0.5"));
    }
}
