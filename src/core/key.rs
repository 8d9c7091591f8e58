//! Keys of per-key quotas, as sluice keeps them: a keyed hash, never the
//! key itself.
//!
//! A key (a user token, an IP address, an API key) is often a secret or
//! personal data, so the raw bytes are hashed the moment a check sees
//! them, with SipHash-1-3 keyed by a per-fleet secret, and only the hash
//! is stored in the table, sent to roots, kept by roots and shown to
//! operators.
//!
//! Why SipHash-1-3: the hash must be unpredictable to anyone without the
//! secret (else an attacker picks keys that fall into one bucket pair, or
//! share a victim's counter) and must not give the key away. That is a
//! keyed pseudo-random function, which SipHash is; the 1-3 variant (one
//! compression round a word, three to finish) is the one Rust's standard
//! hash maps and CPython's `hash()` rely on for exactly this defence
//! against hash flooding, with no practical attack known on it as a PRF.
//! It costs about half of SipHash-2-4 on a short key, which was a tenth of
//! a keyed check. It is written out here for byte slices (no buffering
//! hasher): one 8-byte load a word. Every host of a fleet must hash with the same secret (the
//! same file), or the same key gets different counters on different
//! hosts. Without a secret file a built-in one is used: keys are still
//! not stored, but anyone who knows sluice can then test a guess against
//! a hash, and craft keys whose hashes collide with someone else's.
//!
//! A hash is 64 bits: among ten million live keys of one template two
//! share a counter with a probability of about 3 in a million (n²/2^65).

use siphasher::sip128::{Hasher128, SipHasher24 as SipHasher128};

/// A key's counter name: the keyed hash of the key (never 0).
pub type KeyHash = u64;

/// Shortest secret a secret file may hold, in bytes (after trimming).
pub const MIN_SECRET_LEN: usize = 16;

/// The secret keys are hashed with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeySecret {
    k0: u64,
    k1: u64,
}

impl std::fmt::Debug for KeySecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret itself.
        f.write_str("KeySecret(..)")
    }
}

/// Derives the two SipHash keys from text (the built-in secret's, and a
/// secret file's).
fn derive(text: &[u8]) -> KeySecret {
    const SALT: (u64, u64) = (0x736c_7569_6365_2d6b, 0x6579_2d73_6563_7265);
    let mut h = SipHasher128::new_with_keys(SALT.0, SALT.1);
    std::hash::Hasher::write(&mut h, text);
    let out = h.finish128();
    KeySecret {
        k0: out.h1,
        k1: out.h2,
    }
}

impl KeySecret {
    /// The secret used when no secret file is configured.
    pub fn built_in() -> Self {
        derive(b"sluice built-in key secret: set sluice_key_secret_file")
    }

    /// The secret in a secret file's contents: the text without leading
    /// and trailing white space, at least [`MIN_SECRET_LEN`] bytes.
    pub fn from_file_contents(contents: &[u8]) -> Result<Self, String> {
        let text = contents.trim_ascii();
        if text.len() < MIN_SECRET_LEN {
            return Err(format!(
                "holds {} bytes of secret, at least {MIN_SECRET_LEN} are needed \
                 (for example: openssl rand -hex 32)",
                text.len()
            ));
        }
        Ok(derive(text))
    }

    /// The two 64-bit SipHash keys, for storing the secret in a table
    /// region every process of a host shares.
    pub fn to_words(self) -> (u64, u64) {
        (self.k0, self.k1)
    }

    /// The secret from [`KeySecret::to_words`].
    pub fn from_words(k0: u64, k1: u64) -> Self {
        Self { k0, k1 }
    }

    /// The hash `key` is counted under (never 0: 0 marks a free entry;
    /// never `u64::MAX`, which marks an entry being made).
    #[inline]
    pub fn hash(&self, key: &[u8]) -> KeyHash {
        match sip13(self.k0, self.k1, key) {
            0 => 1,
            u64::MAX => u64::MAX - 1,
            h => h,
        }
    }
}

/// SipHash-1-3 of `data` under the key `(k0, k1)`, as its authors define
/// it: little-endian 8-byte words, the last one padded with zeroes and
/// the length's low byte on top. Inlined into the check that hashes.
#[inline(always)]
fn sip13(k0: u64, k1: u64, data: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let m = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        v[3] ^= m;
        sip_round(&mut v);
        v[0] ^= m;
    }
    let mut last = (data.len() as u64 & 0xff) << 56;
    for (i, &b) in words.remainder().iter().enumerate() {
        last |= u64::from(b) << (8 * i);
    }
    v[3] ^= last;
    sip_round(&mut v);
    v[0] ^= last;
    v[2] ^= 0xff;
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// One SipRound over the state.
#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13) ^ v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16) ^ v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21) ^ v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17) ^ v[2];
    v[2] = v[2].rotate_left(32);
}

/// Longest key a check takes, in bytes (the C ABI's
/// `SLUICE_MAX_KEY_LEN`): a key is hashed whole on every check, and a
/// longer one is taken for a caller's bug.
pub const MAX_KEY_LEN: usize = 65536;

