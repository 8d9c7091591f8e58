//! The admin API client: one request per call, errors as one line.

use std::time::Duration;

use reqwest::header::HeaderName;
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

/// A failed command, as the one line the CLI prints.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    /// The line to print.
    pub message: String,
    /// The root's HTTP status, when it answered with an error.
    pub status: Option<StatusCode>,
}

impl CliError {
    /// An error from any displayable reason.
    pub fn new(reason: impl std::fmt::Display) -> Self {
        Self {
            message: reason.to_string(),
            status: None,
        }
    }
}

/// A root's admin API.
#[derive(Debug)]
pub struct Client {
    /// The HTTP client (timeouts set).
    http: reqwest::Client,
    /// Base URL of the root, e.g. `http://127.0.0.1:7070/`.
    base: Url,
    /// Admin token, if the root wants one.
    token: Option<String>,
}

/// A successful reply.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status (2xx).
    pub status: StatusCode,
    /// The JSON body.
    pub body: Value,
}

impl Client {
    /// A client for the root at `base`.
    pub fn new(base: &str, token: Option<String>, timeout: Duration) -> Result<Self, CliError> {
        let mut base = Url::parse(base).map_err(|e| {
            let hint = if base.contains("://") {
                String::new()
            } else {
                format!(" (add the scheme: --root http://{base})")
            };
            CliError::new(format!("invalid --root URL {base:?}: {e}{hint}"))
        })?;
        if base.cannot_be_a_base() || !matches!(base.scheme(), "http" | "https") {
            // "127.0.0.1:7070" parses as the scheme "127.0.0.1"; "localhost:7070"
            // as "localhost".
            return Err(CliError::new(format!(
                "--root must be an http:// URL, not {base} (add the scheme: --root \
                 http://{})",
                base.as_str().trim_start_matches("http://")
            )));
        }
        if !base.path().ends_with('/') {
            let path = format!("{}/", base.path());
            base.set_path(&path);
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| CliError::new(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { http, base, token })
    }

    /// The root's base URL.
    pub fn base(&self) -> &str {
        self.base.as_str()
    }

    /// `path` (relative, e.g. `v1/quotas`) with each of `segments` appended
    /// as an encoded path segment and `query` pairs with a value. A
    /// segment `.` or `..` is refused: it would be resolved away, and the
    /// request would go to another path.
    pub fn url(
        &self,
        path: &str,
        segments: &[&str],
        query: &[(&str, Option<&str>)],
    ) -> Result<Url, CliError> {
        if let Some(dots) = segments.iter().find(|s| matches!(**s, "." | "..")) {
            return Err(CliError::new(format!(
                "{dots:?} cannot be sent as a name: it would name another path"
            )));
        }
        let mut url = self.base.join(path).unwrap_or_else(|_| self.base.clone());
        if !segments.is_empty() {
            if let Ok(mut parts) = url.path_segments_mut() {
                parts.extend(segments);
            }
        }
        let pairs: Vec<(&str, &str)> = query
            .iter()
            .filter_map(|&(k, v)| v.map(|v| (k, v)))
            .collect();
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        Ok(url)
    }

    /// Sends a request with an optional JSON body; a non-2xx reply becomes
    /// an error carrying the root's message.
    pub async fn send(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
    ) -> Result<Reply, CliError> {
        self.send_with(method, url, body, &[]).await
    }

    /// [`Self::send`] with extra request headers (`If-None-Match`).
    pub async fn send_with(
        &self,
        method: Method,
        url: Url,
        body: Option<Vec<u8>>,
        headers: &[(HeaderName, &str)],
    ) -> Result<Reply, CliError> {
        let mut request = self.http.request(method.clone(), url.clone());
        for (name, value) in headers {
            request = request.header(name, *value);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request
            .send()
            .await
            .map_err(|e| CliError::new(format!("{method} {url}: {}", describe(&e))))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| {
            CliError::new(format!(
                "{method} {url}: reading the reply: {}",
                describe(&e)
            ))
        })?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(Reply { status, body });
        }
        let mut message = error_line(status, &body, &bytes);
        if status == StatusCode::UNAUTHORIZED {
            message.push_str(if self.token.is_some() {
                " (the root refused this admin token: check --token, SLUICE_ADMIN_TOKEN or \
                 --token-file)"
            } else {
                " (the root needs its admin token: give --token, or set SLUICE_ADMIN_TOKEN or \
                 --token-file)"
            });
        }
        Err(CliError {
            message,
            status: Some(status),
        })
    }
}

/// The root's error reply as one line: `status: field: message`.
fn error_line(status: StatusCode, body: &Value, raw: &[u8]) -> String {
    let error = &body["error"];
    let message = error["message"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| {
            String::from_utf8_lossy(raw)
                .chars()
                .take(200)
                .collect::<String>()
                .trim()
                .to_string()
        });
    let mut line = format!("root answered {status}: ");
    if let Some(quota) = error["quota"].as_str() {
        line.push_str(&format!("quota {quota:?}: "));
    }
    if let Some(field) = error["field"].as_str() {
        line.push_str(&format!("{field}: "));
    }
    line.push_str(&message);
    line.replace('\n', " ")
}

/// A transport error in a few words (reqwest's display omits the cause).
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_encode_names_and_skip_absent_query_values() {
        let client = Client::new("http://127.0.0.1:7070", None, Duration::from_secs(1)).unwrap();
        let url = client.url("v1/quotas", &["a:b.c"], &[]).unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:7070/v1/quotas/a:b.c");
        let url = client
            .url(
                "v1/quotas",
                &[],
                &[("prefix", Some("s3_")), ("after", None)],
            )
            .unwrap();
        assert_eq!(url.as_str(), "http://127.0.0.1:7070/v1/quotas?prefix=s3_");
        let nested = Client::new("http://h/root/", None, Duration::from_secs(1)).unwrap();
        assert_eq!(
            nested.url("v1/apply", &[], &[]).unwrap().as_str(),
            "http://h/root/v1/apply"
        );
    }

    #[test]
    fn dot_segments_are_refused_before_they_resolve_to_another_path() {
        let client = Client::new("http://h/", None, Duration::from_secs(1)).unwrap();
        for segments in [&[".."][..], &["."], &["q", "keys", ".."]] {
            let error = client.url("v1/quotas", segments, &[]).unwrap_err();
            assert!(error.message.contains("another path"), "{error}");
        }
    }

    #[test]
    fn error_replies_become_one_line() {
        let body: Value =
            serde_json::json!({"error": {"field": "limit", "message": "must not\nbe negative"}});
        assert_eq!(
            error_line(StatusCode::BAD_REQUEST, &body, b""),
            "root answered 400 Bad Request: limit: must not be negative"
        );
        assert_eq!(
            error_line(StatusCode::BAD_GATEWAY, &Value::Null, b"upstream down\n"),
            "root answered 502 Bad Gateway: upstream down"
        );
    }

    #[test]
    fn only_http_roots_are_accepted() {
        assert!(Client::new("ftp://h", None, Duration::from_secs(1)).is_err());
        assert!(Client::new("not a url", None, Duration::from_secs(1)).is_err());
    }

    /// The issue's case: `--root 127.0.0.1:7070` said only "relative URL
    /// without a base".
    #[test]
    fn a_root_without_its_scheme_is_told_to_add_it() {
        for root in ["127.0.0.1:7070", "localhost:7070", "root.example"] {
            let error = Client::new(root, None, Duration::from_secs(1)).unwrap_err();
            assert!(
                error
                    .message
                    .contains(&format!("add the scheme: --root http://{root}")),
                "{root}: {error}"
            );
        }
    }
}
