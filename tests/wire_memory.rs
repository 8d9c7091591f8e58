//! What decoding a sync request allocates, measured by a counting
//! allocator: a body cannot make the decoder reserve more than its
//! entries, at most [`MAX_DELTAS_PER_SYNC`] of them, can take.
//!
//! The allocator counts, per thread, the bytes allocated and not yet
//! freed, and their peak; each test reads the peak of its own thread
//! around one decode (the body is built before).

mod wire_support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice::wire::binary::{decode_request, encode_request};
use sluice::wire::{
    json_entries_at_most, CounterDelta, SyncRequest, MAX_DELTAS_PER_SYNC, MAX_LIMITER_ID_LEN,
};
use wire_support::tiny_deltas;

struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn grew(bytes: usize) {
    let _ = LIVE.try_with(|live| {
        live.set(live.get() + bytes);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
    });
}

fn shrank(bytes: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(bytes)));
}

// SAFETY: every call is passed on to the system allocator unchanged; the
// counting touches only this thread's cells.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc`, passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: `p` came from this allocator, that is from `System`,
        // with `layout` (the caller's contract).
        unsafe { System.dealloc(p, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `dealloc`, and `new_size` is the caller's valid size.
        let q = unsafe { System.realloc(p, layout, new_size) };
        if !q.is_null() {
            // Both, for a moment.
            grew(new_size);
            shrank(layout.size());
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The most this thread held at once while `f` ran, beyond what it held
/// before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = LIVE.with(Cell::get);
    PEAK.with(|peak| peak.set(before));
    let out = f();
    (out, PEAK.with(Cell::get) - before)
}

const MIB: usize = 1 << 20;

#[test]
fn sixty_four_mib_of_two_byte_deltas_are_refused_without_reserving_for_them() {
    // 33 million deltas of 2 bytes: 32 bytes each once decoded, a
    // gigabyte reserved before this bound.
    let body = tiny_deltas((64 * MIB / 2) as u64);
    let (decoded, peak) = peak_of(|| decode_request(&body));
    assert!(decoded.is_err());
    assert!(peak < MIB, "{peak} bytes allocated");
}

/// 48 bytes an entry, and the limiter id.
const MOST: usize = 48 * MAX_DELTAS_PER_SYNC + MAX_LIMITER_ID_LEN;

#[test]
fn a_request_at_the_cap_decodes_to_at_most_48_bytes_an_entry() {
    let request = SyncRequest {
        limiter: "h".into(),
        quotas_after: Default::default(),
        counter_version: 0,
        root_instance: 0,
        deltas: (0..MAX_DELTAS_PER_SYNC as u64)
            .map(|id| CounterDelta {
                id,
                delta: 1,
                window: None,
            })
            .collect(),
        keyed: Vec::new(),
        rejected: Vec::new(),
        ..Default::default()
    };
    let body = encode_request(&request);
    drop(request);
    let (decoded, peak) = peak_of(|| decode_request(&body).unwrap());
    assert_eq!(decoded.entry_count(), MAX_DELTAS_PER_SYNC);
    assert!(peak <= MOST, "{peak} bytes");
    drop(decoded);
    // Keyed groups are entries too: a million empty ones.
    let mut body = b"SLq\x01\x01h\0\0\0\0\0".to_vec();
    body.extend([0xc0, 0x84, 0x3d]); // 1,000,000
    for _ in 0..MAX_DELTAS_PER_SYNC {
        body.extend([7, 0, 0]);
    }
    body.push(0);
    let (decoded, peak) = peak_of(|| decode_request(&body).unwrap());
    assert_eq!(decoded.keyed.len(), MAX_DELTAS_PER_SYNC);
    assert!(peak <= MOST, "{peak} bytes");
}

#[test]
fn a_json_request_decodes_to_at_most_64_bytes_for_each_object_or_array() {
    // A million rejection counts, the smallest JSON entries there are.
    let mut body = b"{\"limiter\":\"h\",\"rejected\":[".to_vec();
    for i in 0..MAX_DELTAS_PER_SYNC {
        body.extend(format!("[{i},1],").as_bytes());
    }
    body.pop();
    body.extend(b"]}");
    let bound = json_entries_at_most(&body);
    let (decoded, peak) = peak_of(|| serde_json::from_slice::<SyncRequest>(&body).unwrap());
    assert!(decoded.entry_count() <= bound);
    assert!(peak <= 64 * bound, "{peak} bytes for {bound}");
}
