//! The compact binary encoding of [`SyncRequest`] and [`SyncResponse`]
//! (content type [`BINARY_CONTENT_TYPE`]), next to JSON.
//!
//! A limiter with 100k changed counters spends most of a sync encoding and
//! decoding JSON: about 25 bytes a named delta and 55 a counter value, each
//! number printed in decimal and parsed back, each field name written out.
//! This format carries the same values in a fixed order:
//!
//! - a 4-byte header: `S`, `L`, the kind (`q` request, `r` reply) and the
//!   format version ([`BINARY_VERSION`]);
//! - unsigned integers as LEB128 varints (7 bits a byte, least
//!   significant group first), signed ones zigzagged first;
//! - key hashes as 8 bytes little-endian (they are random: a varint would
//!   take 9 or 10), levels as IEEE 754 doubles, 8 bytes little-endian;
//! - a counter value's `at` as the zigzagged difference from the reply's
//!   `root_time` (wrapping), a few bytes instead of 8;
//! - a list as its length, then its entries; every length is checked
//!   against the bytes left before anything is allocated;
//! - quotas (a reply's page of quota changes: rare, small, and with many
//!   optional fields) as a length-prefixed JSON array of [`Quota`]s, so a
//!   quota is encoded once, by serde, whichever format the sync uses.
//!
//! A request's named deltas go as runs of deltas sharing one `window`
//! (in their order), so the common case (all leaky, or all of one window)
//! costs no byte per delta for it.
//!
//! Decoding checks the shape (truncation, varint overflow, bad UTF-8,
//! trailing bytes, counts larger than the body could hold) and names the
//! field where it broke; it does not check values (that is
//! [`SyncRequest::check`] and [`SyncResponse::validate`], as for JSON).
//!
//! What a request decodes to is bounded before it is allocated, since a
//! root decodes bodies from anyone holding a sync token: a delta of 2
//! bytes becomes 32 in memory, so a 64 MiB body of them would take a
//! gigabyte. Every list's length is checked against the bytes left, then
//! against the entries left of [`MAX_DELTAS_PER_SYNC`] (deltas, keyed
//! groups and rejection counts together, as [`SyncRequest::entry_count`]
//! counts them) before anything is reserved; a limiter id longer than
//! [`MAX_LIMITER_ID_LEN`] is refused before it is copied. A request
//! therefore decodes to at most a million entries of at most 48 bytes.
//! A body of another version is [`BinaryError::Version`]: a root answers
//! it 415, so that a limiter newer than its root falls back to JSON.
//!
//! Requests are format 1, or format 2 ([`BINARY_RETURNS_VERSION`]) when
//! they give weight back: format 1 plus the returned named deltas and the
//! keys' returns, encoded as the deltas are. A limiter sends returns
//! only to a root whose replies say it takes them, so a root that
//! predates format 2 never gets one. Replies are format 1, format 2 for
//! a limiter that asks for it in its `Accept`
//! (`application/x-sluice-sync;version=2`): format 1 plus, after each
//! keyed group's values, the count and values of its previous-window
//! counts ([`KeyedValues::prev`], a sliding window template's), or format
//! 3 ([`BINARY_FLAGS_VERSION`], `version=3`): format 2 plus a last varint
//! of flags (bit 0: the root takes returns), or format 4 (`version=4`):
//! format 3 plus the tiers section (below), with flag bit 1 (the root
//! takes tiers). A root answers the newest format it has up to the one
//! asked for; a root that predates a format ignores the parameter and
//! answers an older one, which a newer limiter still reads; a limiter
//! that predates it never asks.
//!
//! Request format 3 ([`BINARY_TIERS_REQUEST_VERSION`]) is format 2 plus
//! the tiers section: the limiter's override cursor, penalty version and
//! the penalties it started ([`super::tiers`]). It is sent only to a root
//! whose replies say it takes tiers. Request format 4
//! ([`BINARY_SEQUENCE_REQUEST_VERSION`]) is format 3 plus the request's number
//! ([`super::Sequence`]: the incarnation as 8 bytes, the number as a
//! varint), sent only to a root whose replies say it takes sequences:
//! reply format 5 ([`BINARY_SEQUENCE_REPLY_VERSION`], `version=5`) is
//! format 4 whose flags may have bit 2 (the root takes sequences), and
//! after the tiers section a varint: the highest number the root applied
//! of the request's sync thread ([`SyncResponse::applied_through`]).
//! Reply format 6 ([`BINARY_REFUSED_REPLY_VERSION`], `version=6`) is format 5
//! plus, last, the keys the root refused to hold
//! ([`SyncResponse::refused`]): a count of templates, and per template
//! its id, a count of keys and the keys' hashes (8 bytes each).
//!
//! Request format 5 ([`BINARY_HELD_REQUEST_VERSION`]) is format 4 plus, last,
//! the slots the limiter holds ([`SyncRequest::held`]): a count, then per
//! named in-flight quota its id and its slots, as varints. It is sent
//! only to a root whose replies say it takes them: reply format 7
//! ([`BINARY_HELD_REPLY_VERSION`], `version=7`) is format 6 whose flags may
//! have bit 3 (the root takes held slots); an older limiter never asks
//! for it, and reads no flag it does not know.
//!
//! Request format 6 ([`BINARY_INTEREST_REQUEST_VERSION`]) is format 5 plus, last,
//! the keys the limiter holds ([`SyncRequest::interest`]): a byte (0: no
//! list, 1: keys to add, 2: the whole list), then, unless 0, a count of
//! templates and per template its id, a count of keys and the keys'
//! hashes (8 bytes each). It is sent only to a root whose replies say it
//! answers by interest: reply format 8 ([`BINARY_INTEREST_REPLY_VERSION`],
//! `version=8`) is format 7 whose flags may have bit 4 (the root answers
//! by interest) and bit 5 (it wants the limiter's whole list).
//!
//! Request format 7 ([`BINARY_REQUEST_VERSION`]) is format 6 plus, last,
//! the slots the limiter holds of keys ([`SyncRequest::keyed_held`]), as
//! keyed deltas are: a count of templates, and per template its id, a
//! count of keys and per key its hash (8 bytes) and its slots (a
//! varint). It is sent only to a root whose replies say it takes them:
//! reply format 9 ([`BINARY_REPLY_VERSION`], `version=9`) is format 8
//! whose flags may have bit 6 (the root takes the held slots of keys).
//! The
//! tiers section, in a request or a reply, is a length-prefixed JSON object (empty when it says nothing):
//! overrides change rarely and penalties are few, so a compact encoding
//! would buy little and cost a second one to keep in step with serde.

use crate::core::Quota;

use super::{
    too_many_entries, CounterValue, KeyValue, KeyedValues, QuotaCursor, Replay, Sequence,
    SyncRequest, SyncResponse, TierReply, TierRequest, WireError, MAX_DELTAS_PER_SYNC,
    MAX_LIMITER_ID_LEN,
};

mod codec;

