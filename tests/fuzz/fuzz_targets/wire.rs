//! The sync protocol's decoders and their checks: a request as a root
//! reads it (`SyncRequest` from JSON, then `SyncRequest::check`), a reply
//! as a limiter reads it (`SyncResponse`, `SyncResponse::validate`), then
//! applied to a real table; the same two in the binary encoding
//! (`sluice::wire::binary`); and the `sluice-clock` header.
//!
//! The first byte picks which; the rest is the body.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sluice::core::Tally;
use sluice::table::{Outcome, Table};
use sluice::wire::binary::{decode_request, decode_response, encode_request, encode_response};
use sluice::wire::{
    json_entries_at_most, ClockReport, SyncRequest, SyncResponse, MAX_DELTAS_PER_SYNC,
};

fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

fn request(body: &[u8]) {
    let Ok(request) = serde_json::from_slice::<SyncRequest>(body) else {
        return;
    };
    // The bound a root reserves memory by before it parses a body.
    assert!(request.entry_count() <= json_entries_at_most(body));
    let verdict = request.check();
    if let Err(e) = &verdict {
        assert!(!e.field.is_empty() && !e.message.is_empty(), "{e:?}");
    }
    // No floats in a request: it comes back exactly, and so does the
    // verdict.
    let json = serde_json::to_vec(&request).expect("a request encodes");
    let back: SyncRequest = serde_json::from_slice(&json).expect("and decodes");
    assert_eq!(back, request);
    assert_eq!(back.check(), verdict);
}

fn response(body: &[u8]) {
    let Ok(reply) = serde_json::from_slice::<SyncResponse>(body) else {
        return;
    };
    if reply.validate().is_err() {
        return;
    }
    // A valid reply stays valid through JSON.
    let json = serde_json::to_vec(&reply).expect("a reply encodes");
    let back: SyncResponse = serde_json::from_slice(&json).expect("and decodes");
    if let Err(e) = back.validate() {
        panic!("valid reply invalid after a round trip: {e}");
    }
    assert_eq!(back.quotas.len(), reply.quotas.len());
    assert_eq!(back.counters.len(), reply.counters.len());
    for (a, b) in reply.counters.iter().zip(&back.counters) {
        assert!(a.id == b.id && a.at == b.at && close(a.level, b.level) && close(a.prev, b.prev));
    }
    apply(&reply);
}

/// A binary request as a root reads it: decoded or refused with a field;
/// a decoded one re-encodes to a body that decodes to it again, with the
/// same verdict.
fn binary_request(body: &[u8]) {
    let request = match decode_request(body) {
        Ok(request) => request,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    // Decoding stops at the cap before it allocates past it.
    assert!(request.entry_count() <= MAX_DELTAS_PER_SYNC);
    let verdict = request.check();
    let again = decode_request(&encode_request(&request)).expect("a request re-encodes");
    assert_eq!(again, request);
    assert_eq!(again.check(), verdict);
}

/// A binary reply as a limiter reads it: decoded and validated, or
/// dropped; a valid one survives a round trip bit for bit and applies
/// to a table.
fn binary_response(body: &[u8]) {
    let Ok(reply) = decode_response(body) else {
        return;
    };
    if reply.validate().is_err() {
        return;
    }
    let bytes = encode_response(&reply).expect("a decoded reply re-encodes");
    let back = decode_response(&bytes).expect("and decodes");
    assert_eq!(encode_response(&back).expect("again"), bytes);
    assert!(back.validate().is_ok());
    apply(&reply);
}

/// What the limiter does with a valid reply, whatever its encoding.
fn apply(reply: &SyncResponse) {
    // What the limiter does with it: quotas into the table, counters
    // merged into the slots that hold their quotas. Nothing a valid reply
    // says may break the table.
    let table = Table::new_heap(64, 32);
    let report = table.books().apply_quotas(&reply.quotas);
    let handled =
        report.inserted + report.updated + report.deleted + report.stale + report.refused.len();
    assert_eq!(handled, reply.quotas.len(), "{report:?}");
    let slots = table.books().slot_ids();
    for c in &reply.counters {
        if let Some(&slot) = slots.get(&c.id) {
            let value = Tally {
                level: c.level,
                prev: c.prev,
                at: c.at,
            };
            assert!(
                table.books().merge_counter(slot, c.id, 0, value, 0, 0),
                "{c:?}"
            );
        }
    }
    for q in reply.quotas.iter().take(16) {
        let outcome = table.gate().check(q.name.as_bytes(), 1, reply.root_time);
        if table.quota(q.name.as_bytes(), 0).is_some() {
            assert!(!matches!(outcome, Outcome::Unknown), "{}", q.name);
        }
    }
}

fn clock(body: &[u8]) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    if let Some(report) = ClockReport::parse(text) {
        assert_eq!(ClockReport::parse(&report.header_value()), Some(report));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    match kind % 5 {
        0 => request(body),
        1 => response(body),
        2 => clock(body),
        3 => binary_request(body),
        _ => binary_response(body),
    }
});
