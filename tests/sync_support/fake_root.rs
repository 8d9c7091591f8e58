//! A root that misbehaves on purpose: it answers `POST /v1/sync` with
//! garbage, with HTTP 500, or not at all; or a proxy in front of a real
//! root that refuses binary sync bodies, as a root older than the binary
//! encoding does; or a proxy whose [`Versioned`] mode, changed while it
//! runs, makes the real root behind it look like one that predates
//! numbered requests, or loses its replies.
//!
//! Plain threads and blocking sockets: one thread accepts, one thread per
//! connection reads a request and answers it (then closes, so the client
//! opens a new connection for the next one).

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the fake root answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Misbehaviour {
    /// 200 with a body that is not a valid sync reply (several kinds, in
    /// turn).
    Garbage,
    /// 500 with a JSON error.
    ServerError,
    /// Reads the request and never answers.
    Hang,
    /// Forwards every request to the real root at `root`, except binary
    /// sync bodies (`application/x-sluice-sync`) when `refuse` is set:
    /// those get that HTTP status (415, or 400 as a root that predates
    /// the binary encoding answers) and a JSON error.
    Proxy {
        root: SocketAddr,
        refuse: Option<u16>,
    },
    /// Forwards every request to the real root at `root` as
    /// [`FakeRoot::mode`] says at the time (the [`Versioned`] modes).
    Versioned { root: SocketAddr },
    /// Forwards the `n`th sync request to `roots[n % 2]`: two root
    /// processes behind one URL (a load balancer) answering in turn.
    Alternate { roots: [SocketAddr; 2] },
}

/// The modes of a [`Misbehaviour::Versioned`] proxy.
pub struct Versioned;

impl Versioned {
    /// Everything goes through.
    pub const CURRENT: u8 = 0;
    /// The root predates numbered requests (binary request format 4,
    /// reply format 5): a request for reply format 5 is answered in
    /// format 4, which has no `takes_sequence` flag, as such a root
    /// answers the newest format it has; a numbered request is refused
    /// as it refuses it (415 for the binary format it does not know, 400
    /// for JSON with a field it does not know).
    pub const PREDATES_SEQUENCES: u8 = 1;
    /// Requests reach the root, which applies them; its replies are lost
    /// (the connection is closed without an answer).
    pub const REPLIES_LOST: u8 = 2;
    /// The root predates held slots (request format 5, reply format 7):
    /// a request for reply format 7 is answered in format 6, whose flags
    /// cannot say it takes them (nor can a JSON reply), and a request
    /// that reports them is refused as such a root refuses it (415 for
    /// the binary format, 400 for JSON with a field it does not know).
    pub const PREDATES_HELD: u8 = 3;
    /// The root predates replies by interest (request format 6, reply
    /// format 8): a request for reply format 8 is answered in format 7,
    /// whose flags cannot say it answers by interest (nor can a JSON
    /// reply), and a request that carries an interest list is refused as
    /// such a root refuses it (415 for the binary format, 400 for JSON
    /// with a field it does not know).
    pub const PREDATES_INTEREST: u8 = 4;
    /// The root predates the held slots of keys (request format 7, reply
    /// format 9): a request for reply format 9 is answered in format 8,
    /// whose flags cannot say it takes them (nor can a JSON reply), and a
    /// request that reports them is refused as such a root refuses it
    /// (415 for the binary format, 400 for JSON with a field it does not
    /// know).
    pub const PREDATES_KEYED_HELD: u8 = 5;
}

/// Quota names the garbage replies carry; a limiter must never hold one.
pub const EVIL_QUOTAS: [&str; 3] = ["evil", "evil_first", "evil_second"];