use codec::{
    unzigzag, zigzag, Reader, Writer, KIND_REPLY, KIND_REQUEST, TAKES_HELD, TAKES_INTEREST,
    TAKES_KEYED_HELD, TAKES_RETURNS, TAKES_SEQUENCE, TAKES_TIERS, WANTS_INTEREST,
};
pub use codec::{
    BinaryError, BINARY_CONTENT_TYPE, BINARY_FLAGS_VERSION, BINARY_HELD_REPLY_VERSION,
    BINARY_HELD_REQUEST_VERSION, BINARY_INTEREST_REPLY_VERSION, BINARY_INTEREST_REQUEST_VERSION,
    BINARY_PREV_VERSION, BINARY_REFUSED_REPLY_VERSION, BINARY_REPLY_VERSION,
    BINARY_REQUEST_VERSION, BINARY_RETURNS_VERSION, BINARY_SEQUENCE_REPLY_VERSION,
    BINARY_SEQUENCE_REQUEST_VERSION, BINARY_TIERS_REPLY_VERSION, BINARY_TIERS_REQUEST_VERSION,
    BINARY_VERSION,
};

/// Encodes a request: format 1, 2 when it gives weight back, 3 when it
/// carries tiers, 4 when it is numbered, 5 when it reports held slots, 6
/// when it carries an interest list, 7 when it reports keys' held slots.
pub fn encode_request(request: &SyncRequest) -> Vec<u8> {
    let tiers = super::tiers::encode_section(&request.tiers);
    let keys: usize = request.keyed.iter().map(|k| k.deltas.len()).sum();
    let mut w = Writer::with_capacity(
        64 + request.limiter.len()
            + 8 * request.deltas.len()
            + 13 * keys
            + 16 * request.keyed.len()
            + 8 * request.rejected.len(),
    );
    let version = if !request.keyed_held.is_empty() {
        BINARY_REQUEST_VERSION
    } else if request.interest.is_some() {
        BINARY_INTEREST_REQUEST_VERSION
    } else if !request.held.is_empty() {
        BINARY_HELD_REQUEST_VERSION
    } else if request.sequence.is_some() {
        BINARY_SEQUENCE_REQUEST_VERSION
    } else if !tiers.is_empty() {
        BINARY_TIERS_REQUEST_VERSION
    } else if request.has_returns() {
        BINARY_RETURNS_VERSION
    } else {
        BINARY_VERSION
    };
    w.header(KIND_REQUEST, version);
    w.bytes(request.limiter.as_bytes());
    w.varint(request.quotas_after.epoch);
    w.varint(request.quotas_after.id);
    w.varint(request.counter_version);
    w.varint(request.root_instance);
    w.named(&request.deltas);
    w.keyed(&request.keyed);
    w.varint(request.rejected.len() as u64);
    for &(id, count) in &request.rejected {
        w.varint(id);
        w.varint(count);
    }
    if version >= BINARY_RETURNS_VERSION {
        w.named(&request.returned);
        w.keyed(&request.keyed_returned);
    }
    if version >= BINARY_TIERS_REQUEST_VERSION {
        w.bytes(&tiers);
    }
    if version >= BINARY_SEQUENCE_REQUEST_VERSION {
        // Always present in format 4: a numbered request is its reason.
        let sequence = request.sequence.unwrap_or_default();
        w.fixed(sequence.incarnation);
        w.varint(sequence.seq);
        w.varint(request.replay.len() as u64);
        for part in &request.replay {
            w.varint(part.seq);
            w.named(&part.deltas);
            w.keyed(&part.keyed);
            w.named(&part.returned);
            w.keyed(&part.keyed_returned);
        }
    }
    if version >= BINARY_HELD_REQUEST_VERSION {
        w.varint(request.held.len() as u64);
        for &(id, slots) in &request.held {
            w.varint(id);
            w.varint(slots);
        }
    }
    if version >= BINARY_INTEREST_REQUEST_VERSION {
        match &request.interest {
            None => w.0.push(0),
            Some(interest) => {
                w.0.push(if interest.full { 2 } else { 1 });
                w.key_groups(&interest.keys);
            }
        }
    }
    if version >= BINARY_REQUEST_VERSION {
        w.keyed(&request.keyed_held);
    }
    w.0
}

/// Decodes a request (its shape only: see [`SyncRequest::check`]).
pub fn decode_request(body: &[u8]) -> Result<SyncRequest, BinaryError> {
    let mut r = Reader::new(body);
    r.entries_left = MAX_DELTAS_PER_SYNC;
    let version = r.header(KIND_REQUEST)?;
    let limiter = r.string("limiter", MAX_LIMITER_ID_LEN)?;
    let quotas_after = QuotaCursor {
        epoch: r.varint("quotas_after.epoch")?,
        id: r.varint("quotas_after.id")?,
    };
    let counter_version = r.varint("counter_version")?;
    let root_instance = r.varint("root_instance")?;
    let deltas = r.named("deltas")?;
    let keyed = r.keyed("keyed")?;
    let n = r.entries(2, || "rejected".into())?;
    let mut rejected = Vec::with_capacity(n);
    for i in 0..n {
        let id = r.varint_or(|| format!("rejected[{i}]"))?;
        let count = r.varint_or(|| format!("rejected[{i}]"))?;
        rejected.push((id, count));
    }
    let (returned, keyed_returned) = if version >= BINARY_RETURNS_VERSION {
        (r.named("returned")?, r.keyed("keyed_returned")?)
    } else {
        (Vec::new(), Vec::new())
    };
    let tiers = if version >= BINARY_TIERS_REQUEST_VERSION {
        // A penalty takes at least 7 bytes of JSON (`[1,0,1]`): the most
        // the section could hold counts against the entries left before
        // it is decoded.
        let section = r.slice(|| "tiers".into(), usize::MAX)?;
        let most = section.len() / 7;
        if most > r.entries_left {
            return Err(too_many_entries(MAX_DELTAS_PER_SYNC - r.entries_left + most).into());
        }
        super::tiers::decode_section(section)?
    } else {
        TierRequest::default()
    };
    let (sequence, replay) = if version >= BINARY_SEQUENCE_REQUEST_VERSION {
        let sequence = Sequence {
            incarnation: r.fixed(|| "sequence.incarnation".into())?,
            seq: r.varint("sequence.seq")?,
        };
        // A part is at least 5 bytes (its number and four empty lists).
        let n = r.entries(5, || "replay".into())?;
        let mut replay = Vec::with_capacity(n);
        for i in 0..n {
            replay.push(Replay {
                seq: r.varint_or(|| format!("replay[{i}].seq"))?,
                deltas: r.named(&format!("replay[{i}].deltas"))?,
                keyed: r.keyed(&format!("replay[{i}].keyed"))?,
                returned: r.named(&format!("replay[{i}].returned"))?,
                keyed_returned: r.keyed(&format!("replay[{i}].keyed_returned"))?,
            });
        }
        (Some(sequence), replay)
    } else {
        (None, Vec::new())
    };
    let mut held = Vec::new();
    if version >= BINARY_HELD_REQUEST_VERSION {
        // An entry is at least 2 bytes (id, slots).
        let n = r.entries(2, || "held".into())?;
        held.reserve(n);
        for i in 0..n {
            let id = r.varint_or(|| format!("held[{i}]"))?;
            held.push((id, r.varint_or(|| format!("held[{i}]"))?));
        }
    }
    let interest = if version >= BINARY_INTEREST_REQUEST_VERSION {
        let full = match r.byte(|| "interest".into())? {
            0 => None,
            1 => Some(false),
            2 => Some(true),
            b => return Err(WireError::new("interest", format!("{b} is not 0, 1 or 2")).into()),
        };
        match full {
            Some(full) => Some(super::Interest {
                full,
                keys: r.key_groups("interest.keys", true)?,
            }),
            None => None,
        }
    } else {
        None
    };
    let keyed_held = if version >= BINARY_REQUEST_VERSION {
        r.keyed("keyed_held")?
    } else {
        Vec::new()
    };
    r.end()?;
    Ok(SyncRequest {
        interest,
        keyed_held,
        limiter,
        quotas_after,
        counter_version,
        root_instance,
        deltas,
        keyed,
        rejected,
        returned,
        keyed_returned,
        tiers,
        sequence,
        replay,
        held,
    })
}

