//! Raw HTTP/1.1 over a socket, for tests that must control the exact
//! bytes (paths a client library would normalise) or know which connection
//! a request used.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Longest wait for a response.
const PATIENCE: Duration = Duration::from_secs(20);

/// A connection from `source` (any 127.0.0.0/8 address) to `root`.
pub async fn connect_from(root: SocketAddr, source: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket
        .bind(SocketAddr::new(source.parse::<IpAddr>().unwrap(), 0))
        .unwrap();
    socket.connect(root).await.expect("connect to the root")
}

/// Sends one request and reads its response (Content-Length framed);
/// returns the status and the body as JSON (`Null` if not JSON).
pub async fn exchange(stream: &mut TcpStream, request: &[u8]) -> (u16, Value) {
    let (status, body) = exchange_raw(stream, request).await;
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// [`exchange`] with the body as bytes.
pub async fn exchange_raw(stream: &mut TcpStream, request: &[u8]) -> (u16, Vec<u8>) {
    stream.write_all(request).await.unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = tokio::time::timeout(PATIENCE, stream.read(&mut chunk))
            .await
            .expect("a response in time")
            .expect("read a response");
        assert!(n > 0, "connection closed before a response");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.expect("read the body");
        assert!(n > 0, "connection closed inside a body");
        buf.extend_from_slice(&chunk[..n]);
    }
    (status, buf[head_end..head_end + length].to_vec())
}
