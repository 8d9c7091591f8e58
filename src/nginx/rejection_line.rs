//! The text of a rejection's log line: the quota that rejected, the limit
//! that applied to the request in the quota's own terms, and what decided
//! when it was not the quota's level alone (a key's override, a penalty,
//! every slot of an in-flight quota held). Pure: `cargo test` covers it
//! without nginx; `answer.rs` logs it.

use std::fmt;

use crate::core::key::KeyHash;
use crate::core::{Terms, Wait};
use crate::table::Cause;

/// What a key's override of a per-key template says, as the log line
/// tells it (read from the table's tier section for the rejected key).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyOverride {
    /// The key counts with its own numbers instead of the template's.
    Limit {
        /// The key's limit.
        limit: f64,
        /// The key's high burst.
        burst: f64,
        /// The template's high burst.
        template_burst: f64,
    },
    /// The key is never limited by the template.
    Allow,
    /// Every request of the key is refused.
    Deny,
}

/// A rejection as the log line tells it. Displayed, it is the line after
/// `sluice: `.
#[derive(Clone, Copy, Debug)]
pub struct RejectionLine<'a> {
    /// `sluice_dry_run on`: the request was let through.
    pub dry_run: bool,
    /// The quota that rejected.
    pub quota: &'a str,
    /// The quota the directive named (the same, or a descendant).
    pub checked: &'a str,
    /// The request's weight on it.
    pub weight: u64,
    /// The terms of the quota that rejected (for a key's counter: its
    /// template's), when its slot could be read.
    pub terms: Option<Terms>,
    /// The limit the table applied, when the terms could not be read.
    pub limit: f64,
    /// When the request could pass, or why waiting cannot help.
    pub wait: Wait,
    /// Why it was rejected.
    pub cause: Cause,
    /// The key's hash when a key's counter rejected; 0 otherwise.
    pub key: KeyHash,
    /// The key's override, when it has one.
    pub key_override: Option<KeyOverride>,
}

impl RejectionLine<'_> {
    /// The limit that applied to this request, in the quota's terms: a
    /// key's own when an override gives it one.
    fn applied(&self) -> Option<Terms> {
        let terms = self.terms?;
        Some(match self.key_override {
            Some(KeyOverride::Limit { limit, .. }) => Terms { limit, ..terms },
            _ => terms,
        })
    }
}