/// Flag of a counter value that carries `prev`.
const HAS_PREV: u8 = 1;

/// Encodes a reply. Fails only if its quotas cannot be written as JSON
/// (they always can: a quota is plain data).
pub fn encode_response(reply: &SyncResponse) -> Result<Vec<u8>, WireError> {
    encode_response_as(reply, BINARY_REPLY_VERSION)
}

/// Encodes a reply in format `version` (at most
/// [`BINARY_REPLY_VERSION`]): [`BINARY_VERSION`] leaves the keyed groups'
/// previous-window counts out, [`BINARY_PREV_VERSION`] the flags,
/// [`BINARY_FLAGS_VERSION`] the tiers, [`BINARY_TIERS_REPLY_VERSION`]
/// the sequence, [`BINARY_SEQUENCE_REPLY_VERSION`] the keys refused (for
/// a limiter that did not ask for more).
pub fn encode_response_as(reply: &SyncResponse, version: u8) -> Result<Vec<u8>, WireError> {
    let version = version.clamp(BINARY_VERSION, BINARY_REPLY_VERSION);
    let quotas = if reply.quotas.is_empty() {
        Vec::new()
    } else {
        serde_json::to_vec(&reply.quotas)
            .map_err(|e| WireError::new("quotas", format!("cannot encode: {e}")))?
    };
    let keys: usize = reply.keyed.iter().map(|k| k.values.len()).sum();
    let mut w = Writer::with_capacity(
        64 + quotas.len() + 16 * reply.counters.len() + 20 * keys + 8 * reply.keyed.len(),
    );
    w.header(KIND_REPLY, version);
    w.varint(reply.root_instance);
    w.varint(reply.root_time);
    w.window(reply.root_utc);
    w.bytes(&quotas);
    w.varint(reply.quotas_after.epoch);
    w.varint(reply.quotas_after.id);
    w.0.push(u8::from(reply.more_quotas));
    w.varint(reply.counter_version);
    let since = |at: u64| zigzag(at.wrapping_sub(reply.root_time) as i64);
    w.varint(reply.counters.len() as u64);
    for c in &reply.counters {
        let has_prev = c.prev.to_bits() != 0;
        w.varint(c.id);
        w.0.push(if has_prev { HAS_PREV } else { 0 });
        w.float(c.level);
        w.varint(since(c.at));
        if has_prev {
            w.float(c.prev);
        }
    }
    w.varint(reply.keyed.len() as u64);
    for group in &reply.keyed {
        w.varint(group.id);
        w.varint(group.values.len() as u64);
        for v in &group.values {
            w.fixed(v.0);
            w.float(v.1);
            w.varint(since(v.2));
        }
        if version >= BINARY_PREV_VERSION {
            w.varint(group.prev.len() as u64);
            for &p in &group.prev {
                w.float(p);
            }
        }
    }
    if version >= BINARY_FLAGS_VERSION {
        let tiers = version >= BINARY_TIERS_REPLY_VERSION;
        let mut flags = 0;
        if reply.takes_returns {
            flags |= TAKES_RETURNS;
        }
        if tiers && reply.takes_tiers {
            flags |= TAKES_TIERS;
        }
        if version >= BINARY_SEQUENCE_REPLY_VERSION && reply.takes_sequence {
            flags |= TAKES_SEQUENCE;
        }
        if version >= BINARY_HELD_REPLY_VERSION && reply.takes_held {
            flags |= TAKES_HELD;
        }
        if version >= BINARY_REPLY_VERSION && reply.takes_keyed_held {
            flags |= TAKES_KEYED_HELD;
        }
        if version >= BINARY_INTEREST_REPLY_VERSION {
            if reply.takes_interest {
                flags |= TAKES_INTEREST;
            }
            if reply.wants_interest {
                flags |= WANTS_INTEREST;
            }
        }
        w.varint(flags);
        if tiers {
            w.bytes(&super::tiers::encode_section(&reply.tiers));
        }
        if version >= BINARY_SEQUENCE_REPLY_VERSION {
            w.varint(reply.applied_through);
        }
    }
    if version >= BINARY_REFUSED_REPLY_VERSION {
        w.key_groups(&reply.refused);
    }
    Ok(w.0)
}

