//! The binary format's building blocks: its versions and header, and the
//! writer and reader of varints, fixed words, floats, strings and the
//! delta lists every request and reply is made of. What each format
//! holds is in the parent module's doc.

use crate::wire::{
    too_many_entries, CounterDelta, KeyDelta, KeyedDeltas, RefusedKeys, WireError,
    MAX_DELTAS_PER_SYNC,
};

/// Content type of a binary sync body (request or reply).
pub const BINARY_CONTENT_TYPE: &str = "application/x-sluice-sync";

/// The first version of the binary format: requests without returns, and
/// replies to a limiter that does not ask for more.
pub const BINARY_VERSION: u8 = 1;

/// The request format that adds returns.
pub const BINARY_RETURNS_VERSION: u8 = 2;

/// The request format that adds the tiers section.
pub const BINARY_TIERS_REQUEST_VERSION: u8 = 3;

/// The request format that adds the request's sequence
/// ([`super::Sequence`]).
pub const BINARY_SEQUENCE_REQUEST_VERSION: u8 = 4;

/// The request format that adds the slots the limiter holds
/// ([`super::SyncRequest::held`]).
pub const BINARY_HELD_REQUEST_VERSION: u8 = 5;

/// The request format that adds the keys the limiter holds
/// ([`super::SyncRequest::interest`]).
pub const BINARY_INTEREST_REQUEST_VERSION: u8 = 6;

/// The newest request format: [`BINARY_INTEREST_REQUEST_VERSION`]'s with
/// the slots the limiter holds of keys ([`super::SyncRequest::keyed_held`]).
pub const BINARY_REQUEST_VERSION: u8 = 7;

/// The reply format that adds keyed groups' previous-window counts.
pub const BINARY_PREV_VERSION: u8 = 2;

/// The reply format that adds flags (the root takes returns).
pub const BINARY_FLAGS_VERSION: u8 = 3;

/// The reply format that adds the tiers section.
pub const BINARY_TIERS_REPLY_VERSION: u8 = 4;

/// The reply format whose flags may also say the root takes sequences,
/// with how far it applied them.
pub const BINARY_SEQUENCE_REPLY_VERSION: u8 = 5;

/// The reply format that adds the keys the root refused to hold.
pub const BINARY_REFUSED_REPLY_VERSION: u8 = 6;

/// The reply format whose flags may also say the root takes held slots.
pub const BINARY_HELD_REPLY_VERSION: u8 = 7;

/// The reply format whose flags may also say the root answers by
/// interest, and wants the limiter's whole list.
pub const BINARY_INTEREST_REPLY_VERSION: u8 = 8;

/// The newest reply format: [`BINARY_INTEREST_REPLY_VERSION`]'s whose
/// flags may also say the root takes the held slots of keys.
pub const BINARY_REPLY_VERSION: u8 = 9;

/// Reply flag: the root takes returns ([`SyncResponse::takes_returns`]).
pub(super) const TAKES_RETURNS: u64 = 1;

/// Reply flag: the root takes tiers ([`SyncResponse::takes_tiers`]).
pub(super) const TAKES_TIERS: u64 = 2;

/// Reply flag: the root takes sequences ([`SyncResponse::takes_sequence`]).
pub(super) const TAKES_SEQUENCE: u64 = 4;

/// Reply flag: the root takes held slots ([`SyncResponse::takes_held`]).
pub(super) const TAKES_HELD: u64 = 8;

/// Reply flag: the root answers by interest
/// ([`SyncResponse::takes_interest`]).
pub(super) const TAKES_INTEREST: u64 = 16;

/// Reply flag: the root wants the limiter's whole interest list
/// ([`SyncResponse::wants_interest`]).
pub(super) const WANTS_INTEREST: u64 = 32;

/// Reply flag: the root takes the held slots of keys
/// ([`SyncResponse::takes_keyed_held`]).
pub(super) const TAKES_KEYED_HELD: u64 = 64;

