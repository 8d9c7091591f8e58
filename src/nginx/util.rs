//! Small bridges between nginx's C world and safe Rust used by every part
//! of the module: strings, directive arguments, panic boundaries, logging.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ngx::ffi::{
    ngx_conf_t, ngx_http_variable_value_t, ngx_log_t, ngx_pool_cleanup_pt, ngx_pool_t, ngx_str_t,
    ngx_uint_t, NGX_LOG_ALERT, NGX_LOG_EMERG,
};

/// The bytes of an nginx string.
///
/// # Safety
/// `s.data` must point to `s.len` readable bytes (or be anything when
/// `s.len` is 0) that outlive the returned slice.
pub(crate) unsafe fn bytes<'a>(s: &ngx_str_t) -> &'a [u8] {
    if s.len == 0 || s.data.is_null() {
        return &[];
    }
    // SAFETY: non-null with `len` readable bytes, per the caller.
    unsafe { std::slice::from_raw_parts(s.data, s.len) }
}

/// The arguments of the directive being parsed, the directive name first.
///
/// # Safety
/// `cf` must be the configuration nginx passed to a directive handler.
pub(crate) unsafe fn directive_args<'a>(cf: &ngx_conf_t) -> Vec<&'a [u8]> {
    // SAFETY: while a directive is parsed, `cf.args` is an array of
    // `nelts` ngx_str_t living in the configuration's temporary pool.
    unsafe {
        let args = &*cf.args;
        let strs = std::slice::from_raw_parts(args.elts.cast::<ngx_str_t>(), args.nelts);
        strs.iter().map(|s| bytes(s)).collect()
    }
}

/// Bytes as text for messages (nginx strings need not be UTF-8).
pub(crate) fn text(b: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(b)
}

/// The data of the first cleanup entry of `pool` whose handler is
/// `handler`, or null: per-request state kept in the main request's pool
/// survives internal redirects (which wipe the module context), and its
/// handler marks it.
///
/// # Safety
/// `pool` must be a live nginx pool.
pub(crate) unsafe fn cleanup_data(
    pool: *const ngx_pool_t,
    handler: unsafe extern "C" fn(*mut std::ffi::c_void),
) -> *mut std::ffi::c_void {
    // SAFETY: a live pool's cleanup list holds only entries nginx
    // allocated from it.
    unsafe {
        let mut c = (*pool).cleanup;
        while !c.is_null() {
            let h: ngx_pool_cleanup_pt = (*c).handler;
            if h.is_some_and(|h| std::ptr::fn_addr_eq(h, handler)) {
                return (*c).data;
            }
            c = (*c).next;
        }
    }
    std::ptr::null_mut()
}

/// Fills a variable's value with static text, or marks it not found
/// (`None`, or empty text: `$var` then logs as `-`).
pub(crate) fn set_variable(v: &mut ngx_http_variable_value_t, text: Option<&'static str>) {
    match text.filter(|t| !t.is_empty()) {
        None => v.set_not_found(1),
        Some(text) => {
            v.data = text.as_ptr().cast_mut();
            v.set_len(text.len() as u32);
            v.set_valid(1);
            v.set_no_cacheable(0);
            v.set_not_found(0);
        }
    }
}

/// Logs a configuration error at `emerg` with nginx's "in file:line" suffix.
pub(crate) fn conf_error(cf: *mut ngx_conf_t, message: &str) {
    ngx::ngx_conf_log_error!(NGX_LOG_EMERG, cf, "{}", message);
}

/// Logs `message` at `level` to `log`.
///
/// # Safety
/// `log` must be a valid nginx log.
pub(crate) unsafe fn log(level: ngx_uint_t, log: *mut ngx_log_t, message: std::fmt::Arguments) {
    if log.is_null() {
        return;
    }
    ngx::ngx_log_error!(level, log, "{}", message);
}

/// Where a directive was read: its file and line, kept for an error that
/// only shows once the whole `http` block is read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ConfPosition {
    /// The configuration file's name, NUL-terminated (nginx prints it
    /// with `%s`).
    file: Vec<u8>,
    /// The line.
    line: ngx_uint_t,
}

impl std::fmt::Display for ConfPosition {
    /// `file:line`, as nginx names a place in its configuration.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.file.strip_suffix(&[0]).unwrap_or(&self.file);
        write!(f, "{}:{}", String::from_utf8_lossy(name), self.line)
    }
}

impl ConfPosition {
    /// Where the parser is now: the directive being read.
    ///
    /// # Safety
    /// `cf` must be the configuration nginx passed to a directive handler.
    pub(crate) unsafe fn of(cf: &ngx_conf_t) -> Self {
        if cf.conf_file.is_null() {
            return Self::default();
        }
        // SAFETY: while a directive is read, `conf_file` is the file being
        // parsed, its name a live nginx string.
        let (name, line) = unsafe { (bytes(&(*cf.conf_file).file.name), (*cf.conf_file).line) };
        let mut file = name.to_vec();
        file.push(0);
        Self { file, line }
    }
}

