//! What a sync carries of tiers per key (see [`crate::core::tier`]): in
//! a request, the limiter's override cursor and penalty version with this
//! root and the penalties it started; in a reply, the overrides after the
//! cursor (paged like quotas) and the penalties changed since the version.
//!
//! Both travel as one nested object, `"tiers"`, left out when empty, so a
//! sync without tiers is the sync of earlier versions. The binary
//! encoding carries the same object as a length-prefixed JSON section at
//! the end of a body of request format 2 / reply format 3: overrides
//! change rarely, and penalties are few.

use serde::{Deserialize, Serialize};

use super::{QuotaCursor, WireError};
use crate::core::tier::{Override, Penalty};

/// A request's tiers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierRequest {
    /// Last override position received from this root.
    #[serde(default, skip_serializing_if = "is_origin")]
    pub overrides_after: QuotaCursor,
    /// Last penalty version received from this root's instance (0: send
    /// every penalty in force).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub penalty_version: u64,
    /// Penalties this limiter started since its last sync with this root
    /// (to a root of a new instance: every one it holds).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub penalties: Vec<Penalty>,
}

impl TierRequest {
    /// True when it says nothing (left out of the request).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Checks it as a root does before applying anything: every penalty
    /// names a quota and ends at a positive time.
    pub fn check(&self) -> Result<(), WireError> {
        if let Some(i) = self
            .penalties
            .iter()
            .position(|p| p.quota() == 0 || p.until() <= 0 || p.key() == u64::MAX)
        {
            return Err(WireError::new(
                format!("tiers.penalties[{i}]"),
                "a penalty names a quota (not 0), a key (0 for none) and a positive end",
            ));
        }
        Ok(())
    }
}

/// A reply's tiers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierReply {
    /// Overrides after the request's cursor (tombstones included), in
    /// `(epoch, id)` order, at most one page; none while quota pages
    /// remain (their templates come first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<Override>,
    /// Cursor after the last override sent (the request's own when none).
    #[serde(default, skip_serializing_if = "is_origin")]
    pub overrides_after: QuotaCursor,
    /// More override pages follow: sync again without waiting.
    #[serde(default, skip_serializing_if = "crate::core::quota::is_false")]
    pub more_overrides: bool,
    /// Penalties in force that changed since the request's version (all
    /// of them for version 0 or another instance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub penalties: Vec<Penalty>,
    /// Penalty version to send next time.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub penalty_version: u64,
}

impl TierReply {
    /// True when it says nothing (left out of the reply).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Checks it as a limiter does before applying the reply: every
    /// override valid and in `(epoch, id)` order, every penalty naming a
    /// quota.
    pub fn validate(&self) -> Result<(), WireError> {
        if let Some((i, e)) = self
            .overrides
            .iter()
            .enumerate()
            .find_map(|(i, o)| o.validate().err().map(|e| (i, e)))
        {
            return Err(WireError::new(
                format!("tiers.overrides[{i}].{}", e.field),
                e.message,
            ));
        }
        if let Some(i) = self
            .overrides
            .windows(2)
            .position(|w| (w[0].epoch, w[0].id) >= (w[1].epoch, w[1].id))
        {
            return Err(WireError::new(
                format!("tiers.overrides[{}]", i + 1),
                "overrides out of (epoch, id) order",
            ));
        }
        if let Some(i) = self
            .penalties
            .iter()
            .position(|p| p.quota() == 0 || p.key() == u64::MAX)
        {
            return Err(WireError::new(
                format!("tiers.penalties[{i}]"),
                "a penalty names a quota (not 0) and a key (0 for none)",
            ));
        }
        Ok(())
    }
}

fn is_origin(cursor: &QuotaCursor) -> bool {
    *cursor == QuotaCursor::default()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The tiers section of a binary body: the object's JSON, empty when it
/// says nothing.
pub(super) fn encode_section<T: Serialize + Default + PartialEq>(tiers: &T) -> Vec<u8> {
    if *tiers == T::default() {
        return Vec::new();
    }
    // Plain data (integers, a closed enum, no maps): it always encodes.
    serde_json::to_vec(tiers).unwrap_or_default()
}

/// Reads a binary body's tiers section.
pub(super) fn decode_section<T: for<'de> Deserialize<'de> + Default>(
    bytes: &[u8],
) -> Result<T, WireError> {
    if bytes.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| WireError::new("tiers", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::tier::Rule;

    #[test]
    fn empty_tiers_are_left_out_and_full_ones_round_trip() {
        assert!(encode_section(&TierRequest::default()).is_empty());
        let reply = TierReply {
            overrides: vec![Override {
                id: 1,
                quota: 2,
                key: 3,
                rule: Rule::Deny,
                expires_ms: None,
                epoch: 4,
                deleted: false,
            }],
            overrides_after: QuotaCursor { epoch: 4, id: 1 },
            more_overrides: true,
            penalties: vec![Penalty(2, 3, 99)],
            penalty_version: 7,
        };
        let bytes = encode_section(&reply);
        assert_eq!(decode_section::<TierReply>(&bytes).unwrap(), reply);
        assert!(reply.validate().is_ok());
    }

    #[test]
    fn bad_penalties_and_overrides_are_refused_naming_the_place() {
        let request = TierRequest {
            penalties: vec![Penalty(1, 0, 5), Penalty(0, 0, 5)],
            ..TierRequest::default()
        };
        assert_eq!(request.check().unwrap_err().field, "tiers.penalties[1]");
        let bad = Override {
            id: 1,
            quota: 2,
            key: 0,
            rule: Rule::Allow,
            expires_ms: None,
            epoch: 1,
            deleted: false,
        };
        let reply = TierReply {
            overrides: vec![bad],
            ..TierReply::default()
        };
        assert_eq!(
            reply.validate().unwrap_err().field,
            "tiers.overrides[0].key_hash"
        );
    }
}
