//! A private `redis-server` on a free loopback port, and just enough of
//! the RESP protocol to load and run a Lua script.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A reply from Redis.
#[derive(Debug, PartialEq)]
pub enum Reply {
    Status(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// A `redis-server` started for one test: no persistence, loopback only,
/// killed when dropped.
pub struct Server {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Server {
    /// Starts `redis-server` (Debian package `redis-server`, installed by
    /// `make deps`) on a free port and waits until it answers. A server
    /// that exits first (another test's server took the port between
    /// our pick and its bind) is started again on another port.
    pub fn start() -> Server {
        let binary = std::env::var_os("REDIS_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut server = Server::spawn(&binary);
            loop {
                let exited = !matches!(server.child.try_wait(), Ok(None));
                if exited {
                    break;
                }
                if server.answers_ping() {
                    return server;
                }
                assert!(
                    Instant::now() < deadline,
                    "redis-server did not start on port {}",
                    server.port
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            assert!(
                Instant::now() < deadline,
                "redis-server kept exiting at start (ports taken?)"
            );
        }
    }

    /// `redis-server` started on a free port.
    fn spawn(binary: &PathBuf) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let child = Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {}: {e}; install the Debian package redis-server \
                     (`make deps`) or set REDIS_SERVER",
                    binary.display()
                )
            });
        Server {
            child,
            port,
            _dir: dir,
        }
    }

    /// True when the server answers PING; any IO error (not listening
    /// yet, a connection reset while it starts) is a no, not a panic.
    fn answers_ping(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        if stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .is_err()
            || stream.write_all(b"*1\r\n$4\r\nPING\r\n").is_err()
        {
            return false;
        }
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).is_ok() && line == "+PONG\r\n"
    }

    fn try_connect(&self) -> std::io::Result<Client> {
        let stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(Client {
            writer: stream.try_clone()?,
            reader: BufReader::new(stream),
        })
    }

    /// A new connection.
    pub fn connect(&self) -> Client {
        self.try_connect().expect("connect to redis-server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().unwrap().port()
}

/// One connection, one command at a time.
pub struct Client {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    /// Sends a command and reads its reply; a Redis error panics with its
    /// text (a broken script is a broken test).
    pub fn call(&mut self, args: &[&[u8]]) -> Reply {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&out).expect("write to redis");
        self.read_reply()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read from redis");
        assert!(
            line.ends_with("\r\n"),
            "redis closed the connection: {line:?}"
        );
        line.truncate(line.len() - 2);
        line
    }

    fn read_reply(&mut self) -> Reply {
        let line = self.line();
        let (kind, rest) = line.split_at(1);
        let number = || rest.parse::<i64>().expect("a RESP number");
        match kind {
            "+" => Reply::Status(rest.to_string()),
            "-" => panic!("redis error: {rest}"),
            ":" => Reply::Int(number()),
            "$" if number() < 0 => Reply::Bulk(None),
            "$" => {
                let mut data = vec![0; number() as usize + 2];
                self.reader
                    .read_exact(&mut data)
                    .expect("read a bulk string");
                data.truncate(data.len() - 2);
                Reply::Bulk(Some(data))
            }
            "*" => Reply::Array((0..number().max(0)).map(|_| self.read_reply()).collect()),
            _ => panic!("not a RESP reply: {line:?}"),
        }
    }

    /// Loads a Lua script; its SHA1 for [`Client::evalsha`].
    pub fn load_script(&mut self, source: &str) -> String {
        match self.call(&[b"SCRIPT", b"LOAD", source.as_bytes()]) {
            Reply::Bulk(Some(sha)) => String::from_utf8(sha).unwrap(),
            other => panic!("SCRIPT LOAD: {other:?}"),
        }
    }

    /// Runs a loaded script that returns an integer.
    pub fn evalsha(&mut self, sha: &str, keys: &[String], args: &[String]) -> i64 {
        let count = keys.len().to_string();
        let mut cmd: Vec<&[u8]> = vec![b"EVALSHA", sha.as_bytes(), count.as_bytes()];
        cmd.extend(keys.iter().map(|k| k.as_bytes()));
        cmd.extend(args.iter().map(|a| a.as_bytes()));
        match self.call(&cmd) {
            Reply::Int(n) => n,
            other => panic!("EVALSHA: {other:?}"),
        }
    }
}