/// Checks the length of a key given to a check: at most [`MAX_KEY_LEN`]
/// bytes. The empty key passes here: a check given it passes uncounted
/// (`NO_KEY`).
pub fn check_key_len(len: usize) -> Result<(), String> {
    if len > MAX_KEY_LEN {
        return Err(format!(
            "key is {len} bytes long, at most {MAX_KEY_LEN} allowed"
        ));
    }
    Ok(())
}

/// Checks a key an operator names (to hash it, to override it): one that
/// a check can count. Not empty (nginx and the C ABI pass a request with
/// an empty key uncounted, as `NO_KEY`, so nothing said of it could ever
/// apply) and within [`check_key_len`].
pub fn check_named_key(key: &[u8]) -> Result<(), String> {
    if key.is_empty() {
        return Err(
            "key is empty: a request with an empty key is not counted (NO_KEY), \
                    so no override or hash of it can ever apply"
                .to_string(),
        );
    }
    check_key_len(key.len())
}

/// A key hash as operators see it: 16 lowercase hex digits.
pub fn format_hash(hash: KeyHash) -> String {
    format!("{hash:016x}")
}

/// Parses [`format_hash`]'s form (exactly 16 hex digits, not all zero).
pub fn parse_hash(text: &str) -> Option<KeyHash> {
    // `from_str_radix` alone would also take a sign (`+00000000000000a`).
    if text.len() != 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok().filter(|&h| h != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_key_is_one_a_check_counts() {
        assert!(check_named_key(b"bob").is_ok());
        assert!(check_named_key(&[b'k'; MAX_KEY_LEN]).is_ok());
        let empty = check_named_key(b"").unwrap_err();
        assert!(empty.starts_with("key is empty"), "{empty}");
        let long = check_named_key(&[b'k'; MAX_KEY_LEN + 1]).unwrap_err();
        assert_eq!(long, check_key_len(MAX_KEY_LEN + 1).unwrap_err());
        assert_eq!(long, "key is 65537 bytes long, at most 65536 allowed");
        assert!(check_key_len(0).is_ok(), "a check's empty key is NO_KEY");
    }

    #[test]
    fn one_secret_hashes_a_key_the_same_everywhere_and_others_differ() {
        let a = KeySecret::from_file_contents(b"0123456789abcdef0123\n").unwrap();
        let again = KeySecret::from_file_contents(b"  0123456789abcdef0123  ").unwrap();
        let other = KeySecret::from_file_contents(b"0123456789abcdef0124").unwrap();
        assert_eq!(a.hash(b"token-1"), again.hash(b"token-1"));
        assert_ne!(a.hash(b"token-1"), other.hash(b"token-1"));
        assert_ne!(a.hash(b"token-1"), a.hash(b"token-2"));
        assert_ne!(a.hash(b"token-1"), KeySecret::built_in().hash(b"token-1"));
        let (k0, k1) = a.to_words();
        assert_eq!(KeySecret::from_words(k0, k1), a);
    }

    #[test]
    fn the_hash_is_siphash_1_3_for_every_length() {
        use std::hash::Hasher;
        let data: Vec<u8> = (0u8..=255).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        for (k0, k1) in [
            (0, 0),
            (0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908),
            (7, u64::MAX),
        ] {
            for len in 0..=64 {
                let mut reference = siphasher::sip::SipHasher13::new_with_keys(k0, k1);
                reference.write(&data[..len]);
                assert_eq!(
                    sip13(k0, k1, &data[..len]),
                    reference.finish(),
                    "length {len}"
                );
            }
        }
    }

    #[test]
    fn short_secrets_are_refused_and_the_secret_never_prints() {
        assert!(KeySecret::from_file_contents(b"  short \n").is_err());
        assert_eq!(format!("{:?}", KeySecret::built_in()), "KeySecret(..)");
    }

    #[test]
    fn a_hash_is_16_hex_digits_and_nothing_else() {
        // Seen while writing the `names` fuzz target, whose round trip
        // (parse, then format) states the rule.
        assert_eq!(parse_hash("00000000deadbeef"), Some(0xdead_beef));
        assert_eq!(parse_hash("00000000DEADBEEF"), Some(0xdead_beef));
        for bad in [
            "+0000000deadbeef",
            "-0000000deadbeef",
            "0000000000000000",
            "deadbeef",
            " 0000000deadbeef",
        ] {
            assert_eq!(parse_hash(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn any_bytes_are_a_key_and_hashes_are_never_zero() {
        let s = KeySecret::built_in();
        let big = vec![0xffu8; 64 << 10];
        for key in [&b""[..], b"\0", &[0xc3, 0x28], &big] {
            assert_ne!(s.hash(key), 0);
        }
    }

    #[test]
    fn hashes_print_as_sixteen_hex_digits_and_parse_back() {
        let h = KeySecret::built_in().hash(b"10.0.0.1");
        let text = format_hash(h);
        assert_eq!(text.len(), 16);
        assert_eq!(parse_hash(&text), Some(h));
        assert_eq!(format_hash(0xab), "00000000000000ab");
        for bad in [
            "",
            "ab",
            "0000000000000000",
            "xyz0000000000000",
            "00000000000000abc",
        ] {
            assert_eq!(parse_hash(bad), None, "{bad}");
        }
    }
}
