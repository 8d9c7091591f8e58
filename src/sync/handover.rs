//! The handover record: what a sync thread leaves in the region before
//! every exchange it starts, so that a thread taking over after it died
//! (an nginx worker killed) sends what it had sent again under the same
//! numbers, and each root counts it once (docs/DESIGN.md, "Exactly once",
//! *A sync thread that dies*).
//!
//! The record holds the dead thread's incarnation, its unacknowledged
//! weight per counter, and per root the next request number, the numbered
//! requests not confirmed yet (the one under way among them) and the
//! weight owed unnumbered. The successor continues that incarnation:
//! each request goes again under its number, which a root that applied it
//! answers without counting it again.
//!
//! The encoding is private to this build and the region it lives in:
//! little-endian words, a version first; a record of another version or
//! that does not parse is not taken over (the weight is sent again as
//! new, as before records existed).

use super::link::{Owed, OwedDeltas, OwedWindow, Unconfirmed};
use crate::core::Level;
use crate::table::SlotId;
use crate::wire::CounterKey;

/// The encoding's version (first word of a record).
const VERSION: u64 = 1;

/// A sync thread's state as a successor takes it over.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Record {
    /// The limiter id the thread synced as.
    pub limiter: String,
    /// Its incarnation (numbered requests' stream id).
    pub incarnation: u64,
    /// Unacknowledged weight per counter: its slot, weight added, weight
    /// given back.
    pub unacked: Vec<(CounterKey, SlotId, u64, u64)>,
    /// Per root.
    pub links: Vec<LinkRecord>,
}

/// What a thread had under way with one root.
#[derive(Debug, Default, PartialEq)]
pub(super) struct LinkRecord {
    /// The root's base URL.
    pub url: String,
    /// The incarnation of the thread whose requests these are (the
    /// record's own, or an earlier thread's it held as orphans).
    pub incarnation: u64,
    /// The number its next new request would have taken (0 for an
    /// earlier thread's).
    pub next_seq: u64,
    /// Numbered requests not confirmed, the one under way among them, in
    /// increasing order of number.
    pub parts: Vec<Unconfirmed>,
    /// Weight owed unnumbered (never sent, or sent in an unnumbered
    /// request under way).
    pub owed: OwedDeltas,
}

impl LinkRecord {
    /// The record borrowed, to encode.
    pub fn view(&self) -> LinkView<'_> {
        LinkView {
            url: &self.url,
            incarnation: self.incarnation,
            next_seq: self.next_seq,
            parts: self.parts.iter().map(|p| (p.seq, &p.owed)).collect(),
            owed: vec![&self.owed],
        }
    }
}

/// A [`LinkRecord`] borrowed from a link's state, to encode without
/// copying what its requests pay off (the live record is left before
/// every exchange).
pub(super) struct LinkView<'a> {
    pub url: &'a str,
    pub incarnation: u64,
    pub next_seq: u64,
    /// Numbered requests, in increasing order of number.
    pub parts: Vec<(u64, &'a OwedDeltas)>,
    /// Owed weight, in one or more maps (a counter in several is owed
    /// their sum).
    pub owed: Vec<&'a OwedDeltas>,
}

impl LinkView<'_> {
    /// Nothing under way and nothing owed.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty() && self.owed.iter().all(|o| o.is_empty())
    }

    /// The record owned.
    pub fn to_record(&self) -> LinkRecord {
        let mut owed = OwedDeltas::default();
        for map in &self.owed {
            for (&c, &o) in map.iter() {
                owed.entry(c).and_modify(|e| *e = e.combine(o)).or_insert(o);
            }
        }
        LinkRecord {
            url: self.url.to_string(),
            incarnation: self.incarnation,
            next_seq: self.next_seq,
            parts: self
                .parts
                .iter()
                .map(|&(seq, owed)| Unconfirmed {
                    seq,
                    owed: owed.clone(),
                })
                .collect(),
            owed,
        }
    }
}

/// `record` encoded.
pub(super) fn encode(record: &Record) -> Vec<u8> {
    let links: Vec<LinkView<'_>> = record.links.iter().map(LinkRecord::view).collect();
    encode_parts(&record.limiter, record.incarnation, &record.unacked, &links)
}

