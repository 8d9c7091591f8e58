//! Sync bodies built byte by byte, for the tests (and the bench) that
//! send what no encoder writes.

/// A binary request of limiter `h` (cursor and versions 0) with one
/// leaky run of `n` deltas of 2 bytes each, then no keyed groups and no
/// rejection counts: issue 22's body, 32 bytes of memory for every 2 of
/// body before decoding was bounded.
pub fn tiny_deltas(n: u64) -> Vec<u8> {
    let mut body = b"SLq\x01\x01h\0\0\0\0\x01\0".to_vec();
    let mut v = n;
    while v >= 0x80 {
        body.push(v as u8 | 0x80);
        v >>= 7;
    }
    body.push(v as u8);
    body.resize(body.len() + 2 * n as usize, 1);
    body.extend([0, 0]);
    body
}
