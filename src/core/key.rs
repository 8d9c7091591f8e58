//! Keys of per-key quotas, as sluice keeps them: a keyed hash, never the
//! key itself.
//!
//! A key (a user token, an IP address, an API key) is often a secret or
//! personal data, so the raw bytes are hashed the moment a check sees
//! them, with SipHash-2-4 keyed by a per-fleet secret, and only the hash
//! is stored in the table, sent to roots, kept by roots and shown to
//! operators. Every host of a fleet must hash with the same secret (the
//! same file), or the same key gets different counters on different
//! hosts. Without a secret file a built-in one is used: keys are still
//! not stored, but anyone who knows sluice can then test a guess against
//! a hash, and craft keys whose hashes collide with someone else's.
//!
//! A hash is 64 bits: among ten million live keys of one template two
//! share a counter with a probability of about 3 in a million (n²/2^65).

use siphasher::sip::SipHasher24;
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

    /// The hash `key` is counted under (never 0: 0 marks a free entry).
    pub fn hash(&self, key: &[u8]) -> KeyHash {
        let h = SipHasher24::new_with_keys(self.k0, self.k1).hash(key);
        if h == 0 {
            1
        } else {
            h
        }
    }
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