/// Logs a configuration error at `emerg` as [`conf_error`] does, but with
/// the file and line `at` instead of where the parser is now.
pub(crate) fn conf_error_at(cf: *mut ngx_conf_t, at: &ConfPosition, message: &str) {
    conf_log_at(cf, NGX_LOG_EMERG as ngx_uint_t, at, message);
}

/// Logs `message` about the configuration at `level` with the file and
/// line `at` (nginx's "in file:line" suffix), as nginx logs a directive's
/// warning.
pub(crate) fn conf_log_at(
    cf: *mut ngx_conf_t,
    level: ngx_uint_t,
    at: &ConfPosition,
    message: &str,
) {
    // SAFETY: nginx passes a live configuration; its current file's name
    // and line are swapped for `at`'s (which outlives the call) while the
    // message is logged, then put back.
    unsafe {
        let file = if cf.is_null() {
            std::ptr::null_mut()
        } else {
            (*cf).conf_file
        };
        if file.is_null() || at.file.is_empty() {
            ngx::ngx_conf_log_error!(level, cf, "{}", message);
            return;
        }
        let (name, line) = ((*file).file.name, (*file).line);
        (*file).file.name = ngx_str_t {
            len: at.file.len() - 1,
            data: at.file.as_ptr().cast_mut(),
        };
        (*file).line = at.line;
        ngx::ngx_conf_log_error!(level, cf, "{}", message);
        (*file).file.name = name;
        (*file).line = line;
    }
}

/// Runs a configuration callback body: `Err` is logged as a configuration
/// error, a panic as an internal error; either makes the directive (and
/// `nginx -t`) fail.
pub(crate) fn conf_boundary(
    cf: *mut ngx_conf_t,
    f: impl FnOnce() -> Result<(), String>,
) -> *mut std::ffi::c_char {
    conf_boundary_at(cf, || f().map_err(|message| (message, None)))
}

/// As [`conf_boundary`], for a body whose error may name the directive
/// it is about ([`conf_error_at`]) rather than where the parser is.
pub(crate) fn conf_boundary_at(
    cf: *mut ngx_conf_t,
    f: impl FnOnce() -> Result<(), (String, Option<ConfPosition>)>,
) -> *mut std::ffi::c_char {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ngx::core::NGX_CONF_OK,
        Ok(Err((message, at))) => {
            match at {
                Some(at) => conf_error_at(cf, &at, &message),
                None => conf_error(cf, &message),
            }
            ngx::core::NGX_CONF_ERROR
        }
        Err(_) => {
            conf_error(
                cf,
                "sluice: internal error (panic) while reading the configuration",
            );
            ngx::core::NGX_CONF_ERROR
        }
    }
}

/// Runs a runtime callback body, turning a panic into an `alert` in `log`
/// and the value `fallback` (fail open: the caller picks a value that lets
/// the request go on).
pub(crate) fn runtime_boundary<T>(
    log_to: *mut ngx_log_t,
    what: &str,
    fallback: T,
    f: impl FnOnce() -> T,
) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            // SAFETY: callers pass the log of the request or cycle at hand.
            unsafe {
                log(
                    NGX_LOG_ALERT as ngx_uint_t,
                    log_to,
                    format_args!("sluice: internal error (panic) in {what}; failing open"),
                )
            };
            fallback
        }
    }
}

/// Adds `handler` to the handlers of the request phase `phase` (called
/// from postconfiguration, once the `http` block is parsed).
pub(crate) fn add_phase_handler(
    cf: *mut ngx::ffi::ngx_conf_t,
    phase: ngx::ffi::ngx_http_phases,
    handler: unsafe extern "C" fn(*mut ngx::ffi::ngx_http_request_t) -> ngx::ffi::ngx_int_t,
) -> Result<(), String> {
    use ngx::http::HttpModuleMainConf as _;
    // SAFETY: `cf` is the live configuration at the end of the http block.
    let cmcf = ngx::http::NgxHttpCoreModule::main_conf_mut(unsafe { &*cf })
        .ok_or("sluice: no http core configuration")?;
    // SAFETY: the phase's handler array holds ngx_http_handler_pt entries.
    unsafe {
        let h = ngx::ffi::ngx_array_push(&mut cmcf.phases[phase as usize].handlers)
            .cast::<ngx::ffi::ngx_http_handler_pt>();
        if h.is_null() {
            return Err("sluice: out of memory".into());
        }
        *h = Some(handler);
    }
    Ok(())
}