/// Decodes a reply (its shape only: see [`SyncResponse::validate`]).
pub fn decode_response(body: &[u8]) -> Result<SyncResponse, BinaryError> {
    let mut r = Reader::new(body);
    let version = r.header(KIND_REPLY)?;
    let root_instance = r.varint("root_instance")?;
    let root_time = r.varint("root_time")?;
    let root_utc = r.window(|| "root_utc".into())?;
    let quotas = r.slice(|| "quotas".into(), usize::MAX)?;
    let quotas: Vec<Quota> = if quotas.is_empty() {
        Vec::new()
    } else {
        serde_json::from_slice(quotas).map_err(|e| WireError::new("quotas", e.to_string()))?
    };
    let quotas_after = QuotaCursor {
        epoch: r.varint("quotas_after.epoch")?,
        id: r.varint("quotas_after.id")?,
    };
    let more_quotas = match r.byte(|| "more_quotas".into())? {
        0 => false,
        1 => true,
        b => return Err(WireError::new("more_quotas", format!("{b} is not 0 or 1")).into()),
    };
    let counter_version = r.varint("counter_version")?;
    let at = |since: u64| root_time.wrapping_add(unzigzag(since) as u64);
    // A counter is at least 11 bytes (id, flags, level, at).
    let n = r.count(11, || "counters".into())?;
    let mut counters = Vec::with_capacity(n);
    for i in 0..n {
        let id = r.varint_or(|| format!("counters[{i}].id"))?;
        let flags = r.byte(|| format!("counters[{i}].flags"))?;
        if flags & !HAS_PREV != 0 {
            return Err(WireError::new(
                format!("counters[{i}].flags"),
                format!("unknown flags {flags:#x}"),
            )
            .into());
        }
        let level = r.float(|| format!("counters[{i}].level"))?;
        let since = r.varint_or(|| format!("counters[{i}].at"))?;
        let prev = if flags & HAS_PREV != 0 {
            r.float(|| format!("counters[{i}].prev"))?
        } else {
            0.0
        };
        counters.push(CounterValue {
            id,
            level,
            at: at(since),
            prev,
        });
    }
    // A group is at least 2 bytes (id, count), a key 17.
    let groups = r.count(2, || "keyed".into())?;
    let mut keyed = Vec::with_capacity(groups);
    for g in 0..groups {
        let id = r.varint_or(|| format!("keyed[{g}].id"))?;
        let n = r.count(17, || format!("keyed[{g}].values"))?;
        let mut values = Vec::with_capacity(n);
        for i in 0..n {
            let field = || format!("keyed[{g}].values[{i}]");
            let hash = r.fixed(field)?;
            let level = r.float(field)?;
            let since = r.varint_or(field)?;
            values.push(KeyValue(hash, level, at(since)));
        }
        let mut prev = Vec::new();
        if version >= BINARY_PREV_VERSION {
            let n = r.count(8, || format!("keyed[{g}].prev"))?;
            prev.reserve(n);
            for i in 0..n {
                prev.push(r.float(|| format!("keyed[{g}].prev[{i}]"))?);
            }
        }
        keyed.push(KeyedValues { id, values, prev });
    }
    let flags = if version >= BINARY_FLAGS_VERSION {
        r.varint("flags")?
    } else {
        0
    };
    let interest = TAKES_INTEREST | WANTS_INTEREST;
    let known = if version >= BINARY_REPLY_VERSION {
        TAKES_RETURNS | TAKES_TIERS | TAKES_SEQUENCE | TAKES_HELD | interest | TAKES_KEYED_HELD
    } else if version >= BINARY_INTEREST_REPLY_VERSION {
        TAKES_RETURNS | TAKES_TIERS | TAKES_SEQUENCE | TAKES_HELD | interest
    } else if version >= BINARY_HELD_REPLY_VERSION {
        TAKES_RETURNS | TAKES_TIERS | TAKES_SEQUENCE | TAKES_HELD
    } else if version >= BINARY_SEQUENCE_REPLY_VERSION {
        TAKES_RETURNS | TAKES_TIERS | TAKES_SEQUENCE
    } else if version >= BINARY_TIERS_REPLY_VERSION {
        TAKES_RETURNS | TAKES_TIERS
    } else {
        TAKES_RETURNS
    };
    if flags & !known != 0 {
        return Err(WireError::new("flags", format!("unknown flags {flags:#x}")).into());
    }
    let tiers = if version >= BINARY_TIERS_REPLY_VERSION {
        super::tiers::decode_section(r.slice(|| "tiers".into(), usize::MAX)?)?
    } else {
        TierReply::default()
    };
    let applied_through = if version >= BINARY_SEQUENCE_REPLY_VERSION {
        r.varint("applied_through")?
    } else {
        0
    };
    let refused = if version >= BINARY_REFUSED_REPLY_VERSION {
        r.key_groups("refused", false)?
    } else {
        Vec::new()
    };
    r.end()?;
    Ok(SyncResponse {
        takes_returns: flags & TAKES_RETURNS != 0,
        takes_tiers: flags & TAKES_TIERS != 0,
        takes_sequence: flags & TAKES_SEQUENCE != 0,
        takes_held: flags & TAKES_HELD != 0,
        takes_keyed_held: flags & TAKES_KEYED_HELD != 0,
        takes_interest: flags & TAKES_INTEREST != 0,
        wants_interest: flags & WANTS_INTEREST != 0,
        applied_through,
        root_instance,
        root_time,
        root_utc,
        quotas,
        quotas_after,
        more_quotas,
        counters,
        keyed,
        counter_version,
        refused,
        tiers,
    })
}

#[cfg(test)]
mod tests {
    use super::codec::TAKES_SEQUENCE;
    use super::*;
    use crate::wire::RefusedKeys;
    use crate::wire::{CounterDelta, KeyDelta, KeyedDeltas, MAX_DELTA, MAX_DELTAS_PER_SYNC};
    use proptest::prelude::*;

    fn request() -> SyncRequest {
        SyncRequest {
            limiter: "host-1:4242".into(),
            quotas_after: QuotaCursor { epoch: 7, id: 3 },
            counter_version: 99,
            root_instance: u64::MAX,
            deltas: vec![
                CounterDelta {
                    id: 1,
                    delta: 5,
                    window: None,
                },
                CounterDelta {
                    id: 300,
                    delta: 1 << 40,
                    window: Some(-3),
                },
                CounterDelta {
                    id: 2,
                    delta: 0,
                    window: Some(-3),
                },
            ],
            keyed: vec![KeyedDeltas {
                id: 9,
                deltas: vec![KeyDelta(u64::MAX, 1), KeyDelta(0x1234, 2)],
                window: Some(i64::MIN),
            }],
            rejected: vec![(1, 2)],
            ..Default::default()
        }
    }

    fn reply() -> SyncResponse {
        SyncResponse {
            root_instance: 42,
            root_time: 1_000_000_000,
            root_utc: Some(1_700_000_000_000_000_000),
            quotas: vec![Quota::new(5, "five", 10.0, 20.0, 40.0)],
            quotas_after: QuotaCursor { epoch: 3, id: 5 },
            more_quotas: true,
            counters: vec![
                CounterValue {
                    id: 5,
                    level: 3.5,
                    at: 999_000_000,
                    prev: 0.0,
                },
                CounterValue {
                    id: 6,
                    level: 0.0,
                    at: u64::MAX,
                    prev: 2.25,
                },
            ],
            keyed: vec![
                KeyedValues {
                    id: 5,
                    values: vec![KeyValue(77, 1.5, 0)],
                    prev: Vec::new(),
                },
                KeyedValues {
                    id: 8,
                    values: vec![KeyValue(78, 2.0, 5), KeyValue(79, 0.5, 6)],
                    prev: vec![3.25],
                },
            ],
            counter_version: 12,
            takes_returns: true,
            ..Default::default()
        }
    }

    /// [`request`] giving weight back as well.
    fn returning_request() -> SyncRequest {
        SyncRequest {
            returned: vec![
                CounterDelta {
                    id: 1,
                    delta: 3,
                    window: None,
                },
                CounterDelta {
                    id: 300,
                    delta: u64::MAX,
                    window: Some(4),
                },
            ],
            keyed_returned: vec![KeyedDeltas {
                id: 9,
                deltas: vec![KeyDelta(0x1234, 1)],
                window: None,
            }],
            ..request()
        }
    }

