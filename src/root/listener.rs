//! The accept loop and the per-connection HTTP/1.1 server.
//!
//! Each accepted socket is admitted by [`Connections`] (which may shed an
//! older idle one, or refuse it), then served by hyper in its own task:
//! the task ends when the client leaves, when the registry closes the
//! connection (shed, timed out), or, at shutdown, once its request in
//! progress is answered. The socket and the HTTP service both report to
//! the connection's registry entry: bytes after an idle spell start the
//! header clock, a request makes it busy, the end of its response body
//! makes it idle again. The request carries its [`Connection`] as an
//! extension, so the token checks in `api/` can mark it trusted.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

use super::connections::{Connection, Connections, InFlight};
use super::shutdown::Shutdown;

/// Pause after a failed `accept` (for example out of file descriptors), so
/// the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Largest request head (request line and headers) accepted; the API's
/// requests need a few hundred bytes.
pub const MAX_HEAD_BYTES: usize = 32 << 10;

/// Largest read or write buffer of one connection: bounds what a slow
/// client costs in memory.
const MAX_BUFFER_BYTES: usize = 64 << 10;

/// Accepts and serves connections on `listener` until `shutdown`; then
/// stops accepting and tells every connection to finish its request in
/// progress and close. Returns once the accept loop and the sweeper have
/// stopped (connections may still be finishing).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    connections: Arc<Connections>,
    mut shutdown: Shutdown,
) {
    let sweeper = tokio::spawn(sweep(Arc::clone(&connections), shutdown.clone()));
    loop {
        tokio::select! {
            _ = shutdown.wait() => break,
            _ = connections.room() => {}
        }
        let accepted = tokio::select! {
            _ = shutdown.wait() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(connection) = connections.admit(peer.ip(), Instant::now()) else {
            // Refused: dropping the socket closes it.
            continue;
        };
        // Sync replies are single writes; do not delay them.
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(
            stream,
            connection,
            app.clone(),
            shutdown.clone(),
        ));
    }
    let _ = sweeper.await;
}

/// Closes connections past their deadlines, every
/// [`super::connections::ConnectionLimits::sweep_every`].
async fn sweep(connections: Arc<Connections>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(connections.limits().sweep_every());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tick.tick() => {
                connections.sweep(Instant::now());
            }
        }
    }
}

/// Serves one connection until the client or the root ends it.
async fn serve_connection(
    stream: TcpStream,
    connection: Arc<Connection>,
    app: Router,
    mut shutdown: Shutdown,
) {
    let io = TokioIo::new(ConnectionStream {
        stream,
        connection: Arc::clone(&connection),
    });
    let service = ConnectionService {
        app: TowerToHyperService::new(app),
        connection: Arc::clone(&connection),
    };
    let mut builder = http1::Builder::new();
    builder
        .keep_alive(true)
        // The registry times heads out, idle spells included.
        .header_read_timeout(None)
        .max_header_size(MAX_HEAD_BYTES)
        .max_buf_size(MAX_BUFFER_BYTES);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        biased;
        _ = connection.closed() => return,
        result = conn.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(%error, "connection ended with an error");
            }
            return;
        }
        _ = shutdown.wait() => {}
    }
    // Shutting down: finish the request in progress, then close.
    conn.as_mut().graceful_shutdown();
    tokio::select! {
        _ = connection.closed() => {}
        _ = conn => {}
    }
}

/// The HTTP service of one connection: the router, with the connection's
/// phases reported and the connection attached to each request.
#[derive(Clone)]
struct ConnectionService {
    app: TowerToHyperService<Router>,
    connection: Arc<Connection>,
}

type ServiceFuture =
    Pin<Box<dyn Future<Output = Result<hyper::Response<TrackedBody>, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = hyper::Response<TrackedBody>;
    type Error = Infallible;
    type Future = ServiceFuture;

    fn call(&self, mut request: hyper::Request<Incoming>) -> Self::Future {
        let in_flight = self.connection.request_started();
        request
            .extensions_mut()
            .insert(Arc::clone(&self.connection));
        let response = self.app.call(request);
        Box::pin(async move {
            let response = response.await?;
            in_flight.sending();
            Ok(response.map(|body| TrackedBody {
                body,
                in_flight: Some(in_flight),
            }))
        })
    }
}

/// A response body that makes its connection idle once it has been sent.
struct TrackedBody {
    body: Body,
    /// Dropped at the end of the body.
    in_flight: Option<InFlight>,
}

impl hyper::body::Body for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            this.in_flight = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The socket, reporting bytes that end an idle spell.
struct ConnectionStream {
    stream: TcpStream,
    connection: Arc<Connection>,
}

impl AsyncRead for ConnectionStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.connection.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for ConnectionStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
