//! `GET /ui`: the web console, three static files compiled into the binary
//! (`src/root/ui/`), no CDN, no fonts: it works offline.
//!
//! The page itself is public and holds nothing secret; everything it
//! shows comes from `GET /v1/overview` and the admin API, which apply the
//! admin token (the page sends it from the tab's session storage as a
//! bearer header, never as a cookie, so other sites cannot make the
//! browser use it). Every answer carries a content security policy that
//! allows only this root's own scripts, styles and API, and no framing.

use std::sync::Arc;

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::root::state::RootState;

/// The page.
const INDEX_HTML: &str = include_str!("../ui/index.html");
/// Its script.
const CONSOLE_JS: &str = include_str!("../ui/console.js");
/// Its style sheet.
const CONSOLE_CSS: &str = include_str!("../ui/console.css");

/// Only this root's own files and API; no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The console's routes. Links inside the page are relative to `/ui`, so
/// the console also works behind a proxy that mounts the root under a
/// path; `/` and `/ui/` send the browser there.
pub fn routes() -> Router<Arc<RootState>> {
    Router::new()
        .route("/", get(|| async { redirect("ui") }))
        .route("/ui/", get(|| async { redirect("../ui") }))
        .route(
            "/ui",
            get(|| async { asset(INDEX_HTML, "text/html; charset=utf-8") }),
        )
        .route(
            "/ui/console.js",
            get(|| async { asset(CONSOLE_JS, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/ui/console.css",
            get(|| async { asset(CONSOLE_CSS, "text/css; charset=utf-8") }),
        )
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Revalidate every time: a new binary serves new files at once.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn redirect(location: &'static str) -> Response {
    (
        StatusCode::FOUND,
        [(HeaderName::from_static("location"), location)],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_its_own_files() {
        for url in ["ui/console.js", "ui/console.css"] {
            assert!(INDEX_HTML.contains(&format!("\"{url}\"")), "{url}");
        }
        // Nothing from elsewhere, nothing inline for the policy to block.
        for forbidden in ["http://", "https://", "<script>", " style=", " onclick="] {
            assert!(!INDEX_HTML.contains(forbidden), "{forbidden}");
        }
    }

    #[test]
    fn the_script_never_writes_html_from_data() {
        // Quota names and limiter ids come from the network; the script
        // builds the page with text nodes only.
        for forbidden in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "eval(",
            "document.write",
        ] {
            assert!(!CONSOLE_JS.contains(forbidden), "{forbidden}");
        }
    }
}