impl fmt::Display for RejectionLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.dry_run { ", dry run," } else { "" };
        write!(f, "limiting requests{how} by quota \"{}\"", self.quota)?;
        if self.checked != self.quota {
            write!(f, ", an ancestor of \"{}\"", self.checked)?;
        }
        // Only the key's hash: keys are secrets or personal data.
        if self.key != 0 {
            write!(f, " key {:016x}", self.key)?;
        }
        f.write_str(" (limit ")?;
        match self.applied() {
            Some(terms) => write!(f, "{terms}")?,
            None => write!(f, "{}", self.limit)?,
        }
        if let (
            Some(KeyOverride::Limit {
                burst,
                template_burst,
                ..
            }),
            Some(template),
        ) = (self.key_override, self.terms)
        {
            write!(
                f,
                ", burst {burst}, by the key's override; the template's is {template}, \
                 burst {template_burst}"
            )?;
        }
        write!(f, ", weight {})", self.weight)?;
        let in_flight = self.terms.is_some_and(|t| t.in_flight);
        let whose = if self.key != 0 { "key" } else { "quota" };
        match (self.cause, self.wait) {
            (Cause::Denied, _) => f.write_str(": an override denies the key"),
            (Cause::Penalty, Wait::Seconds(seconds)) => write!(
                f,
                ": a penalty bars the {whose} for {:.0} s more",
                seconds.ceil()
            ),
            (Cause::Penalty, Wait::Never(_)) => write!(f, ": a penalty bars the {whose}"),
            (Cause::Limit, _) if in_flight => {
                let at_once = self.applied().map_or(self.limit, |t| t.limit);
                write!(f, ": {at_once} at once, all held")
            }
            (Cause::Limit, Wait::Never(why)) => write!(f, ": it can never pass, {why}"),
            (Cause::Limit, Wait::Seconds(_)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Never, Window};

    fn leaky(limit: f64, per_key: bool) -> Terms {
        Terms {
            limit,
            per_key,
            ..Terms::default()
        }
    }

    fn line(terms: Terms) -> RejectionLine<'static> {
        RejectionLine {
            dry_run: false,
            quota: "api",
            checked: "api",
            weight: 1,
            terms: Some(terms),
            limit: terms.limit,
            wait: Wait::Seconds(0.5),
            cause: Cause::Limit,
            key: 0,
            key_override: None,
        }
    }

    #[test]
    fn a_plain_rejection_names_the_quota_its_limit_and_the_weight() {
        assert_eq!(
            line(leaky(5.0, false)).to_string(),
            "limiting requests by quota \"api\" (limit 5 /s, weight 1)"
        );
        let ancestor = RejectionLine {
            quota: "parent",
            dry_run: true,
            weight: 3,
            ..line(leaky(0.001, false))
        };
        assert_eq!(
            ancestor.to_string(),
            "limiting requests, dry run, by quota \"parent\", an ancestor of \"api\" \
             (limit 0.001 /s, weight 3)"
        );
        let never = RejectionLine {
            wait: Wait::Never(Never::OverHighBurst { high_burst: 10.0 }),
            weight: 11,
            ..line(leaky(0.001, false))
        };
        assert_eq!(
            never.to_string(),
            "limiting requests by quota \"api\" (limit 0.001 /s, weight 11): it can never \
             pass, the weight is above the quota's high_burst 10"
        );
    }

    #[test]
    fn an_in_flight_rejection_says_every_slot_is_held_not_that_it_can_never_pass() {
        let slots = Terms {
            limit: 3.0,
            in_flight: true,
            ..Terms::default()
        };
        let rejected = RejectionLine {
            wait: Wait::Never(Never::NoLeak),
            limit: 0.0,
            ..line(slots)
        };
        let text = rejected.to_string();
        assert_eq!(
            text,
            "limiting requests by quota \"api\" (limit 3 at once, weight 1): 3 at once, all held"
        );
        assert!(!text.contains("never"), "{text}");
    }

    #[test]
    fn a_key_with_an_override_is_told_with_its_own_limit_and_the_templates() {
        let keyed = RejectionLine {
            key: 0x1234,
            key_override: Some(KeyOverride::Limit {
                limit: 10.0,
                burst: 20.0,
                template_burst: 3.0,
            }),
            ..line(leaky(3.0, true))
        };
        assert_eq!(
            keyed.to_string(),
            "limiting requests by quota \"api\" key 0000000000001234 (limit 10 /s per key, \
             burst 20, by the key's override; the template's is 3 /s per key, burst 3, \
             weight 1)"
        );
        let window = Terms {
            limit: 100.0,
            window: Some(Window::Day),
            per_key: true,
            ..Terms::default()
        };
        let keyed = RejectionLine {
            key: 0x1234,
            key_override: Some(KeyOverride::Limit {
                limit: 1000.0,
                burst: 1000.0,
                template_burst: 100.0,
            }),
            ..line(window)
        };
        assert!(
            keyed.to_string().contains(
                "(limit 1000 / day per key, burst 1000, by the key's override; the \
                 template's is 100 / day per key, burst 100, weight 1)"
            ),
            "{keyed}"
        );
    }

    #[test]
    fn a_denial_and_a_penalty_say_what_decided() {
        let denied = RejectionLine {
            key: 0xabc,
            cause: Cause::Denied,
            wait: Wait::Never(Never::Denied),
            key_override: Some(KeyOverride::Deny),
            ..line(leaky(3.0, true))
        };
        assert_eq!(
            denied.to_string(),
            "limiting requests by quota \"api\" key 0000000000000abc (limit 3 /s per key, \
             weight 1): an override denies the key"
        );
        let penalized = RejectionLine {
            key: 0xabc,
            cause: Cause::Penalty,
            wait: Wait::Seconds(899.2),
            key_override: Some(KeyOverride::Limit {
                limit: 10.0,
                burst: 10.0,
                template_burst: 3.0,
            }),
            ..line(leaky(3.0, true))
        };
        assert_eq!(
            penalized.to_string(),
            "limiting requests by quota \"api\" key 0000000000000abc (limit 10 /s per key, \
             burst 10, by the key's override; the template's is 3 /s per key, burst 3, \
             weight 1): a penalty bars the key for 900 s more"
        );
        let quota_penalty = RejectionLine {
            cause: Cause::Penalty,
            wait: Wait::Seconds(60.0),
            ..line(leaky(3.0, false))
        };
        assert!(quota_penalty
            .to_string()
            .ends_with(": a penalty bars the quota for 60 s more"));
    }

    #[test]
    fn without_its_terms_the_line_shows_the_bare_limit() {
        let unread = RejectionLine {
            terms: None,
            limit: 2.5,
            ..line(leaky(2.5, false))
        };
        assert_eq!(
            unread.to_string(),
            "limiting requests by quota \"api\" (limit 2.5, weight 1)"
        );
    }
}
