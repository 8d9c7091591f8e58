//! The held slots of keys a limiter reports absolute
//! ([`super::SyncRequest::keyed_held`]; docs/DESIGN.md, "In-flight
//! quotas", *Held slots, absolute*): how a root checks them before it
//! applies any.

use super::{check_keyed, KeyedDeltas, WireError};

/// Checks [`SyncRequest::keyed_held`]: only in a numbered request;
/// templates in increasing order of id, each once, with no window; keys
/// in increasing order of hash, each once, none 0; no count above
/// [`super::MAX_DELTA`].
pub(super) fn check_keyed_held(groups: &[KeyedDeltas], numbered: bool) -> Result<(), WireError> {
    if !groups.is_empty() && !numbered {
        return Err(WireError::new(
            "keyed_held",
            "held slots go only with a numbered request (sequence)",
        ));
    }
    check_keyed("keyed_held", groups)?;
    for (g, group) in groups.iter().enumerate() {
        if g > 0 && groups[g - 1].id >= group.id {
            return Err(WireError::new(
                format!("keyed_held[{g}].id"),
                "templates go in increasing order of id, each once",
            ));
        }
        if group.window.is_some() {
            return Err(WireError::new(
                format!("keyed_held[{g}].window"),
                "held slots have no window",
            ));
        }
        let deltas = &group.deltas;
        if let Some(i) = (1..deltas.len()).find(|&i| deltas[i - 1].0 >= deltas[i].0) {
            return Err(WireError::new(
                format!("keyed_held[{g}].deltas[{i}]"),
                "keys go in increasing order of hash, each once",
            ));
        }
    }
    Ok(())
}
