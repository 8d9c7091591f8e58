//! The `sluice rls` process: one heap table, one sync thread sharing its
//! counters through the roots (standalone folding without roots), the
//! gRPC service with the standard health service, the HTTP side, and the
//! configuration watched for changes and SIGHUP.
//!
//! Built as the C ABI's limiter is: the request path only reads the
//! table through its request face and the configuration through an
//! atomic pointer swap.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;

use super::config::{config_files, Config};
use super::decide::Engine;
use super::grpc::Service;
pub use super::state::Server;
use crate::sync::config::{parse_root_url, validate_token};
use crate::sync::{LogLevel, SyncConfig, SyncHandle};
use crate::table::Table;

/// `sluice rls`'s flags. Defaults follow envoyproxy/ratelimit where a
/// deployment would notice: gRPC on 8081, HTTP on 8080, the configuration
/// in `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config`.
#[derive(Debug, Clone, clap::Args)]
pub struct RlsArgs {
    /// gRPC address (RLS v3 and the gRPC health service) [default:
    /// $GRPC_HOST:$GRPC_PORT, else 0.0.0.0:8081].
    #[arg(long)]
    pub listen: Option<String>,
    /// HTTP address (/healthcheck, /json, /metrics), `off` for none
    /// [default: $HOST:$PORT, else 0.0.0.0:8080].
    #[arg(long)]
    pub http: Option<String>,
    /// envoyproxy/ratelimit YAML: a file, or a directory of them, one
    /// domain a file [default: $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config,
    /// RUNTIME_ROOT defaulting to /srv/runtime_data/current].
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A quota root to sync with (repeatable): limits are then shared by
    /// every `sluice rls` and nginx syncing with the same roots, and the
    /// configuration's quotas only seed the table until a root answers.
    #[arg(long = "root")]
    pub roots: Vec<String>,
    /// The roots' sync token.
    #[arg(long)]
    pub sync_token_file: Option<PathBuf>,
    /// Time between syncs, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub sync_interval_ms: u64,
    /// This limiter's id at the roots [default: the host name and the
    /// gRPC port, `host:8081`].
    #[arg(long)]
    pub limiter_id: Option<String>,
    /// The fleet's key secret (the same file as nginx's
    /// `sluice_key_secret_file`), which per-key counters are hashed with.
    #[arg(long)]
    pub key_secret_file: Option<PathBuf>,
    /// Quotas the table holds (the configuration's, and the roots' when
    /// they hold more).
    #[arg(long, default_value_t = 65_536)]
    pub capacity: u32,
    /// Keys of per-key limits the table holds at once (about 55 bytes
    /// each).
    #[arg(long, default_value_t = 1_000_000)]
    pub keys: u64,
    /// Add `RateLimit-Policy` and `RateLimit` (IETF draft) of the
    /// tightest descriptor to every answer.
    #[arg(long)]
    pub response_headers: bool,
    /// How often the configuration's files are looked at for changes,
    /// milliseconds (SIGHUP reloads at once).
    #[arg(long, default_value_t = 1000)]
    pub reload_interval_ms: u64,
}

fn env_address(host: &str, port: &str, default_port: u16) -> String {
    let host = std::env::var(host).unwrap_or_else(|_| "0.0.0.0".into());
    let port = std::env::var(port).unwrap_or_else(|_| default_port.to_string());
    format!("{host}:{port}")
}

/// The configuration path: `--config`, else envoyproxy/ratelimit's
/// runtime directory.
fn config_path(args: &RlsArgs) -> PathBuf {
    if let Some(path) = &args.config {
        return path.clone();
    }
    let root = std::env::var("RUNTIME_ROOT").unwrap_or_else(|_| "/srv/runtime_data/current".into());
    let sub = std::env::var("RUNTIME_SUBDIRECTORY").unwrap_or_default();
    Path::new(&root).join(sub).join("config")
}

/// Everything checked before anything starts ([`settings`]).
pub struct Settings {
    grpc: SocketAddr,
    http: Option<SocketAddr>,
    config_path: PathBuf,
    config: Config,
    sync: SyncConfig,
    key_secret: Option<crate::core::key::KeySecret>,
}

/// The flags and the configuration they name, checked: the error says
/// which is wrong (the process then exits with code 2, serving nothing).
pub fn settings(args: &RlsArgs) -> Result<Settings, String> {
    let parse = |what: &str, text: &str| -> Result<SocketAddr, String> {
        text.parse()
            .map_err(|e| format!("--{what} {text:?}: not an address (host:port): {e}"))
    };
    let grpc = parse(
        "listen",
        &args
            .listen
            .clone()
            .unwrap_or_else(|| env_address("GRPC_HOST", "GRPC_PORT", 8081)),
    )?;
    let http_text = args
        .http
        .clone()
        .unwrap_or_else(|| env_address("HOST", "PORT", 8080));
    let http = match http_text.as_str() {
        "off" => None,
        text => Some(parse("http", text)?),
    };
    let config_path = config_path(args);
    let config = Config::load(&config_path).map_err(|e| e.to_string())?;
    let mut sync = SyncConfig {
        interval: Duration::from_millis(args.sync_interval_ms),
        log: Arc::new(|level, message| match level {
            LogLevel::Error => tracing::error!("{message}"),
            LogLevel::Warn => tracing::warn!("{message}"),
            LogLevel::Info => tracing::info!("{message}"),
        }),
        ..SyncConfig::default()
    };
    for root in &args.roots {
        sync.roots
            .push(parse_root_url(root.as_bytes()).map_err(|e| format!("--root {root:?}: {e}"))?);
    }
    if let Some(path) = &args.sync_token_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--sync-token-file {}: {e}", path.display()))?;
        let token = text.trim().to_string();
        validate_token(&token).map_err(|e| format!("--sync-token-file {}: {e}", path.display()))?;
        sync.token = Some(token);
    }
    // Two `sluice rls` on one host (a pod's sidecars, tests) must not
    // share an id at the roots: the default adds the gRPC port.
    sync.limiter_id = match &args.limiter_id {
        Some(id) => id.clone(),
        None => format!("{}:{}", sync.limiter_id, grpc.port()),
    };
    sync.validate().map_err(|e| e.to_string())?;
    let key_secret = match &args.key_secret_file {
        None => None,
        Some(path) => {
            let bytes = std::fs::read(path)
                .map_err(|e| format!("--key-secret-file {}: {e}", path.display()))?;
            Some(
                crate::core::key::KeySecret::from_file_contents(&bytes)
                    .map_err(|e| format!("--key-secret-file {}: {e}", path.display()))?,
            )
        }
    };
    Ok(Settings {
        grpc,
        http,
        config_path,
        config,
        sync,
        key_secret,
    })
}