/// The running fake root; stops when dropped.
pub struct FakeRoot {
    /// Base URL, `http://127.0.0.1:port`.
    pub url: String,
    /// Sync requests received.
    pub requests: Arc<AtomicUsize>,
    /// Of those, requests with a binary body.
    pub binary: Arc<AtomicUsize>,
    /// Of those, numbered requests (binary format 4, or JSON with a
    /// `sequence`).
    pub numbered: Arc<AtomicUsize>,
    /// Of those, requests that report held slots (binary format 5, or
    /// JSON with `held`).
    pub held: Arc<AtomicUsize>,
    /// Of those, requests that carry an interest list (binary format 6
    /// with one, or 7, or JSON with `interest`).
    pub interest: Arc<AtomicUsize>,
    /// Of those, requests that report the held slots of keys (binary
    /// format 7, or JSON with `keyed_held`).
    pub keyed_held: Arc<AtomicUsize>,
    /// The [`Versioned`] mode of a versioned proxy.
    pub mode: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl FakeRoot {
    /// Listens on a free port and answers every request as `how` says.
    pub fn start(how: Misbehaviour) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}", listener.local_addr().unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let binary = Arc::new(AtomicUsize::new(0));
        let numbered = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let interest = Arc::new(AtomicUsize::new(0));
        let keyed_held = Arc::new(AtomicUsize::new(0));
        let mode = Arc::new(AtomicU8::new(Versioned::CURRENT));
        let seen = Seen {
            requests: Arc::clone(&requests),
            binary: Arc::clone(&binary),
            numbered: Arc::clone(&numbered),
            held: Arc::clone(&held),
            interest: Arc::clone(&interest),
            keyed_held: Arc::clone(&keyed_held),
            mode: Arc::clone(&mode),
            stop: Arc::clone(&stop),
        };
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if seen.stop.load(Ordering::Acquire) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let seen = seen.clone();
                std::thread::spawn(move || serve(stream, how, &seen));
            }
        });
        Self {
            url,
            requests,
            binary,
            numbered,
            held,
            interest,
            keyed_held,
            mode,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept loop up so that it sees the flag.
        let _ = TcpStream::connect(self.url.trim_start_matches("http://"));
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// What the connections of one fake root count and share.
#[derive(Clone)]
struct Seen {
    requests: Arc<AtomicUsize>,
    binary: Arc<AtomicUsize>,
    numbered: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    interest: Arc<AtomicUsize>,
    keyed_held: Arc<AtomicUsize>,
    mode: Arc<AtomicU8>,
    stop: Arc<AtomicBool>,
}

/// Reads one request (headers and a `content-length` body) and answers
/// it. The `n`th request of a garbage root gets the `n`th kind of garbage.
fn serve(mut stream: TcpStream, how: Misbehaviour, seen: &Seen) {
    let stop = &*seen.stop;
    let _ = stream.set_read_timeout(Some(Duration::from_millis(50)));
    let Some(mut request) = read_request(&mut stream, stop) else {
        return;
    };
    let n = seen.requests.fetch_add(1, Ordering::AcqRel);
    let end = find(&request, b"\r\n\r\n").unwrap_or(0);
    let is_binary = String::from_utf8_lossy(&request[..end])
        .to_ascii_lowercase()
        .contains("content-type: application/x-sluice-sync");
    if is_binary {
        seen.binary.fetch_add(1, Ordering::AcqRel);
    }
    let body = &request[(end + 4).min(request.len())..];
    let numbered = if is_binary {
        // The format's version is the body's fourth byte.
        body.get(3).is_some_and(|&v| v >= 4)
    } else {
        find(body, b"\"sequence\"").is_some()
    };
    if numbered {
        seen.numbered.fetch_add(1, Ordering::AcqRel);
    }
    let reports_held = if is_binary {
        body.get(3) == Some(&5)
    } else {
        find(body, b"\"held\"").is_some()
    };
    if reports_held {
        seen.held.fetch_add(1, Ordering::AcqRel);
    }
    // A limiter writes format 6 only for a request with a list, format 7
    // only for one that reports keys' held slots (with a list or not).
    let reports_keys = if is_binary {
        body.get(3) == Some(&7)
    } else {
        find(body, b"\"keyed_held\"").is_some()
    };
    // Format 7 may carry a list or not: a root that predates format 6
    // refuses it either way.
    let lists_interest = if is_binary {
        body.get(3).is_some_and(|&v| v >= 6)
    } else {
        find(body, b"\"interest\"").is_some()
    };
    if lists_interest {
        seen.interest.fetch_add(1, Ordering::AcqRel);
    }
    if reports_keys {
        seen.keyed_held.fetch_add(1, Ordering::AcqRel);
    }
    let reply = match how {
        Misbehaviour::Versioned { root } => {
            match seen.mode.load(Ordering::Acquire) {
                Versioned::PREDATES_SEQUENCES if numbered => {
                    refuse_as_older(&mut stream, is_binary, 4, "sequence");
                    return;
                }
                Versioned::PREDATES_INTEREST if lists_interest => {
                    refuse_as_older(&mut stream, is_binary, 6, "interest");
                    return;
                }
                Versioned::PREDATES_HELD if reports_held => {
                    refuse_as_older(&mut stream, is_binary, 5, "held");
                    return;
                }
                Versioned::PREDATES_KEYED_HELD if reports_keys => {
                    refuse_as_older(&mut stream, is_binary, 7, "keyed_held");
                    return;
                }
                mode @ (Versioned::PREDATES_SEQUENCES
                | Versioned::PREDATES_HELD
                | Versioned::PREDATES_INTEREST
                | Versioned::PREDATES_KEYED_HELD) => {
                    // The newest reply format such a root writes.
                    let most = match mode {
                        Versioned::PREDATES_SEQUENCES => 4,
                        Versioned::PREDATES_HELD => 6,
                        Versioned::PREDATES_INTEREST => 7,
                        _ => 8,
                    };
                    let head = older_accept(&String::from_utf8_lossy(&request[..end]), most);
                    let mut older = head.into_bytes();
                    older.extend_from_slice(&request[end..]);
                    request = older;
                }
                _ => {}
            }
            let mut reply = forward(root, &request);
            let mode = seen.mode.load(Ordering::Acquire);
            if mode == Versioned::REPLIES_LOST {
                return;
            }
            if mode == Versioned::PREDATES_HELD {
                reply = reply.map(|r| without_json_field(&r, "\"takes_held\":true"));
            }
            if mode == Versioned::PREDATES_HELD || mode == Versioned::PREDATES_INTEREST {
                for field in ["\"takes_interest\":true", "\"wants_interest\":true"] {
                    reply = reply.map(|r| without_json_field(&r, field));
                }
            }
            if matches!(
                mode,
                Versioned::PREDATES_HELD
                    | Versioned::PREDATES_INTEREST
                    | Versioned::PREDATES_KEYED_HELD
            ) {
                reply = reply.map(|r| without_json_field(&r, "\"takes_keyed_held\":true"));
            }
            if let Some(reply) = reply {
                let _ = stream.write_all(&reply);
            }
            return;
        }
        Misbehaviour::Proxy { refuse, .. } if is_binary && refuse.is_some() => response(
            &format!("{} Refused", refuse.unwrap()),
            r#"{"error": {"field": null, "message": "expected value at line 1 column 1"}}"#,
        ),
        Misbehaviour::Alternate { roots } => {
            if let Some(reply) = forward(roots[n % 2], &request) {
                let _ = stream.write_all(&reply);
            }
            return;
        }
        Misbehaviour::Proxy { root, .. } => {
            if let Some(reply) = forward(root, &request) {
                let _ = stream.write_all(&reply);
            }
            return;
        }
        Misbehaviour::Garbage => {
            let bodies = garbage();
            let body = &bodies[n % bodies.len()];
            response("200 OK", body)
        }
        Misbehaviour::ServerError => response(
            "500 Internal Server Error",
            r#"{"error": {"field": null, "message": "database on fire"}}"#,
        ),
        Misbehaviour::Hang => {
            // Holds the connection until the client gives up or the test
            // ends.
            let mut byte = [0u8; 1];
            while !stop.load(Ordering::Acquire) {
                match stream.read(&mut byte) {
                    Ok(0) => return,
                    Err(e)
                        if e.kind() != ErrorKind::WouldBlock && e.kind() != ErrorKind::TimedOut =>
                    {
                        return
                    }
                    _ => {}
                }
            }
            return;
        }
    };
    let _ = stream.write_all(reply.as_bytes());
}

/// Refuses a request as a root that predates binary request format
/// `version` and the JSON field `field` refuses it: 415 for the binary
/// format it does not know, 400 for JSON with a field it does not know.
fn refuse_as_older(stream: &mut TcpStream, is_binary: bool, version: u8, field: &str) {
    let (status, message) = if is_binary {
        (
            "415 Unsupported Media Type",
            format!("unsupported binary request version {version}"),
        )
    } else {
        ("400 Bad Request", format!("unknown field `{field}`"))
    };
    let body = format!(r#"{{"error": {{"field": null, "message": "{message}"}}}}"#);
    let _ = stream.write_all(response(status, &body).as_bytes());
}

/// `head` (a request's headers) asking for binary replies of format
/// `most` at most, as a limiter that predates a newer one does: any newer
/// `version=N` it accepts becomes `version=<most>`.
fn older_accept(head: &str, most: u32) -> String {
    const PARAM: &str = "x-sluice-sync;version=";
    let Some(at) = head.find(PARAM).map(|at| at + PARAM.len()) else {
        return head.to_string();
    };
    let digits = head[at..].chars().take_while(char::is_ascii_digit).count();
    match head[at..at + digits].parse::<u32>() {
        Ok(n) if n > most => format!("{}{most}{}", &head[..at], &head[at + digits..]),
        _ => head.to_string(),
    }
}

/// `reply` (an HTTP response) without `field` in its JSON body (with its
/// comma), its `content-length` set to match: a root that predates the
/// field. A binary body is left alone (its format was capped before).
fn without_json_field(reply: &[u8], field: &str) -> Vec<u8> {
    let Some(end) = find(reply, b"\r\n\r\n") else {
        return reply.to_vec();
    };
    let body = String::from_utf8_lossy(&reply[end + 4..]).into_owned();
    if !body.contains(field) {
        return reply.to_vec();
    }
    let body = body
        .replace(&format!(",{field}"), "")
        .replace(&format!("{field},"), "")
        .replace(field, "");
    let head: Vec<String> = String::from_utf8_lossy(&reply[..end])
        .lines()
        .map(|l| {
            if l.to_ascii_lowercase().starts_with("content-length:") {
                format!("content-length: {}", body.len())
            } else {
                l.to_string()
            }
        })
        .collect();
    format!("{}\r\n\r\n{body}", head.join("\r\n")).into_bytes()
}

/// Sends `request` to `root` and returns its reply, marked
/// `connection: close` (this server answers one request a connection).
fn forward(root: SocketAddr, request: &[u8]) -> Option<Vec<u8>> {
    let mut upstream = TcpStream::connect(root).ok()?;
    upstream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    upstream.write_all(request).ok()?;
    let never = AtomicBool::new(false);
    let reply = read_request(&mut upstream, &never)?;
    let line = find(&reply, b"\r\n")?;
    let mut out = reply[..line + 2].to_vec();
    out.extend_from_slice(b"connection: close\r\n");
    out.extend_from_slice(&reply[line + 2..]);
    Some(out)
}

fn response(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Replies a limiter must reject whole: not JSON, cut short, a counter
/// with a negative level next to a quota, quotas out of order.
fn garbage() -> Vec<String> {
    let quota = |id: u64, name: &str, epoch: u64| {
        format!(
            r#"{{"id": {id}, "name": "{name}", "parent": null, "limit": 1.0, "low_burst": 1.0,
                "high_burst": 1.0, "epoch": {epoch}, "deleted": false}}"#
        )
    };
    let reply = |quotas: &[String], counters: &str| {
        format!(
            r#"{{"root_instance": 99, "root_time": 1, "quotas": [{}],
                "quotas_after": {{"epoch": 1000, "id": 0}}, "more_quotas": false,
                "counters": [{counters}], "counter_version": 1000}}"#,
            quotas.join(",")
        )
    };
    vec![
        "<html><body>502 Bad Gateway</body></html>".to_string(),
        r#"{"root_instance": 99, "root_time": 1, "quotas": [{"id": 900"#.to_string(),
        reply(
            &[quota(900, EVIL_QUOTAS[0], 1000)],
            r#"{"id": 1, "level": -5.0, "at": 1}"#,
        ),
        reply(
            &[
                quota(901, EVIL_QUOTAS[1], 1001),
                quota(902, EVIL_QUOTAS[2], 1000),
            ],
            "",
        ),
    ]
}

/// Reads up to the end of the body (of a request, or of a reply with a
/// `content-length`); `None` if the client went away or the test is
/// ending.
fn read_request(stream: &mut TcpStream, stop: &AtomicBool) -> Option<Vec<u8>> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&data, b"\r\n\r\n") {
            let headers = String::from_utf8_lossy(&data[..end]).to_ascii_lowercase();
            let length = headers
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if data.len() >= end + 4 + length {
                return Some(data);
            }
        }
        if stop.load(Ordering::Acquire) {
            return None;
        }
        match stream.read(&mut chunk) {
            Ok(0) => return None,
            Ok(n) => data.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {}
            Err(_) => return None,
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