/// The header's first two bytes.
pub(super) const MAGIC: [u8; 2] = *b"SL";
/// The header's kind byte of a request.
pub(super) const KIND_REQUEST: u8 = b'q';
/// The header's kind byte of a reply.
pub(super) const KIND_REPLY: u8 = b'r';

/// Why a binary body cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BinaryError {
    /// A format version this build does not read.
    #[error(
        "binary sync format version {0}: this build reads versions {BINARY_VERSION} to \
         {BINARY_REQUEST_VERSION} of requests and {BINARY_VERSION} to {BINARY_REPLY_VERSION} \
         of replies"
    )]
    Version(u8),
    /// Not a well-formed body: the field where it broke and why.
    #[error(transparent)]
    Malformed(#[from] WireError),
}

pub(super) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(super) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends the encoding to a buffer.
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn with_capacity(n: usize) -> Self {
        Self(Vec::with_capacity(n))
    }

    pub(super) fn header(&mut self, kind: u8, version: u8) {
        self.0.extend_from_slice(&MAGIC);
        self.0.push(kind);
        self.0.push(version);
    }

    /// Named deltas (or returns), as runs of one window.
    pub(super) fn named(&mut self, deltas: &[CounterDelta]) {
        let runs = deltas
            .chunk_by(|a, b| a.window == b.window)
            .collect::<Vec<_>>();
        self.varint(runs.len() as u64);
        for run in runs {
            self.window(run[0].window);
            self.varint(run.len() as u64);
            for d in run {
                self.varint(d.id);
                self.varint(d.delta);
            }
        }
    }

    /// Keys' deltas (or returns), by template.
    pub(super) fn keyed(&mut self, groups: &[KeyedDeltas]) {
        self.varint(groups.len() as u64);
        for group in groups {
            self.varint(group.id);
            self.window(group.window);
            self.varint(group.deltas.len() as u64);
            for d in &group.deltas {
                self.fixed(d.0);
                self.varint(d.1);
            }
        }
    }

    /// Keys by template (a reply's refused keys, a request's interest):
    /// per template its id, a count and the keys' hashes.
    pub(super) fn key_groups(&mut self, groups: &[RefusedKeys]) {
        self.varint(groups.len() as u64);
        for group in groups {
            self.varint(group.id);
            self.varint(group.keys.len() as u64);
            for &key in &group.keys {
                self.fixed(key);
            }
        }
    }

    #[inline]
    pub(super) fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }

    #[inline]
    pub(super) fn fixed(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    #[inline]
    pub(super) fn float(&mut self, v: f64) {
        self.fixed(v.to_bits());
    }

    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    /// An optional signed number: a tag byte (0: none, 1: some), then the
    /// number zigzagged.
    pub(super) fn window(&mut self, w: Option<i64>) {
        match w {
            None => self.0.push(0),
            Some(v) => {
                self.0.push(1);
                self.varint(zigzag(v));
            }
        }
    }
}