    #[test]
    fn a_request_gives_weight_back_in_format_2_only_when_it_has_returns() {
        // Without returns: format 1, which every root reads.
        assert_eq!(encode_request(&request())[3], BINARY_VERSION);
        let r = returning_request();
        let body = encode_request(&r);
        assert_eq!(body[3], BINARY_RETURNS_VERSION);
        assert_eq!(decode_request(&body).unwrap(), r);
        // Only returns, no deltas.
        let only = SyncRequest {
            deltas: Vec::new(),
            keyed: Vec::new(),
            rejected: Vec::new(),
            ..returning_request()
        };
        assert_eq!(decode_request(&encode_request(&only)).unwrap(), only);
        // Its truncations are named as any other's.
        for n in 0..body.len() {
            assert!(
                matches!(decode_request(&body[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
    }

    #[test]
    fn reply_format_3_says_whether_the_root_takes_returns() {
        for takes_returns in [true, false] {
            let r = SyncResponse {
                takes_returns,
                ..reply()
            };
            let body = encode_response_as(&r, BINARY_FLAGS_VERSION).unwrap();
            assert_eq!(body[3], BINARY_FLAGS_VERSION);
            assert_eq!(decode_response(&body).unwrap(), r);
        }
        // Format 2 has no flags: a limiter reading it sends no returns.
        let v2 = encode_response_as(&reply(), BINARY_PREV_VERSION).unwrap();
        assert_eq!(v2[3], BINARY_PREV_VERSION);
        assert!(!decode_response(&v2).unwrap().takes_returns);
        // A flag format 3 does not know (bit 1 came with format 4) is
        // refused, named.
        let mut unknown = encode_response_as(&reply(), BINARY_FLAGS_VERSION).unwrap();
        *unknown.last_mut().unwrap() = 0x02;
        let e = decode_response(&unknown).unwrap_err().to_string();
        assert!(e.contains("flags") && e.contains("unknown"), "{e}");
    }

    /// [`reply`] with every tiers field set.
    fn tiered_reply() -> SyncResponse {
        use crate::core::tier::{Override, Penalty, Rule};
        let mut r = SyncResponse {
            takes_tiers: true,
            ..reply()
        };
        r.tiers.overrides = vec![Override {
            id: 2,
            quota: 3,
            key: 7,
            rule: Rule::Allow,
            expires_ms: Some(5),
            epoch: 9,
            deleted: false,
        }];
        r.tiers.overrides_after = QuotaCursor { epoch: 9, id: 2 };
        r.tiers.more_overrides = true;
        r.tiers.penalties = vec![Penalty(3, 7, 1_000)];
        r.tiers.penalty_version = 4;
        r
    }

    #[test]
    fn tiers_travel_in_request_format_3_and_reply_format_4() {
        use crate::core::tier::Penalty;
        // A request with tiers is format 3, returns or not.
        let mut r = request();
        r.tiers.penalties = vec![Penalty(3, 7, 1_000)];
        r.tiers.overrides_after = QuotaCursor { epoch: 5, id: 2 };
        r.tiers.penalty_version = 6;
        let body = encode_request(&r);
        assert_eq!(body[3], BINARY_TIERS_REQUEST_VERSION);
        assert_eq!(decode_request(&body).unwrap(), r);
        let both = SyncRequest {
            tiers: r.tiers.clone(),
            ..returning_request()
        };
        assert_eq!(decode_request(&encode_request(&both)).unwrap(), both);
        // The reply: format 4 carries them and the flag; format 3 neither
        // (a limiter that asked for 3 predates tiers).
        let reply = tiered_reply();
        let v4 = encode_response_as(&reply, BINARY_TIERS_REPLY_VERSION).unwrap();
        assert_eq!(v4[3], BINARY_TIERS_REPLY_VERSION);
        assert_eq!(decode_response(&v4).unwrap(), reply);
        let v3 = decode_response(&encode_response_as(&reply, BINARY_FLAGS_VERSION).unwrap());
        let v3 = v3.unwrap();
        assert!(v3.tiers.is_empty() && !v3.takes_tiers);
        assert_eq!(v3.counters, reply.counters);
        // Without tiers, format 4 costs a byte (the empty section) over 3,
        // and format 5 one more (no request applied).
        let plain = self::reply();
        let v3 = encode_response_as(&plain, BINARY_FLAGS_VERSION).unwrap();
        let plain4 = encode_response_as(&plain, BINARY_TIERS_REPLY_VERSION).unwrap();
        assert_eq!(plain4.len(), v3.len() + 1);
        let plain5 = encode_response_as(&plain, BINARY_SEQUENCE_REPLY_VERSION).unwrap();
        assert_eq!(plain5.len(), v3.len() + 2);
        // Truncations are named, and a broken section names "tiers".
        for n in 0..body.len() {
            assert!(
                matches!(decode_request(&body[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
        for n in 0..v4.len() {
            assert!(
                matches!(decode_response(&v4[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
        let mut broken = v4.clone();
        let last = broken.len() - 2;
        broken[last] = b'!';
        let e = decode_response(&broken).unwrap_err().to_string();
        assert!(e.contains("tiers"), "{e}");
    }

    #[test]
    fn a_numbered_request_is_format_4_and_reads_back_with_its_number() {
        let r = SyncRequest {
            sequence: Some(Sequence {
                incarnation: u64::MAX - 3,
                seq: 77,
            }),
            ..returning_request()
        };
        let body = encode_request(&r);
        assert_eq!(body[3], BINARY_SEQUENCE_REQUEST_VERSION);
        assert_eq!(decode_request(&body).unwrap(), r);
        // An unnumbered request keeps the format a root before sequences
        // reads.
        assert_eq!(
            encode_request(&returning_request())[3],
            BINARY_RETURNS_VERSION
        );
        for n in 0..body.len() {
            assert!(
                matches!(decode_request(&body[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
    }

    #[test]
    fn a_request_with_held_slots_is_format_5_and_reads_back_with_them() {
        let r = SyncRequest {
            sequence: Some(Sequence {
                incarnation: 9,
                seq: 3,
            }),
            held: vec![(4, 0), (7, 12), (1 << 40, 3)],
            ..returning_request()
        };
        let body = encode_request(&r);
        assert_eq!(body[3], BINARY_HELD_REQUEST_VERSION);
        assert_eq!(decode_request(&body).unwrap(), r);
        for n in 0..body.len() {
            assert!(
                matches!(decode_request(&body[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
        // Held slots out of order, or without a number, are refused whole.
        let plain = SyncRequest {
            limiter: "h".into(),
            ..r.clone()
        };
        let plain = SyncRequest {
            deltas: Vec::new(),
            returned: Vec::new(),
            keyed: Vec::new(),
            keyed_returned: Vec::new(),
            ..plain
        };
        assert_eq!(plain.check(), Ok(()));
        let unordered = SyncRequest {
            held: vec![(7, 1), (4, 1)],
            ..plain.clone()
        };
        let e = unordered.check().unwrap_err();
        assert_eq!(e.field, "held[1]");
        let unnumbered = SyncRequest {
            sequence: None,
            ..plain
        };
        assert!(unnumbered.check().is_err());
    }

    #[test]
    fn keys_held_slots_are_request_format_7_and_checked_whole() {
        let held = |id, keys: &[(u64, u64)]| KeyedDeltas {
            id,
            deltas: keys.iter().map(|&(k, n)| KeyDelta(k, n)).collect(),
            window: None,
        };
        let r = SyncRequest {
            limiter: "h".into(),
            sequence: Some(Sequence {
                incarnation: 9,
                seq: 3,
            }),
            keyed_held: vec![held(4, &[(1, 0), (u64::MAX, 7)]), held(9, &[(5, 2)])],
            ..SyncRequest::default()
        };
        assert_eq!(r.check(), Ok(()));
        let body = encode_request(&r);
        assert_eq!(body[3], BINARY_REQUEST_VERSION);
        assert_eq!(decode_request(&body).unwrap(), r);
        for n in 0..body.len() {
            assert!(decode_request(&body[..n]).is_err(), "{n}");
        }
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"keyed_held\""), "{json}");
        assert_eq!(serde_json::from_str::<SyncRequest>(&json).unwrap(), r);
        // Without them a request keeps the format an older root reads.
        let none = SyncRequest {
            keyed_held: Vec::new(),
            ..r.clone()
        };
        assert_eq!(encode_request(&none)[3], BINARY_SEQUENCE_REQUEST_VERSION);
        let refused = |keyed_held: Vec<KeyedDeltas>, sequence| {
            let bad = SyncRequest {
                keyed_held,
                sequence,
                ..r.clone()
            };
            bad.check().unwrap_err().field
        };
        let seq = r.sequence;
        assert_eq!(refused(r.keyed_held.clone(), None), "keyed_held");
        assert_eq!(
            refused(vec![held(9, &[(5, 2)]), held(4, &[(1, 1)])], seq),
            "keyed_held[1].id"
        );
        assert_eq!(
            refused(vec![held(4, &[(5, 2), (5, 1)])], seq),
            "keyed_held[0].deltas[1]"
        );
        assert_eq!(
            refused(vec![held(4, &[(0, 2)])], seq),
            "keyed_held[0].deltas[0]"
        );
        let windowed = KeyedDeltas {
            window: Some(3),
            ..held(4, &[(1, 1)])
        };
        assert_eq!(refused(vec![windowed], seq), "keyed_held[0].window");
        assert_eq!(
            refused(vec![held(4, &[(1, MAX_DELTA + 1)])], seq),
            "keyed_held[0].deltas[0]"
        );
    }

    #[test]
    fn reply_format_9_says_whether_the_root_takes_keys_held_slots_and_older_ones_never_do() {
        let r = SyncResponse {
            takes_sequence: true,
            takes_held: true,
            takes_keyed_held: true,
            takes_interest: true,
            ..tiered_reply()
        };
        let body = encode_response(&r).unwrap();
        assert_eq!(body[3], BINARY_REPLY_VERSION);
        let read = decode_response(&body).unwrap();
        assert!(read.takes_keyed_held && read.takes_interest && read.takes_held);
        // To a limiter that asked for format 8 (it predates them) the flag
        // is not set, the others are.
        let v8 = encode_response_as(&r, BINARY_INTEREST_REPLY_VERSION).unwrap();
        let v8 = decode_response(&v8).unwrap();
        assert!(!v8.takes_keyed_held && v8.takes_interest && v8.takes_held);
        // Format 9 read as format 8: the flag is unknown there, refused.
        let mut as_v8 = body.clone();
        as_v8[3] = BINARY_INTEREST_REPLY_VERSION;
        assert!(decode_response(&as_v8).is_err());
    }

    #[test]
    fn an_interest_list_is_request_format_6_and_reads_back_whole_or_added() {
        for full in [true, false] {
            let r = SyncRequest {
                sequence: Some(Sequence {
                    incarnation: 9,
                    seq: 3,
                }),
                held: vec![(4, 1)],
                interest: Some(crate::wire::Interest {
                    full,
                    keys: vec![RefusedKeys {
                        id: 7,
                        keys: vec![1, u64::MAX],
                    }],
                }),
                ..returning_request()
            };
            let body = encode_request(&r);
            assert_eq!(body[3], BINARY_INTEREST_REQUEST_VERSION);
            assert_eq!(decode_request(&body).unwrap(), r);
            for n in 0..body.len() {
                assert!(decode_request(&body[..n]).is_err(), "{n}");
            }
        }
        // Without a list, a request keeps the format an older root reads.
        let plain = SyncRequest {
            sequence: Some(Sequence {
                incarnation: 9,
                seq: 3,
            }),
            held: vec![(4, 1)],
            ..returning_request()
        };
        assert_eq!(encode_request(&plain)[3], BINARY_HELD_REQUEST_VERSION);
        // An unnumbered list is refused whole.
        let unnumbered = SyncRequest {
            limiter: "h".into(),
            interest: Some(crate::wire::Interest::default()),
            ..SyncRequest::default()
        };
        assert_eq!(unnumbered.check().unwrap_err().field, "interest");
    }

    #[test]
    fn reply_format_8_says_whether_the_root_answers_by_interest_and_older_ones_never_do() {
        let r = SyncResponse {
            takes_sequence: true,
            takes_held: true,
            takes_interest: true,
            wants_interest: true,
            applied_through: 5,
            ..tiered_reply()
        };
        let body = encode_response(&r).unwrap();
        assert_eq!(body[3], BINARY_REPLY_VERSION);
        let read = decode_response(&body).unwrap();
        assert!(read.takes_interest && read.wants_interest && read.takes_held);
        // To a limiter that asked for format 7 neither flag is set.
        let v7 = decode_response(&encode_response_as(&r, BINARY_HELD_REPLY_VERSION).unwrap());
        let v7 = v7.unwrap();
        assert!(!v7.takes_interest && !v7.wants_interest && v7.takes_held);
        // Format 8 read as format 7: the flags are unknown, refused.
        let mut as_v7 = body.clone();
        as_v7[3] = BINARY_HELD_REPLY_VERSION;
        assert!(decode_response(&as_v7).is_err());
    }

    #[test]
    fn reply_format_7_says_whether_the_root_takes_held_slots_and_older_ones_never_do() {
        let r = SyncResponse {
            takes_sequence: true,
            takes_held: true,
            applied_through: 5,
            ..tiered_reply()
        };
        let body = encode_response_as(&r, BINARY_HELD_REPLY_VERSION).unwrap();
        assert_eq!(body[3], BINARY_HELD_REPLY_VERSION);
        assert!(decode_response(&body).unwrap().takes_held);
        // To a limiter that asked for format 6 (it predates held slots)
        // the flag is never set: it would refuse it as unknown.
        let v6 = encode_response_as(&r, BINARY_REFUSED_REPLY_VERSION).unwrap();
        let read = decode_response(&v6).unwrap();
        assert!(!read.takes_held && read.takes_sequence);
        // Format 7 is format 6 with one more flag: read as format 6, the
        // flag is unknown, and the reply refused.
        let mut as_v6 = body.clone();
        as_v6[3] = BINARY_REFUSED_REPLY_VERSION;
        assert!(decode_response(&as_v6).is_err());
    }

    #[test]
    fn reply_format_5_says_whether_the_root_takes_sequences_and_older_ones_never_do() {
        for takes_sequence in [true, false] {
            let r = SyncResponse {
                takes_sequence,
                applied_through: if takes_sequence { 300 } else { 0 },
                ..tiered_reply()
            };
            let body = encode_response_as(&r, BINARY_SEQUENCE_REPLY_VERSION).unwrap();
            assert_eq!(body[3], BINARY_SEQUENCE_REPLY_VERSION);
            assert_eq!(decode_response(&body).unwrap(), r);
            // To a limiter that asked for format 4 (it predates
            // sequences) the flag is never set, nor the number sent: it
            // would refuse them.
            let v4 = encode_response_as(&r, BINARY_TIERS_REPLY_VERSION).unwrap();
            let v4 = decode_response(&v4).unwrap();
            assert!(!v4.takes_sequence && v4.applied_through == 0);
            for n in 0..body.len() {
                assert!(decode_response(&body[..n]).is_err(), "{n}");
            }
        }
        let mut v4 = encode_response_as(&reply(), BINARY_TIERS_REPLY_VERSION).unwrap();
        // The flags sit before the (empty) tiers section.
        let flags = v4.len() - 2;
        v4[flags] |= TAKES_SEQUENCE as u8;
        let e = decode_response(&v4).unwrap_err().to_string();
        assert!(e.contains("flags") && e.contains("unknown"), "{e}");
    }

    #[test]
    fn refused_keys_travel_in_reply_format_6_only() {
        let mut reply = self::reply();
        reply.takes_sequence = true;
        reply.applied_through = 7;
        reply.refused = vec![
            RefusedKeys {
                id: 5,
                keys: vec![77, u64::MAX],
            },
            RefusedKeys {
                id: 9,
                keys: vec![1],
            },
        ];
        let v6 = encode_response(&reply).unwrap();
        assert_eq!(v6[3], BINARY_REPLY_VERSION);
        assert_eq!(decode_response(&v6).unwrap(), reply);
        // A limiter that asked for format 5 predates them: left out, the
        // rest as it was.
        let v5 = encode_response_as(&reply, BINARY_SEQUENCE_REPLY_VERSION).unwrap();
        assert_eq!(v5[3], BINARY_SEQUENCE_REPLY_VERSION);
        let v5 = decode_response(&v5).unwrap();
        assert!(v5.refused.is_empty());
        assert_eq!(
            (v5.keyed, v5.takes_sequence, v5.applied_through),
            (reply.keyed.clone(), true, 7)
        );
        // Nothing refused costs a byte over format 5.
        let plain = self::reply();
        assert_eq!(
            encode_response(&plain).unwrap().len(),
            encode_response_as(&plain, BINARY_SEQUENCE_REPLY_VERSION)
                .unwrap()
                .len()
                + 1
        );
        // Every truncation is refused, naming the section.
        for n in 0..v6.len() {
            assert!(
                matches!(decode_response(&v6[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
        let e = decode_response(&v6[..v6.len() - 3])
            .unwrap_err()
            .to_string();
        assert!(e.contains("refused[1].keys"), "{e}");
        // A count larger than the body could hold is refused before any
        // allocation.
        let mut huge = encode_response(&plain).unwrap();
        huge.pop();
        huge.extend([0x80, 0x80, 0x80, 0x80, 0x08]);
        let e = decode_response(&huge).unwrap_err().to_string();
        assert!(e.contains("refused"), "{e}");
    }

    #[test]
    fn a_request_s_penalties_count_against_its_entries_before_decoding() {
        use crate::core::tier::Penalty;
        let mut huge = request();
        huge.tiers.penalties = vec![Penalty(1, 0, 1); MAX_DELTAS_PER_SYNC + 1];
        let e = decode_request(&encode_request(&huge)).unwrap_err();
        assert!(e.to_string().contains("entries"), "{e}");
    }

    #[test]
    fn a_request_and_a_reply_read_back_as_written() {
        let r = request();
        assert_eq!(decode_request(&encode_request(&r)).unwrap(), r);
        let r = reply();
        assert_eq!(decode_response(&encode_response(&r).unwrap()).unwrap(), r);
    }

    #[test]
    fn reply_format_1_leaves_the_keys_previous_counts_out() {
        let r = reply();
        let v1 = encode_response_as(&r, BINARY_VERSION).unwrap();
        assert_eq!(v1[3], BINARY_VERSION);
        let back = decode_response(&v1).unwrap();
        assert!(back.keyed.iter().all(|g| g.prev.is_empty()));
        assert_eq!(back.keyed[1].values, r.keyed[1].values);
        let v2 = encode_response_as(&r, BINARY_PREV_VERSION).unwrap();
        assert_eq!(v2[3], BINARY_PREV_VERSION);
        assert_eq!(decode_response(&v2).unwrap().keyed[1].prev, vec![3.25]);
        // Format 2 costs a byte a group, and 8 a previous count; format 3
        // a byte of flags more.
        assert_eq!(v2.len(), v1.len() + 2 + 8);
        let v3 = encode_response_as(&r, BINARY_FLAGS_VERSION).unwrap();
        assert_eq!(v3.len(), v2.len() + 1);
    }

    #[test]
    fn replies_and_requests_of_an_unknown_format_are_refused() {
        let mut v3 = encode_response(&reply()).unwrap();
        v3[3] = BINARY_REPLY_VERSION + 1;
        assert_eq!(
            decode_response(&v3),
            Err(BinaryError::Version(BINARY_REPLY_VERSION + 1))
        );
        let mut request_v3 = encode_request(&request());
        request_v3[3] = BINARY_REQUEST_VERSION + 1;
        assert_eq!(
            decode_request(&request_v3),
            Err(BinaryError::Version(BINARY_REQUEST_VERSION + 1))
        );
    }

    #[test]
    fn every_truncation_is_refused_with_the_field() {
        let body = encode_request(&request());
        for n in 0..body.len() {
            let e = decode_request(&body[..n]).unwrap_err();
            let BinaryError::Malformed(e) = e else {
                panic!("{n}: {e:?}")
            };
            assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
        }
        let body = encode_response(&reply()).unwrap();
        for n in 0..body.len() {
            assert!(
                matches!(decode_response(&body[..n]), Err(BinaryError::Malformed(_))),
                "{n}"
            );
        }
    }

    #[test]
    fn bad_headers_counts_and_trailing_bytes_are_named() {
        let mut body = encode_request(&request());
        body.push(0);
        let e = decode_request(&body).unwrap_err().to_string();
        assert!(e.starts_with("body: 1 bytes after the end"), "{e}");
        let mut v9 = encode_request(&request());
        v9[3] = 9;
        assert_eq!(decode_request(&v9), Err(BinaryError::Version(9)));
        let e = decode_response(&encode_request(&request())).unwrap_err();
        assert!(e.to_string().contains("a request where a reply"), "{e}");
        assert!(decode_request(b"{\"limiter\":\"x\"}")
            .unwrap_err()
            .to_string()
            .contains("magic"));
        // A count far beyond the body is refused before any allocation.
        let mut huge = b"SLq\x01\x01h\0\0\0\0".to_vec();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        let e = decode_request(&huge).unwrap_err().to_string();
        assert!(e.starts_with("deltas: 4294967295 entries announced"), "{e}");
        // An overlong varint.
        let mut long = b"SLq\x01\x01h".to_vec();
        long.extend_from_slice(&[0xff; 10]);
        let e = decode_request(&long).unwrap_err().to_string();
        assert_eq!(e, "quotas_after.epoch: varint larger than 64 bits");
    }

    /// A request body's start: header, limiter `h`, cursor and versions
    /// all 0.
    fn request_head() -> Vec<u8> {
        b"SLq\x01\x01h\0\0\0\0".to_vec()
    }

    fn varint(v: u64) -> Vec<u8> {
        let mut w = Writer::with_capacity(10);
        w.varint(v);
        w.0
    }

    fn malformed(body: &[u8]) -> WireError {
        match decode_request(body) {
            Err(BinaryError::Malformed(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_run_of_more_deltas_than_the_cap_is_refused_before_it_is_read() {
        // A million and one 2-byte deltas, every byte there: the body
        // holds them, the cap does not.
        let n = MAX_DELTAS_PER_SYNC as u64 + 1;
        let mut body = request_head();
        body.extend([1, 0]); // one run, leaky
        body.extend(varint(n));
        body.resize(body.len() + 2 * n as usize, 1);
        body.extend([0, 0]); // no groups, no rejections
        let e = malformed(&body);
        assert_eq!(e.field, "deltas[0..] (run 0)");
        assert!(e.message.starts_with("1000001 entries"), "{}", e.message);
    }

    #[test]
    fn deltas_groups_and_rejection_counts_share_one_cap() {
        let half = MAX_DELTAS_PER_SYNC as u64 / 2;
        let mut body = request_head();
        body.extend([1, 0]);
        body.extend(varint(half));
        body.resize(body.len() + 2 * half as usize, 1);
        // Half a million empty keyed groups: each is an entry.
        body.extend(varint(half));
        for _ in 0..half {
            body.extend([7, 0, 0]);
        }
        body.extend([1, 1, 1]); // one rejection count: one too many
        let e = malformed(&body);
        assert_eq!(e.field, "rejected");
        assert!(e.message.starts_with("1000001 entries"), "{}", e.message);
        // One entry fewer decodes, to exactly the cap.
        let at_cap = body.len() - 3;
        body.truncate(at_cap);
        body.push(0);
        let request = decode_request(&body).unwrap();
        assert_eq!(request.entry_count(), MAX_DELTAS_PER_SYNC);
        assert!(request.check().is_ok());
    }

    #[test]
    fn a_limiter_id_longer_than_allowed_is_refused_before_it_is_copied() {
        let mut body = b"SLq\x01".to_vec();
        body.extend(varint(256));
        body.extend([b'x'; 256]);
        body.extend([0; 7]);
        let e = malformed(&body);
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("limiter", "256 bytes, at most 255")
        );
    }

    #[test]
    fn a_run_of_no_deltas_is_refused() {
        let mut body = request_head();
        body.extend([1, 0, 0, 0, 0]);
        assert_eq!(malformed(&body).message, "a run of no deltas");
    }

    #[test]
    fn binary_is_less_than_half_of_json() {
        let mut r = reply();
        r.quotas.clear();
        r.counters = (1..=1000)
            .map(|id| CounterValue {
                id,
                level: id as f64 * 1.5,
                at: r.root_time - id * 1000,
                prev: 0.0,
            })
            .collect();
        let json = serde_json::to_vec(&r).unwrap().len();
        let binary = encode_response(&r).unwrap().len();
        assert!(binary * 2 < json, "binary {binary}, JSON {json}");
    }

    fn window() -> impl Strategy<Value = Option<i64>> {
        prop_oneof![
            Just(None),
            any::<i64>().prop_map(Some),
            (0i64..4).prop_map(Some)
        ]
    }

    fn arb_request() -> impl Strategy<Value = SyncRequest> {
        let delta = (any::<u64>(), any::<u64>(), window())
            .prop_map(|(id, delta, window)| CounterDelta { id, delta, window });
        let group = (
            any::<u64>(),
            prop::collection::vec(
                (any::<u64>(), any::<u64>()).prop_map(|(h, d)| KeyDelta(h, d)),
                0..8,
            ),
            window(),
        )
            .prop_map(|(id, deltas, window)| KeyedDeltas { id, deltas, window });
        (
            "\\PC{0,20}",
            any::<(u64, u64, u64, u64)>(),
            prop::collection::vec(delta, 0..20),
            prop::collection::vec(group, 0..4),
            prop::collection::vec(any::<(u64, u64)>(), 0..4),
            prop::option::of(any::<(u64, u64)>()),
        )
            .prop_map(
                |(
                    limiter,
                    (epoch, id, counter_version, root_instance),
                    deltas,
                    keyed,
                    rejected,
                    sequence,
                )| {
                    SyncRequest {
                        limiter,
                        quotas_after: QuotaCursor { epoch, id },
                        counter_version,
                        root_instance,
                        deltas,
                        keyed,
                        rejected,
                        sequence: sequence.map(|(incarnation, seq)| Sequence { incarnation, seq }),
                        ..Default::default()
                    }
                },
            )
    }

    /// Any double but NaN (a NaN is never equal to itself; its bits do
    /// come back, see `nan_bits_come_back`).
    fn float() -> impl Strategy<Value = f64> {
        any::<f64>().prop_filter("not NaN", |x| !x.is_nan())
    }

    fn arb_reply() -> impl Strategy<Value = SyncResponse> {
        let counter = (
            any::<u64>(),
            float(),
            any::<u64>(),
            prop_oneof![Just(0.0), float()],
        )
            .prop_map(|(id, level, at, prev)| CounterValue {
                id,
                level,
                at,
                prev,
            });
        let group = (
            any::<u64>(),
            prop::collection::vec(
                (any::<u64>(), float(), any::<u64>()).prop_map(|(h, l, a)| KeyValue(h, l, a)),
                0..8,
            ),
            prop::collection::vec(float(), 0..8),
        )
            .prop_map(|(id, values, mut prev)| {
                prev.truncate(values.len());
                KeyedValues { id, values, prev }
            });
        (
            any::<(u64, u64, u64, u64, u64, bool)>(),
            window(),
            prop::collection::vec(counter, 0..20),
            prop::collection::vec(group, 0..4),
            0usize..3,
        )
            .prop_map(
                |((instance, time, epoch, id, version, more), utc, counters, keyed, quotas)| {
                    SyncResponse {
                        root_instance: instance,
                        root_time: time,
                        root_utc: utc,
                        quotas: (0..quotas as u64)
                            .map(|i| Quota::new(i + 1, format!("q{i}"), 1.0, 2.0, 3.0))
                            .collect(),
                        quotas_after: QuotaCursor { epoch, id },
                        more_quotas: more,
                        counters,
                        keyed,
                        counter_version: version,
                        ..Default::default()
                    }
                },
            )
    }

    proptest! {
        #[test]
        fn encoding_then_decoding_a_request_is_the_identity(r in arb_request()) {
            prop_assert_eq!(decode_request(&encode_request(&r)).unwrap(), r);
        }

        #[test]
        fn encoding_then_decoding_a_reply_is_the_identity(r in arb_reply()) {
            prop_assert_eq!(decode_response(&encode_response(&r).unwrap()).unwrap(), r);
        }

        #[test]
        fn garbage_never_panics(body in prop::collection::vec(any::<u8>(), 0..64)) {
            let mut request = b"SLq\x01".to_vec();
            request.extend_from_slice(&body);
            let _ = decode_request(&request);
            let mut reply = b"SLr\x01".to_vec();
            reply.extend_from_slice(&body);
            let _ = decode_response(&reply);
        }
    }

    #[test]
    fn nan_bits_come_back() {
        let mut r = reply();
        r.counters[0].level = f64::from_bits(0x7ff8_0000_dead_beef);
        let back = decode_response(&encode_response(&r).unwrap()).unwrap();
        assert_eq!(back.counters[0].level.to_bits(), 0x7ff8_0000_dead_beef);
    }
}
