//! Harness of the tests that run real nginx processes with the module
//! beside real roots: nginx processes from a config, a TCP relay between
//! a limiter and a root that records what crosses it, plain HTTP requests,
//! and a scan of a process's memory.
//!
//! The nginx binary and module come from `TEST_NGINX_BINARY` and
//! `TEST_NGINX_SLUICE_MODULE` (the Makefile sets both); the tests that use
//! this harness are `#[ignore]`d and run by `make test-cluster`, after
//! nginx and the module are built.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An nginx (master and workers) under a prefix of its own; stopped when
/// dropped.
pub struct Nginx {
    /// Its prefix: `conf/`, `logs/`, `html/`.
    pub prefix: PathBuf,
    /// The port it serves on.
    pub port: u16,
    binary: String,
}

impl Nginx {
    /// Starts nginx in `prefix` with `http_block` inside `http { }` and a
    /// `server` on a free port holding `server_block`; `index.html` in
    /// `html/`.
    pub fn start(prefix: &Path, http_block: &str, server_block: &str) -> Self {
        let binary = std::env::var("TEST_NGINX_BINARY")
            .expect("TEST_NGINX_BINARY: run through `make test-cluster`");
        let module = std::env::var("TEST_NGINX_SLUICE_MODULE")
            .expect("TEST_NGINX_SLUICE_MODULE: run through `make test-cluster`");
        for dir in ["conf", "logs", "html"] {
            std::fs::create_dir_all(prefix.join(dir)).expect("nginx prefix");
        }
        std::fs::write(prefix.join("html/index.html"), "ok\n").expect("index.html");
        let port = free_port();
        let conf = format!(
            "load_module {module};\nworker_processes 2;\nerror_log logs/error.log info;\n\
             pid logs/nginx.pid;\nevents {{ worker_connections 1024; }}\n\
             http {{\n    access_log off;\n{http_block}\n    server {{\n        \
             listen 127.0.0.1:{port};\n        root html;\n{server_block}\n    }}\n}}\n"
        );
        std::fs::write(prefix.join("conf/nginx.conf"), conf).expect("nginx.conf");
        let status = Command::new(&binary)
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(prefix.join("conf/nginx.conf"))
            .status()
            .expect("run nginx");
        assert!(
            status.success(),
            "nginx did not start: see {}",
            prefix.display()
        );
        let nginx = Self {
            prefix: prefix.to_path_buf(),
            port,
            binary,
        };
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return nginx;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("nginx in {} does not listen", prefix.display());
    }

    /// The error log so far.
    pub fn error_log(&self) -> String {
        std::fs::read_to_string(self.prefix.join("logs/error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = Command::new(&self.binary)
            .arg("-p")
            .arg(&self.prefix)
            .arg("-c")
            .arg(self.prefix.join("conf/nginx.conf"))
            .args(["-s", "stop"])
            .status();
    }
}

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// A kept-alive HTTP/1.1 client connection.
pub struct Client {
    stream: BufReader<TcpStream>,
    port: u16,
}

impl Client {
    /// A connection to 127.0.0.1:`port`.
    pub fn new(port: u16) -> Self {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        Self {
            stream: BufReader::new(stream),
            port,
        }
    }

    /// `GET path` with `headers` (`Name: value` lines); the status and the
    /// body.
    pub fn get(&mut self, path: &str, headers: &[&str]) -> (u16, String) {
        let mut request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", self.port);
        for h in headers {
            request.push_str(h);
            request.push_str("\r\n");
        }
        request.push_str("\r\n");
        self.stream
            .get_mut()
            .write_all(request.as_bytes())
            .expect("send");
        let mut line = String::new();
        self.stream.read_line(&mut line).expect("status line");
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {line:?}"));
        let mut length = 0usize;
        loop {
            line.clear();
            self.stream.read_line(&mut line).expect("header");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((name, value)) = l.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).expect("body");
        (status, String::from_utf8_lossy(&body).into_owned())
    }
}

/// A TCP relay from a local port to `target`, recording every byte the
/// clients send (what a limiter sends a root); closed when dropped.
pub struct Relay {
    /// `http://127.0.0.1:port`, to give limiters instead of the target.
    pub url: String,
    sent: Arc<Mutex<Vec<u8>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Relays connections to `target` (`host:port`).
    pub fn start(target: &str) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("relay bind");
        let url = format!("http://{}", listener.local_addr().expect("relay address"));
        listener.set_nonblocking(true).expect("nonblocking");
        let sent = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (target, sent2, stop2) = (target.to_string(), Arc::clone(&sent), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let Ok(server) = TcpStream::connect(&target) else {
                            continue;
                        };
                        let _ = client.set_nonblocking(false);
                        pipe(
                            client.try_clone().ok(),
                            server.try_clone().ok(),
                            Some(Arc::clone(&sent2)),
                        );
                        pipe(Some(server), Some(client), None);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { url, sent, stop }
    }

    /// Every byte clients sent so far.
    pub fn sent(&self) -> Vec<u8> {
        self.sent.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` in a thread, recording into `record`.
fn pipe(from: Option<TcpStream>, to: Option<TcpStream>, record: Option<Arc<Mutex<Vec<u8>>>>) {
    let (Some(mut from), Some(mut to)) = (from, to) else {
        return;
    };
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if let Some(r) = &record {
                        if let Ok(mut r) = r.lock() {
                            r.extend_from_slice(&buf[..n]);
                        }
                    }
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    });
}

/// True when `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Whether the memory of process `pid` (its writable mappings, read
/// through `/proc/<pid>/mem`) holds `needle`; an error when it cannot be
/// read at all.
pub fn memory_holds(pid: u32, needle: &[u8]) -> Result<bool, String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("maps of {pid}: {e}"))?;
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem"))
        .map_err(|e| format!("mem of {pid}: {e}"))?;
    let mut read_any = false;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with("rw") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut chunk = vec![0u8; (b - a) as usize];
        use std::io::{Seek, SeekFrom};
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut chunk).is_err() {
            continue;
        }
        read_any = true;
        if contains(&chunk, needle) {
            return Ok(true);
        }
    }
    if read_any {
        Ok(false)
    } else {
        Err(format!("no memory of {pid} could be read"))
    }
}
