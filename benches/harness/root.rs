//! A `sluice root` child process for the root benchmarks: started from a
//! TOML configuration on a free loopback port, waited for, measured
//! through `/proc`, stopped with SIGTERM.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `sluice` binary cargo built for this bench.
const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A running `sluice root`.
pub struct RootProcess {
    /// The process.
    pub child: Child,
    /// Its base URL, `http://127.0.0.1:<port>`.
    pub url: String,
    /// Its port.
    pub port: u16,
}

impl RootProcess {
    /// Starts a root on an SQLite database in `dir`, with `settings` (TOML
    /// lines) after `listen` and `db`.
    pub fn start(dir: &Path, settings: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("root.toml");
        let mut text = String::new();
        writeln!(text, "listen = \"127.0.0.1:{port}\"").unwrap();
        writeln!(text, "db = \"sqlite://{}/bench.db\"", dir.display()).unwrap();
        text.push_str(settings);
        std::fs::write(&config, text).unwrap();
        let child = Command::new(SLUICE)
            .arg("root")
            .arg("--config")
            .arg(&config)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sluice root");
        Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            port,
        }
    }

    /// Waits until `/healthz` answers 200; returns how long that took.
    pub async fn wait_ready(&self, http: &reqwest::Client) -> Duration {
        let started = Instant::now();
        loop {
            let reply = http.get(format!("{}/healthz", self.url)).send().await;
            if reply.is_ok_and(|r| r.status().is_success()) {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "root not ready"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// User + system CPU seconds of the root so far.
    pub fn cpu_seconds(&self) -> f64 {
        super::measure::cpu_seconds(self.child.id())
    }

    /// (VmRSS, VmHWM) in MiB.
    pub fn memory_mib(&self) -> (f64, f64) {
        super::measure::memory_mib(self.child.id())
    }

    /// Stops the root with SIGTERM and checks that it exited cleanly.
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child with a valid signal.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "root exited with {status}");
    }
}