/// Runs `sluice rls` with `settings` (from [`settings`]) until
/// `shutdown` completes (the binary's: SIGINT or SIGTERM); on the
/// caller's runtime.
pub async fn start(
    args: &RlsArgs,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let has_roots = !settings.sync.roots.is_empty();
    let table = Arc::new(Table::new_heap_with(args.capacity, 64, args.keys, 0));
    table.set_key_secret(settings.key_secret);
    let roots = settings.sync.roots.clone();
    let engine = Arc::new(Engine::new(
        Arc::clone(&table),
        settings.config,
        has_roots,
        args.response_headers,
    )?);
    if has_roots {
        // Until a root's whole quota set is in, the configuration's
        // quotas stand in (as nginx's `sluice_quotas` seeds do).
        table.set_holds_seeds(true);
    }
    let sync = SyncHandle::start(Arc::clone(&table), settings.sync)
        .map_err(|e| format!("cannot start the sync thread: {e}"))?;
    let server = Arc::new(Server::new(engine, Some(sync), has_roots));
    let grpc = TcpListener::bind(settings.grpc)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", settings.grpc))?;
    let http = match settings.http {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?,
        ),
        None => None,
    };
    tracing::info!(
        grpc = %settings.grpc,
        http = ?settings.http,
        config = %settings.config_path.display(),
        roots = ?roots,
        "sluice rls serving"
    );
    let reload = tokio::spawn(watch_config(
        Arc::clone(&server),
        settings.config_path,
        Duration::from_millis(args.reload_interval_ms.max(10)),
    ));
    let result = serve(Arc::clone(&server), grpc, http, shutdown).await;
    reload.abort();
    server.stop();
    result
}

/// Serves gRPC on `grpc` and HTTP on `http` until `shutdown` completes.
pub async fn serve(
    server: Arc<Server>,
    grpc: TcpListener,
    http: Option<TcpListener>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<Service>>()
        .await;
    let service = RateLimitServiceServer::new(Service {
        engine: Arc::clone(&server.engine),
    });
    let incoming = tonic::transport::server::TcpIncoming::from(grpc).with_nodelay(Some(true));
    let mut grpc_stop = stop_rx.clone();
    let grpc_task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = grpc_stop.wait_for(|stop| *stop).await;
            })
            .await
            .map_err(|e| format!("gRPC server: {e}"))
    });
    let http_task = http.map(|listener| {
        let mut http_stop = stop_rx.clone();
        let router = super::http::router(Arc::clone(&server));
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = http_stop.wait_for(|stop| *stop).await;
                })
                .await
                .map_err(|e| format!("HTTP server: {e}"))
        })
    });
    shutdown.await;
    let _ = stop_tx.send(true);
    let grpc_result = grpc_task.await.map_err(|e| e.to_string())?;
    if let Some(task) = http_task {
        task.await.map_err(|e| e.to_string())??;
    }
    grpc_result
}

/// The files' names, sizes and modification times: what a change of the
/// configuration changes (a ConfigMap's symlink swap too).
fn fingerprint(path: &Path) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    config_files(path)
        .unwrap_or_default()
        .into_iter()
        .map(|file| {
            let meta = std::fs::metadata(&file).ok();
            let len = meta.as_ref().map_or(0, |m| m.len());
            let modified = meta.and_then(|m| m.modified().ok());
            (file, len, modified)
        })
        .collect()
}

/// Reloads the configuration when its files change or on SIGHUP; a bad
/// configuration keeps the last good one and says why.
async fn watch_config(server: Arc<Server>, path: PathBuf, every: Duration) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup()).ok();
    let mut seen = fingerprint(&path);
    let mut tick = tokio::time::interval(every);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        let now = fingerprint(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        reload(&server, &path);
    }
}

/// Loads the configuration at `path` and puts it in force, or keeps the
/// last good one.
pub fn reload(server: &Server, path: &Path) {
    use super::metrics::Stats;
    let requests = &server.engine.requests;
    let loaded = Config::load(path)
        .map_err(|e| e.to_string())
        .and_then(|config| server.engine.install(config));
    match loaded {
        Ok(()) => {
            Stats::bump(&requests.config_loads);
            tracing::info!(config = %path.display(), "configuration reloaded");
        }
        Err(error) => {
            Stats::bump(&requests.config_errors);
            tracing::error!(
                config = %path.display(),
                %error,
                "configuration not reloaded: keeping the last good one"
            );
        }
    }
}
