//! The `sluice_metrics` content handler: Prometheus text for this nginx.
//!
//! Any worker can answer: everything comes from the shared zone (the table
//! and the sync status the sync thread publishes there).

use ngx::ffi::{
    ngx_buf_t, ngx_chain_t, ngx_conf_t, ngx_create_temp_buf, ngx_http_discard_request_body,
    ngx_http_output_filter, ngx_http_request_t, ngx_http_send_header, ngx_int_t, ngx_str_t,
    NGX_ERROR, NGX_HTTP_GET, NGX_HTTP_HEAD, NGX_HTTP_INTERNAL_SERVER_ERROR, NGX_HTTP_NOT_ALLOWED,
    NGX_HTTP_OK, NGX_HTTP_SERVICE_UNAVAILABLE, NGX_OK,
};
use ngx::http::{HttpModuleLocationConf, HttpModuleMainConf, NgxHttpCoreModule};

use super::conf::{MainConf, DEFAULT_METRICS_TOP};
use super::util::runtime_boundary;
use super::Module;

const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Makes the location being configured serve the metrics.
pub(crate) fn install(cf: *mut ngx_conf_t) -> Result<(), String> {
    // SAFETY: nginx passes the live configuration of a location.
    let clcf = NgxHttpCoreModule::location_conf_mut(unsafe { &*cf })
        .ok_or("sluice_metrics: no location configuration")?;
    clcf.handler = Some(metrics_handler);
    Ok(())
}

/// # Safety
///
/// nginx calls it as the content handler of a `sluice_metrics` location,
/// with a live request.
unsafe extern "C" fn metrics_handler(r: *mut ngx_http_request_t) -> ngx_int_t {
    // SAFETY: nginx passes the request being processed.
    let log_to = unsafe { (*(*r).connection).log };
    runtime_boundary(
        log_to,
        "the metrics handler",
        NGX_HTTP_INTERNAL_SERVER_ERROR as ngx_int_t,
        // SAFETY: as above.
        || serve(unsafe { &mut *r }),
    )
}

/// The metrics text: the limiter's own (table, quotas, sync per root) and
/// what only nginx knows (host id, zone size).
fn render(mcf: &MainConf, top: usize) -> Option<String> {
    let table = mcf.table.as_deref()?;
    let now = crate::clock::now();
    let mut text = super::prometheus::render(table, &mcf.roots, top, now);
    super::prometheus::render_root_groups(&mut text, &mcf.roots, &mcf.root_groups);
    if let Some(counters) = mcf.counters() {
        super::prometheus::render_request_counts(&mut text, &counters.snapshot());
    }
    let host = mcf
        .host_id
        .clone()
        .unwrap_or_else(crate::sync::default_limiter_id);
    text.push_str(
        "# HELP sluice_info The sluice module and this limiter's id at the roots.\n\
         # TYPE sluice_info gauge\n",
    );
    text.push_str(&format!(
        "sluice_info{{version=\"{}\",host_id=\"{}\"}} 1\n",
        env!("CARGO_PKG_VERSION"),
        host.replace(['\\', '"'], "_")
    ));
    text.push_str(
        "# HELP sluice_zone_bytes Bytes of the shared zone used by the quota table.\n\
         # TYPE sluice_zone_bytes gauge\n",
    );
    text.push_str(&format!("sluice_zone_bytes {}\n", table.region_len()));
    Some(text)
}

fn serve(r: &mut ngx_http_request_t) -> ngx_int_t {
    if r.method as u32 & (NGX_HTTP_GET | NGX_HTTP_HEAD) == 0 {
        return NGX_HTTP_NOT_ALLOWED as ngx_int_t;
    }
    // SAFETY: `r` is live; nginx reads and drops the body.
    let rc = unsafe { ngx_http_discard_request_body(r) };
    if rc != NGX_OK as ngx_int_t {
        return rc;
    }
    let top = Module::location_conf(r)
        .and_then(|l| l.metrics)
        .map_or(DEFAULT_METRICS_TOP, |m| m.top);
    let Some(text) = Module::main_conf(r).and_then(|m| render(m, top)) else {
        return NGX_HTTP_SERVICE_UNAVAILABLE as ngx_int_t;
    };
    r.headers_out.status = NGX_HTTP_OK as _;
    r.headers_out.content_length_n = text.len() as _;
    r.headers_out.content_type = ngx_str_t {
        len: CONTENT_TYPE.len(),
        data: CONTENT_TYPE.as_ptr().cast_mut(),
    };
    r.headers_out.content_type_len = CONTENT_TYPE.len();
    // SAFETY: `r` is live and its headers are set.
    let rc = unsafe { ngx_http_send_header(r) };
    if rc == NGX_ERROR as ngx_int_t || rc > NGX_OK as ngx_int_t || r.header_only() != 0 {
        return rc;
    }
    // SAFETY: the buffer and chain come from the request pool and hold a
    // copy of the text, so they outlive this call as nginx needs.
    unsafe {
        let buf: *mut ngx_buf_t = ngx_create_temp_buf(r.pool, text.len().max(1));
        if buf.is_null() {
            return NGX_ERROR as ngx_int_t;
        }
        std::ptr::copy_nonoverlapping(text.as_ptr(), (*buf).pos, text.len());
        (*buf).last = (*buf).pos.add(text.len());
        (*buf).set_last_buf(if r.main == std::ptr::from_mut(r) {
            1
        } else {
            0
        });
        (*buf).set_last_in_chain(1);
        let mut out = ngx_chain_t {
            buf,
            next: std::ptr::null_mut(),
        };
        ngx_http_output_filter(r, &mut out)
    }
}
