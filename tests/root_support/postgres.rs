//! Throwaway PostgreSQL clusters for the tests.
//!
//! A cluster lives in a temp dir, listens on a free loopback port and its
//! socket dir, trusts local connections, and runs with fsync off. `initdb`
//! refuses to run as root, so as root (CI) every server command runs as the
//! `postgres` user through `runuser`. A watchdog shell stops the cluster and
//! removes its directory once the test process is gone, so nothing outlives
//! the tests even when they are killed.
//!
//! Without PostgreSQL binaries the tests fail when `CI` is set (to
//! anything but `0` or `false`) and are skipped otherwise, with a warning
//! on the test process's stderr that `cargo test` does not capture. `SLUICE_PG_BIN` names the binaries'
//! directory; by default the newest `/usr/lib/postgresql/*/bin` is used.

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use sqlx::{Connection, Executor};

/// A running cluster.
#[derive(Debug)]
pub struct PgCluster {
    /// Directory of `initdb`, `pg_ctl`.
    bin: PathBuf,
    /// Base directory: `data/`, the log and the socket.
    dir: PathBuf,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// Commands run as `postgres` (we are root).
    as_postgres: bool,
    /// Counter for database names.
    databases: AtomicU32,
}

/// True under CI (`CI` set to anything but empty, `0` or `false`), where
/// PostgreSQL is installed by `make deps` and its absence is a failure.
fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// Why there is no cluster: fails under CI, else skips the test saying so.
fn unavailable(reason: String) -> Option<PgCluster> {
    if in_ci() {
        panic!("PostgreSQL is required in CI: {reason}");
    }
    // Straight to the process's stderr: libtest captures `eprintln!` of a
    // passing test, and a skip nobody sees would pass for a PostgreSQL run.
    let _ = writeln!(
        std::io::stderr(),
        "warning: skipping a PostgreSQL test: {reason}"
    );
    None
}

impl PgCluster {
    /// The cluster shared by the tests of this binary (started on first
    /// use), or `None` when PostgreSQL is unavailable outside CI.
    pub fn shared() -> Option<&'static Self> {
        static SHARED: OnceLock<Result<PgCluster, String>> = OnceLock::new();
        match SHARED.get_or_init(Self::start_new) {
            Ok(cluster) => Some(cluster),
            Err(reason) => {
                unavailable(reason.clone());
                None
            }
        }
    }

    /// A cluster of its own, for a test that stops and starts it.
    pub fn private() -> Option<Self> {
        Self::start_new().map_or_else(unavailable, Some)
    }

    /// A stopped cluster's directory, port and watchdog, nothing in its
    /// data directory yet.
    fn empty() -> Result<Self, String> {
        let bin = find_bin()?;
        let as_postgres = is_root();
        let dir = tempfile::Builder::new()
            .prefix("sluice-pg-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?
            .keep();
        if as_postgres {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir))?;
        }
        let cluster = Self {
            bin,
            dir,
            port: free_port()?,
            as_postgres,
            databases: AtomicU32::new(0),
        };
        cluster.spawn_watchdog()?;
        Ok(cluster)
    }

    /// A hot standby of this cluster (streaming from it, read-only until
    /// [`Self::promote`]), or `None` (after saying why) when one cannot
    /// be made here.
    pub fn standby(&self) -> Option<Self> {
        let make = || -> Result<Self, String> {
            let standby = Self::empty()?;
            run(standby
                .tool("pg_basebackup")
                .arg("-D")
                .arg(standby.data())
                .args(["-R", "--checkpoint=fast", "-h", "127.0.0.1"])
                .args(["-U", "postgres", "-p", &self.port.to_string()]))?;
            standby.start_blocking()?;
            Ok(standby)
        };
        make().map_or_else(unavailable, Some)
    }

    /// Promotes a standby: it takes writes from now on.
    pub async fn promote(&self) {
        let mut command = self.tool("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "promote"]);
        blocking(command).await.expect("pg_ctl promote");
    }

    fn start_new() -> Result<Self, String> {
        let cluster = Self::empty()?;
        let data = cluster.data();
        run(cluster.tool("initdb").arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        ]))?;
        cluster.start_blocking()?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// A command running `tool` from the cluster's binaries, as `postgres`
    /// when needed.
    fn tool(&self, tool: &str) -> Command {
        let path = self.bin.join(tool);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    fn start_command(&self) -> Command {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off \
             -c full_page_writes=off -c max_connections=300",
            self.port,
            self.dir.display()
        );
        let mut command = self.tool("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("log"))
            .args(["-w", "-t", "60", "-o", &options, "start"]);
        command
    }

    fn stop_command(&self, mode: &str) -> Command {
        let mut command = self.tool("pg_ctl");
        command
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-m", mode, "stop"]);
        command
    }

    fn start_blocking(&self) -> Result<(), String> {
        run(&mut self.start_command()).map_err(|e| format!("{e}\n{}", self.log_tail()))
    }

    /// Stops the server (fast shutdown: open connections are closed).
    pub async fn stop(&self) {
        let command = self.stop_command("fast");
        blocking(command).await.expect("pg_ctl stop");
    }

    /// Starts the stopped server again on the same port.
    pub async fn start(&self) {
        let command = self.start_command();
        if let Err(e) = blocking(command).await {
            panic!("pg_ctl start: {e}\n{}", self.log_tail());
        }
    }

    /// URL of database `name`.
    pub fn url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// Creates a new empty database and returns its URL.
    pub async fn create_database(&self) -> String {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("sluice_test_{n}");
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres"))
            .await
            .expect("connect to postgres");
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await
            .expect("create database");
        conn.close().await.ok();
        self.url(&name)
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Stops the cluster and removes its directory once this process has
    /// exited, however it exits.
    fn spawn_watchdog(&self) -> Result<(), String> {
        let stop = self.stop_command("immediate");
        let stop_line = std::iter::once(stop.get_program())
            .chain(stop.get_args())
            .map(|a| shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop_line}; rm -rf {dir}",
            pid = std::process::id(),
            dir = shell_quote(&self.dir.to_string_lossy()),
        );
        Command::new("sh")
            .args(["-c", &script])
            // Its own process group: killing the test's group (a timeout)
            // must not kill the watchdog too.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map(drop)
            .map_err(|e| format!("watchdog: {e}"))
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let _ = self
            .stop_command("immediate")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn find_bin() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("SLUICE_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .map_err(|_| {
            "PostgreSQL binaries not found (no /usr/lib/postgresql; set SLUICE_PG_BIN)".to_string()
        })?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin".into())
}

/// True when running as root (then the server runs as `postgres`).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

fn free_port() -> Result<u16, String> {
    let socket = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("free port: {e}"))?;
    socket
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| e.to_string())
}

fn run(command: &mut Command) -> Result<(), String> {
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{command:?}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{command:?} failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

async fn blocking(mut command: Command) -> Result<(), String> {
    tokio::task::spawn_blocking(move || run(&mut command))
        .await
        .map_err(|e| e.to_string())?
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