/// A record of these parts encoded (see [`Record`]).
pub(super) fn encode_parts(
    limiter: &str,
    incarnation: u64,
    unacked: &[(CounterKey, SlotId, u64, u64)],
    links: &[LinkView<'_>],
) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(256));
    w.u64(VERSION);
    w.bytes(limiter.as_bytes());
    w.u64(incarnation);
    w.u64(unacked.len() as u64);
    for &(c, slot, added, returned) in unacked {
        w.counter(c);
        w.u64(u64::from(slot));
        w.u64(added);
        w.u64(returned);
    }
    w.u64(links.len() as u64);
    for link in links {
        w.bytes(link.url.as_bytes());
        w.u64(link.incarnation);
        w.u64(link.next_seq);
        w.u64(link.parts.len() as u64);
        for &(seq, owed) in &link.parts {
            w.u64(seq);
            w.owed(&[owed]);
        }
        w.owed(&link.owed);
    }
    w.0
}

/// The record `bytes` encode; an error naming what did not parse.
pub(super) fn decode(bytes: &[u8]) -> Result<Record, String> {
    let mut r = Reader { bytes, at: 0 };
    let version = r.u64()?;
    if version != VERSION {
        return Err(format!("version {version}, not {VERSION}"));
    }
    let limiter = r.string()?;
    let incarnation = r.u64()?;
    let mut unacked = Vec::new();
    for _ in 0..r.count(40)? {
        let c = r.counter()?;
        let slot = SlotId::try_from(r.u64()?).map_err(|_| "a slot out of range")?;
        unacked.push((c, slot, r.u64()?, r.u64()?));
    }
    let mut links = Vec::new();
    for _ in 0..r.count(40)? {
        let url = r.string()?;
        let incarnation = r.u64()?;
        let next_seq = r.u64()?;
        let mut parts = Vec::new();
        for _ in 0..r.count(16)? {
            let seq = r.u64()?;
            parts.push(Unconfirmed {
                seq,
                owed: r.owed()?,
            });
        }
        let owed = r.owed()?;
        links.push(LinkRecord {
            url,
            incarnation,
            next_seq,
            parts,
            owed,
        });
    }
    if r.at != bytes.len() {
        return Err(format!("{} bytes after the record", bytes.len() - r.at));
    }
    Ok(Record {
        limiter,
        incarnation,
        unacked,
        links,
    })
}

struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }

    fn f64(&mut self, v: f64) {
        self.u64(v.to_bits());
    }

    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }

    fn counter(&mut self, c: CounterKey) {
        self.u64(c.id);
        self.u64(c.key);
    }

    /// The entries of `maps`, as one list (a counter in several maps
    /// appears in several entries: decoded, they add up).
    fn owed(&mut self, maps: &[&OwedDeltas]) {
        self.u64(maps.iter().map(|m| m.len()).sum::<usize>() as u64);
        for (&c, o) in maps.iter().flat_map(|m| m.iter()) {
            self.counter(c);
            self.f64(o.level.level);
            self.u64(o.level.at);
            self.f64(o.limit);
            self.u64(o.weight);
            match o.window {
                Some(window) => {
                    self.u64(1);
                    self.u64(window.index as u64);
                    self.u64(window.expires);
                }
                None => self.u64(0),
            }
            self.u64(o.returned);
            self.u64(o.returned_due);
        }
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn u64(&mut self) -> Result<u64, String> {
        let end = self.at + 8;
        let word = self
            .bytes
            .get(self.at..end)
            .ok_or_else(|| format!("the record ends at byte {}", self.at))?;
        self.at = end;
        Ok(u64::from_le_bytes(word.try_into().unwrap_or_default()))
    }

    fn f64(&mut self) -> Result<f64, String> {
        Ok(f64::from_bits(self.u64()?))
    }

    /// A count of items at least `min_bytes` long each: never more than
    /// the bytes left could hold.
    fn count(&mut self, min_bytes: usize) -> Result<usize, String> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.at) / min_bytes;
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| format!("a count of {n} at byte {}", self.at))
    }

    fn string(&mut self) -> Result<String, String> {
        let len = self.count(1)?;
        let b = &self.bytes[self.at..self.at + len];
        self.at += len;
        String::from_utf8(b.to_vec()).map_err(|_| "a string that is not UTF-8".to_string())
    }

    fn counter(&mut self) -> Result<CounterKey, String> {
        Ok(CounterKey {
            id: self.u64()?,
            key: self.u64()?,
        })
    }

    fn owed(&mut self) -> Result<OwedDeltas, String> {
        let mut owed = OwedDeltas::default();
        for _ in 0..self.count(72)? {
            let c = self.counter()?;
            let level = Level {
                level: self.f64()?,
                at: self.u64()?,
            };
            let limit = self.f64()?;
            let weight = self.u64()?;
            let window = match self.u64()? {
                0 => None,
                _ => Some(OwedWindow {
                    index: self.u64()? as i64,
                    expires: self.u64()?,
                }),
            };
            let entry = Owed {
                level,
                limit,
                weight,
                window,
                returned: self.u64()?,
                returned_due: self.u64()?,
            };
            owed.entry(c)
                .and_modify(|e| *e = e.combine(entry))
                .or_insert(entry);
        }
        Ok(owed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owed(id: u64, weight: u64, window: Option<OwedWindow>) -> (CounterKey, Owed) {
        let entry = Owed {
            level: Level {
                level: weight as f64 * 0.5,
                at: 7,
            },
            limit: 2.5,
            weight,
            window,
            returned: 3,
            returned_due: 1,
        };
        (CounterKey { id, key: id * 11 }, entry)
    }

    fn sample() -> Record {
        let window = OwedWindow {
            index: -4,
            expires: 99,
        };
        Record {
            limiter: "edge-1".into(),
            incarnation: 0xfeed,
            unacked: vec![
                (CounterKey::named(5), 2, 40, 1),
                (CounterKey { id: 6, key: 9 }, 3, 0, 2),
            ],
            links: vec![
                LinkRecord {
                    url: "http://root-a:7070".into(),
                    incarnation: 0xfeed,
                    next_seq: 12,
                    parts: vec![
                        Unconfirmed {
                            seq: 10,
                            owed: [owed(5, 30, None)].into_iter().collect(),
                        },
                        Unconfirmed {
                            seq: 11,
                            owed: [owed(5, 10, None), owed(6, 4, Some(window))]
                                .into_iter()
                                .collect(),
                        },
                    ],
                    owed: OwedDeltas::default(),
                },
                LinkRecord {
                    url: "http://root-b:7070".into(),
                    incarnation: 0xbeef,
                    next_seq: 1,
                    parts: Vec::new(),
                    owed: [owed(5, 40, None)].into_iter().collect(),
                },
            ],
        }
    }

    #[test]
    fn a_record_reads_back_as_written() {
        let record = sample();
        assert_eq!(decode(&encode(&record)), Ok(record));
    }

    #[test]
    fn owed_weight_in_two_maps_reads_back_as_their_sum() {
        // A link owes weight and has an unnumbered request under way for
        // the same counter: the record lists both, the reader adds them.
        let (c, first) = owed(5, 30, None);
        let (_, second) = owed(5, 12, None);
        let a: OwedDeltas = [(c, first)].into_iter().collect();
        let b: OwedDeltas = [(c, second)].into_iter().collect();
        let view = LinkView {
            url: "http://r",
            incarnation: 9,
            next_seq: 3,
            parts: Vec::new(),
            owed: vec![&a, &b],
        };
        let bytes = encode_parts("h", 9, &[], &[view]);
        let read = decode(&bytes).unwrap();
        assert_eq!(read.links[0].owed[&c].weight, 42);
        assert_eq!(read.links[0].owed[&c], first.combine(second));
    }

    #[test]
    fn a_cut_or_altered_record_is_an_error_never_a_panic() {
        let bytes = encode(&sample());
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "cut at {len}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        let mut other = bytes.clone();
        other[0] = 2;
        assert!(decode(&other).unwrap_err().contains("version 2"));
        // Any byte changed parses or fails cleanly.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0xff;
            let _ = decode(&b);
        }
    }
}
