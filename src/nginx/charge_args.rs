//! The pure half of `sluice_charge`: when a charge applies (`if=`), the
//! weight it counts from a variable's value, and what
//! `$sluice_charge_status` says. The log-phase glue is `charge.rs`.

use super::args::{runtime_weight, EmptyWeight, WeightError};

/// Whether an `if=` value lets a charge run: as `access_log ... if=`,
/// an empty value or "0" means no.
pub fn charge_condition(value: &[u8]) -> bool {
    !value.is_empty() && value != b"0"
}

/// The units a charge counts from its weight variable's value: `None`
/// for an empty value (the variable has no value, e.g. an upstream that
/// sent no cost header or closed early: nothing is charged, and with
/// `settle` the estimate stands), an error for a value that is no
/// non-negative integer (counted and logged; the response is gone, so
/// nothing is rejected). Large values count as 2^40, as a check's do.
pub fn charge_weight(value: &[u8]) -> Result<Option<u64>, WeightError> {
    if value.is_empty() {
        return Ok(None);
    }
    runtime_weight(value, EmptyWeight::Reject).map(Some)
}

/// What `$sluice_charge_status` says about a request's charges. With
/// several `sluice_charge` directives, the variable shows the one that
/// tells the most: the later variants here win over the earlier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum ChargeStatus {
    /// No `sluice_charge` applied (the variable is not found).
    Uncharged = 0,
    /// `if=` said no, the weight was empty, or the request's `sluice`
    /// checks rejected it: nothing counted.
    Skipped = 1,
    /// No quota has the name: nothing counted.
    Unknown = 2,
    /// The quota is per-key and the key was empty: nothing counted.
    NoKey = 3,
    /// The key found no entry (a full key section): counted as
    /// `sluice_key_overflow` counts a passed check, or not at all.
    KeyOverflow = 4,
    /// The weight was counted, in full, whatever the quota's level.
    Charged = 5,
    /// `settle`: the difference from the request's estimate was counted
    /// (or, below it, given back).
    Settled = 6,
    /// The weight was no number: nothing counted; counted among the
    /// weight errors and logged.
    InvalidWeight = 7,
}

impl ChargeStatus {
    /// The variable's value; empty when no charge applied.
    pub fn as_str(self) -> &'static str {
        match self {
            ChargeStatus::Uncharged => "",
            ChargeStatus::Skipped => "SKIPPED",
            ChargeStatus::Unknown => "UNKNOWN",
            ChargeStatus::NoKey => "NO_KEY",
            ChargeStatus::KeyOverflow => "KEY_OVERFLOW",
            ChargeStatus::Charged => "CHARGED",
            ChargeStatus::Settled => "SETTLED",
            ChargeStatus::InvalidWeight => "INVALID_WEIGHT",
        }
    }

    /// The status of a request whose charges so far said `self`, after
    /// one more said `next`.
    pub fn and(self, next: ChargeStatus) -> ChargeStatus {
        self.max(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_is_false_only_when_empty_or_zero() {
        assert!(!charge_condition(b""));
        assert!(!charge_condition(b"0"));
        assert!(charge_condition(b"1"));
        assert!(charge_condition(b"00"));
        assert!(charge_condition(b"yes"));
    }

    #[test]
    fn an_empty_weight_charges_nothing_and_garbage_is_an_error() {
        assert_eq!(charge_weight(b""), Ok(None));
        assert_eq!(charge_weight(b"0"), Ok(Some(0)));
        assert_eq!(charge_weight(b"1234"), Ok(Some(1234)));
        assert_eq!(charge_weight(b"99999999999999999999"), Ok(Some(1 << 40)));
        for bad in [&b"-5"[..], b"1.5", b" 5", b"12k", b"0x10"] {
            assert_eq!(charge_weight(bad), Err(WeightError::Invalid), "{bad:?}");
        }
    }

    #[test]
    fn several_charges_show_the_most_telling_status() {
        let s = ChargeStatus::Uncharged.and(ChargeStatus::Skipped);
        assert_eq!(s.and(ChargeStatus::Charged).as_str(), "CHARGED");
        assert_eq!(
            ChargeStatus::Charged.and(ChargeStatus::Unknown),
            ChargeStatus::Charged
        );
        assert_eq!(
            ChargeStatus::Settled
                .and(ChargeStatus::InvalidWeight)
                .as_str(),
            "INVALID_WEIGHT"
        );
    }
}