/// Reads an encoding, naming the field where it breaks.
pub(super) struct Reader<'a> {
    body: &'a [u8],
    at: usize,
    /// Entries a request may still announce (see [`Reader::entries`]).
    pub(super) entries_left: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(body: &'a [u8]) -> Self {
        Self {
            body,
            at: 0,
            entries_left: usize::MAX,
        }
    }

    pub(super) fn left(&self) -> usize {
        self.body.len() - self.at
    }

    pub(super) fn truncated(&self, field: String) -> WireError {
        WireError::new(
            field,
            format!("body truncated: it ends at byte {}", self.body.len()),
        )
    }

    /// Reads the header of a body of `kind`; returns its format version
    /// (requests: up to [`BINARY_REQUEST_VERSION`]; replies: up to
    /// [`BINARY_REPLY_VERSION`]).
    pub(super) fn header(&mut self, kind: u8) -> Result<u8, BinaryError> {
        let Some(head) = self.body.get(..4) else {
            return Err(WireError::new(
                "header",
                format!(
                    "{} bytes: a binary sync body starts with 4",
                    self.body.len()
                ),
            )
            .into());
        };
        if head[..2] != MAGIC {
            return Err(WireError::new("header", "not a binary sync body (no SL magic)").into());
        }
        let newest = if kind == KIND_REPLY {
            BINARY_REPLY_VERSION
        } else {
            BINARY_REQUEST_VERSION
        };
        if !(BINARY_VERSION..=newest).contains(&head[3]) {
            return Err(BinaryError::Version(head[3]));
        }
        if head[2] != kind {
            let what = |k| match k {
                KIND_REQUEST => "a request".to_string(),
                KIND_REPLY => "a reply".to_string(),
                other => format!("kind {other:#x}"),
            };
            return Err(WireError::new(
                "header",
                format!("{} where {} was expected", what(head[2]), what(kind)),
            )
            .into());
        }
        self.at = 4;
        Ok(head[3])
    }

    #[inline]
    pub(super) fn byte(&mut self, field: impl Fn() -> String) -> Result<u8, WireError> {
        let b = *self
            .body
            .get(self.at)
            .ok_or_else(|| self.truncated(field()))?;
        self.at += 1;
        Ok(b)
    }

    pub(super) fn varint(&mut self, field: &str) -> Result<u64, WireError> {
        self.varint_or(|| field.to_string())
    }

    /// Named deltas (or returns) called `what`, as runs of one window.
    pub(super) fn named(&mut self, what: &str) -> Result<Vec<CounterDelta>, WireError> {
        // A run is at least 2 bytes (window tag, count), a delta 2 (id, delta).
        let runs = self.count(2, || what.into())?;
        let mut deltas = Vec::new();
        for run in 0..runs {
            let window = self.window(|| format!("{what} (run {run}).window"))?;
            let at = deltas.len();
            let n = self.entries(2, || format!("{what}[{at}..] (run {run})"))?;
            if n == 0 {
                // An encoder never writes one; millions would cost time for
                // nothing.
                return Err(WireError::new(
                    format!("{what}[{at}..] (run {run})"),
                    "a run of no deltas",
                ));
            }
            deltas.reserve(n);
            for _ in 0..n {
                let i = deltas.len();
                let id = self.varint_or(|| format!("{what}[{i}].id"))?;
                let delta = self.varint_or(|| format!("{what}[{i}].delta"))?;
                deltas.push(CounterDelta { id, delta, window });
            }
        }
        Ok(deltas)
    }

    /// Keys' deltas (or returns) called `what`, by template.
    pub(super) fn keyed(&mut self, what: &str) -> Result<Vec<KeyedDeltas>, WireError> {
        // A group is at least 3 bytes (id, window tag, count), a key 9.
        let groups = self.entries(3, || what.into())?;
        let mut keyed = Vec::with_capacity(groups);
        for g in 0..groups {
            let id = self.varint_or(|| format!("{what}[{g}].id"))?;
            let window = self.window(|| format!("{what}[{g}].window"))?;
            let n = self.entries(9, || format!("{what}[{g}].deltas"))?;
            let mut keys = Vec::with_capacity(n);
            for i in 0..n {
                let hash = self.fixed(|| format!("{what}[{g}].deltas[{i}]"))?;
                let delta = self.varint_or(|| format!("{what}[{g}].deltas[{i}]"))?;
                keys.push(KeyDelta(hash, delta));
            }
            keyed.push(KeyedDeltas {
                id,
                deltas: keys,
                window,
            });
        }
        Ok(keyed)
    }

    /// Keys by template called `what` (see [`Writer::key_groups`]); in a
    /// request (`entries`) they take entries of [`MAX_DELTAS_PER_SYNC`].
    pub(super) fn key_groups(
        &mut self,
        what: &str,
        entries: bool,
    ) -> Result<Vec<RefusedKeys>, WireError> {
        let count = |r: &mut Self, min: usize, field: &dyn Fn() -> String| {
            if entries {
                r.entries(min, field)
            } else {
                r.count(min, field)
            }
        };
        // A group is at least 2 bytes (id, count), a key 8.
        let groups = count(self, 2, &|| what.into())?;
        let mut out = Vec::with_capacity(groups);
        for g in 0..groups {
            let id = self.varint_or(|| format!("{what}[{g}].id"))?;
            let n = count(self, 8, &|| format!("{what}[{g}].keys"))?;
            let mut keys = Vec::with_capacity(n);
            for i in 0..n {
                keys.push(self.fixed(|| format!("{what}[{g}].keys[{i}]"))?);
            }
            out.push(RefusedKeys { id, keys });
        }
        Ok(out)
    }

    #[inline]
    pub(super) fn varint_or(&mut self, field: impl Fn() -> String) -> Result<u64, WireError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte(&field)?;
            // The tenth byte holds the 64th bit only.
            if shift == 63 && b > 1 {
                return Err(WireError::new(field(), "varint larger than 64 bits"));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(WireError::new(field(), "varint larger than 64 bits"))
    }

    #[inline]
    pub(super) fn fixed(&mut self, field: impl Fn() -> String) -> Result<u64, WireError> {
        let bytes = self
            .body
            .get(self.at..self.at + 8)
            .ok_or_else(|| self.truncated(field()))?;
        self.at += 8;
        Ok(u64::from_le_bytes(bytes.try_into().expect("8 bytes")))
    }

    #[inline]
    pub(super) fn float(&mut self, field: impl Fn() -> String) -> Result<f64, WireError> {
        self.fixed(field).map(f64::from_bits)
    }

    pub(super) fn window(&mut self, field: impl Fn() -> String) -> Result<Option<i64>, WireError> {
        match self.byte(&field)? {
            0 => Ok(None),
            1 => Ok(Some(unzigzag(self.varint_or(&field)?))),
            tag => Err(WireError::new(
                field(),
                format!("option tag {tag}: 0 (none) or 1 (some)"),
            )),
        }
    }

    /// A list's length, when the bytes left could hold that many entries
    /// of at least `min_size` bytes each.
    pub(super) fn count(
        &mut self,
        min_size: usize,
        field: impl Fn() -> String,
    ) -> Result<usize, WireError> {
        let n = self.varint_or(&field)?;
        let most = self.left() / min_size;
        if n > most as u64 {
            return Err(WireError::new(
                field(),
                format!(
                    "{n} entries announced, but the {} bytes left hold at most {most}",
                    self.left()
                ),
            ));
        }
        Ok(n as usize)
    }

    /// As [`Self::count`], for a list of a request's entries: also at
    /// most the entries left of [`MAX_DELTAS_PER_SYNC`], which it takes.
    pub(super) fn entries(
        &mut self,
        min_size: usize,
        field: impl Fn() -> String,
    ) -> Result<usize, WireError> {
        let n = self.count(min_size, &field)?;
        if n > self.entries_left {
            let announced = MAX_DELTAS_PER_SYNC - self.entries_left + n;
            return Err(WireError {
                field: field(),
                ..too_many_entries(announced)
            });
        }
        self.entries_left -= n;
        Ok(n)
    }

    /// Bytes with a length prefix, at most `most` of them.
    pub(super) fn slice(
        &mut self,
        field: impl Fn() -> String,
        most: usize,
    ) -> Result<&'a [u8], WireError> {
        let n = self.count(1, &field)?;
        if n > most {
            return Err(WireError::new(
                field(),
                format!("{n} bytes, at most {most}"),
            ));
        }
        let s = &self.body[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub(super) fn string(&mut self, field: &str, most: usize) -> Result<String, WireError> {
        let bytes = self.slice(|| field.to_string(), most)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| WireError::new(field, "not valid UTF-8"))
    }

    pub(super) fn end(&self) -> Result<(), WireError> {
        if self.left() > 0 {
            return Err(WireError::new(
                "body",
                format!(
                    "{} bytes after the end of the body (at byte {})",
                    self.left(),
                    self.at
                ),
            ));
        }
        Ok(())
    }
}
