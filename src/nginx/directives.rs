//! The directive handlers: each parses its arguments in safe code
//! returning `Result<(), String>` and fills the configuration of
//! `conf.rs`; the message is logged at `emerg` with the file and line
//! (`nginx -t` fails), in nginx's own phrasing where one exists.

use std::ffi::c_char;
use std::ptr;
use std::time::Duration;

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_http_compile_complex_value, ngx_http_compile_complex_value_t,
    ngx_http_complex_value_t, ngx_pcalloc, ngx_str_t, ngx_uint_t, NGX_LOG_ERR, NGX_LOG_INFO,
    NGX_LOG_NOTICE, NGX_LOG_WARN, NGX_OK,
};
use ngx::http::HttpModuleMainConf;

use super::args::{
    parse_empty_weight, parse_flag, parse_no_key, parse_size, parse_time_ms, parse_wait,
    parse_wait_coalesce, parse_weight, EmptyWeight,
};
use super::conf::{
    ChargeConf, Check, LocConf, MainConf, MetricsConf, QuotaFile, WaitMax, Weight,
    DEFAULT_METRICS_TOP, DEFAULT_WAIT_MAX_SLOT, MAX_WAIT_MAX,
};
use super::headers::PolicyNames;
use super::util::{bytes, conf_boundary, directive_args, text, ConfPosition};
use super::zone_size::{
    check_zone_size, largest_useful_size, MAX_KEYS_SIZE, MAX_OVERRIDES_SIZE, MIN_ZONE_SIZE,
};
use super::Module;
use crate::core::key::KeySecret;
use crate::core::quota::validate_name;
use crate::core::spec::{FileFormat, QuotaSet};
use crate::sync::config::{
    parse_root_url, validate_interval, validate_limiter_id, validate_token, MAX_ROOTS,
};
use crate::table::MAX_CHECKS;

/// Defines a directive handler: the `set` callback nginx calls, running
/// `$body` inside [`conf_boundary`] with the directive's configuration
/// structure (`$conf` of type `$ty`), its arguments (`$args`, the directive
/// name first) and the configuration being parsed (`$cf`).
macro_rules! directive_handler {
    ($(#[$doc:meta])* $name:ident, |$cf:ident, $conf:ident: &mut $ty:ty, $args:ident| $body:block) => {
        $(#[$doc])*
        pub(crate) unsafe extern "C" fn $name(
            $cf: *mut ngx_conf_t,
            _cmd: *mut ngx_command_t,
            conf: *mut std::ffi::c_void,
        ) -> *mut c_char {
            conf_boundary($cf, || {
                // SAFETY: nginx passes the live configuration and the
                // structure this directive is registered for (main or
                // location, matching `$ty`).
                let ($conf, $args): (&mut $ty, Vec<&[u8]>) =
                    unsafe { (&mut *conf.cast::<$ty>(), directive_args(&*$cf)) };
                $body
            })
        }
    };
}

/// Stores `value` unless the directive (named in `args[0]`) already did.
fn once<T>(slot: &mut Option<T>, value: T, args: &[&[u8]]) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("\"{}\" directive is duplicate", text(args[0])));
    }
    *slot = Some(value);
    Ok(())
}

/// Stores a directive parameter's value unless the directive gave it
/// already.
fn param_once<T>(slot: &mut Option<T>, value: T, arg: &[u8]) -> Result<(), String> {
    if slot.is_some() {
        return Err(format!("duplicate parameter \"{}\"", text(arg)));
    }
    *slot = Some(value);
    Ok(())
}

/// The `http`-level configuration, reached from any directive.
fn main_conf(cf: &ngx_conf_t) -> Result<&'static mut MainConf, String> {
    Module::main_conf_mut(cf).ok_or_else(|| "sluice: no http configuration".to_string())
}

/// A NUL-terminated copy of `bytes` in the configuration pool, which
/// lives as long as the configuration that keeps it.
fn pool_copy(cf: *mut ngx_conf_t, bytes: &[u8]) -> Result<ngx_str_t, String> {
    // SAFETY: `cf` is the live configuration; the copy has room for the
    // bytes and the NUL that ngx_pcalloc's zeroing provides.
    unsafe {
        let copy = ngx_pcalloc((*cf).pool, bytes.len() + 1).cast::<u8>();
        if copy.is_null() {
            return Err("sluice: out of memory".into());
        }
        ptr::copy_nonoverlapping(bytes.as_ptr(), copy, bytes.len());
        Ok(ngx_str_t {
            len: bytes.len(),
            data: copy,
        })
    }
}

/// Compiles `value` (possibly with variables) into a complex value
/// allocated from the configuration pool.
fn compile(
    cf: *mut ngx_conf_t,
    value: &[u8],
    what: &str,
) -> Result<*const ngx_http_complex_value_t, String> {
    let mut source = pool_copy(cf, value)?;
    // SAFETY: `cf` is the live configuration; the compiled value and its
    // source live in its pool, as long as the configuration keeps them.
    unsafe {
        let cv = ngx_pcalloc((*cf).pool, std::mem::size_of::<ngx_http_complex_value_t>())
            .cast::<ngx_http_complex_value_t>();
        if cv.is_null() {
            return Err(format!("sluice: out of memory compiling {what}"));
        }
        let mut ccv: ngx_http_compile_complex_value_t = std::mem::zeroed();
        ccv.cf = cf;
        ccv.value = &mut source;
        ccv.complex_value = cv;
        if ngx_http_compile_complex_value(&mut ccv) != NGX_OK as isize {
            // nginx has logged why (unknown variable...).
            return Err(format!("invalid {what} \"{}\"", text(value)));
        }
        Ok(cv)
    }
}

/// True when a compiled value has no variables.
fn is_literal(cv: *const ngx_http_complex_value_t) -> bool {
    // SAFETY: `cv` was compiled by `compile`.
    unsafe { (*cv).lengths.is_null() }
}

/// The text of a compiled value without variables.
fn literal_of<'a>(cv: *const ngx_http_complex_value_t) -> Option<&'a [u8]> {
    // SAFETY: `cv` was compiled by `compile` from a pool copy that lives as
    // long as the configuration.
    is_literal(cv).then(|| unsafe { bytes(&(*cv).value) })
}

/// Resolves `name` against the configuration's directory, as nginx does
/// for files named in a configuration.
fn full_path(cf: *mut ngx_conf_t, name: &[u8]) -> Result<String, String> {
    let mut s = pool_copy(cf, name)?;
    // SAFETY: `cf` is live; ngx_conf_full_name only rewrites `s`, with
    // memory from the cycle's pool.
    unsafe {
        if ngx::ffi::ngx_conf_full_name((*cf).cycle, &mut s, 1) != NGX_OK as isize {
            return Err(format!("cannot resolve path \"{}\"", text(name)));
        }
        Ok(text(bytes(&s)).into_owned())
    }
}

/// Reads a file named in the configuration; `what` names it in errors.
fn read_conf_file(
    cf: *mut ngx_conf_t,
    name: &[u8],
    what: &str,
) -> Result<(String, String), String> {
    let path = full_path(cf, name)?;
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("cannot read {what} \"{path}\": {e}"))?;
    Ok((path, text))
}

// ---- http-level directives ------------------------------------------------

directive_handler!(
    /// `sluice_zone <size>;`
    set_zone,
    |cf, mcf: &mut MainConf, args| {
        let size = parse_size(args[1])
            .ok_or_else(|| format!("invalid zone size \"{}\"", text(args[1])))?;
        check_zone_size(
            size,
            MIN_ZONE_SIZE,
            largest_useful_size(),
            super::zone::physical_memory(),
        )
        .map_err(|why| format!("zone size \"{}\" {why}", text(args[1])))?;
        once(&mut mcf.zone_size, size, &args)?;
        // SAFETY: nginx passes the live configuration to the directive.
        mcf.zone_at = Some(unsafe { ConfPosition::of(&*cf) });
        mcf.used = true;
        Ok(())
    }
);

directive_handler!(
    /// `sluice_root <url> [<url> ...] [group=<n>];` (may be repeated; the
    /// roots of a directive are in group `n`, 0 by default).
    set_root,
    |cf, mcf: &mut MainConf, args| {
        let mut urls = &args[1..];
        let mut group = 0;
        if let Some((last, rest)) = urls.split_last() {
            if let Some(parsed) = crate::sync::config::parse_group_arg(last) {
                group = parsed?;
                urls = rest;
            }
        }
        if urls.is_empty() {
            return Err("\"sluice_root\" needs at least one quota root URL".into());
        }
        for arg in urls {
            let url = parse_root_url(arg)
                .map_err(|why| format!("invalid quota root \"{}\": {why}", text(arg)))?;
            if mcf.roots.contains(&url) {
                return Err(format!("quota root \"{url}\" is duplicate"));
            }
            if mcf.roots.len() == MAX_ROOTS {
                return Err(format!("too many quota roots (at most {MAX_ROOTS})"));
            }
            mcf.roots.push(url);
            mcf.root_groups.push(group);
        }
        // SAFETY: nginx passes the live configuration to the directive.
        let here = unsafe { ConfPosition::of(&*cf) };
        mcf.group_lines.retain(|(g, _)| *g != group);
        mcf.group_lines.push((group, here));
        mcf.used = true;
        Ok(())
    }
);

directive_handler!(
    /// `sluice_quotas <file>;`
    set_quotas,
    |cf, mcf: &mut MainConf, args| {
        FileFormat::for_path(std::path::Path::new(&*text(args[1])), false)?;
        let (path, json) = read_conf_file(cf, args[1], "quota file")?;
        let set = QuotaSet::from_json(&json)
            .map_err(|e| format!("invalid quota file \"{path}\": {e}"))?;
        // SAFETY: nginx passes the live configuration to the directive.
        let at = unsafe { ConfPosition::of(&*cf) };
        once(&mut mcf.quotas, QuotaFile { path, set, at }, &args)?;
        mcf.used = true;
        Ok(())
    }
);

directive_handler!(
    /// `sluice_sync_interval <time>;`, `sluice_sync_timeout <time>;` and
    /// `sluice_in_flight_lease <time>;`
    set_sync_time,
    |cf, mcf: &mut MainConf, args| {
        let ms = parse_time_ms(args[1])
            .ok_or_else(|| format!("invalid time \"{}\"", text(args[1])))?;
        if args[0] == b"sluice_sync_interval" {
            if validate_interval(Duration::from_millis(ms)).is_err() {
                return Err(format!(
                    "sync interval \"{}\" is out of range (100ms to 1h)",
                    text(args[1])
                ));
            }
            once(&mut mcf.sync_interval_ms, ms, &args)
        } else if args[0] == b"sluice_in_flight_lease" {
            if ms == 0 {
                return Err("in-flight lease must be greater than 0".into());
            }
            once(&mut mcf.in_flight_lease_ms, ms, &args)
        } else {
            if ms == 0 {
                return Err("sync timeout must be greater than 0".into());
            }
            once(&mut mcf.sync_timeout_ms, ms, &args)
        }
    }
);

directive_handler!(
    /// `sluice_sync_token_file <path>;`
    set_token_file,
    |cf, mcf: &mut MainConf, args| {
        let (path, token) = read_conf_file(cf, args[1], "sync token file")?;
        let token = token.trim();
        validate_token(token).map_err(|_| {
            format!("sync token file \"{path}\" must hold one token of printable characters")
        })?;
        once(&mut mcf.sync_token, token.to_string(), &args)
    }
);

directive_handler!(
    /// `sluice_host_id <string>;`
    set_host_id,
    |cf, mcf: &mut MainConf, args| {
        let id = text(args[1]).into_owned();
        validate_limiter_id(&id)
            .map_err(|e| format!("invalid host id \"{id}\": {}", e.message))?;
        once(&mut mcf.host_id, id, &args)
    }
);

directive_handler!(
    /// `sluice_sync_early <fraction> [rate=<n>];`
    set_early_sync,
    |cf, mcf: &mut MainConf, args| {
        let early = super::args::parse_early_sync(&args[1..])?;
        once(&mut mcf.early_sync, early, &args)
    }
);

// ---- location-level directives ------------------------------------------

directive_handler!(
    /// `sluice <name> [key=<value> [no_key=pass|reject]]
    /// [weight=<number|$variable> [empty=reject|<n>]] [wait=<time>];` or
    /// `sluice off;`
    set_check,
    |cf, lcf: &mut LocConf, args| {
        // SAFETY: `cf` is the live configuration.
        main_conf(unsafe { &*cf })?.used = true;
        let combined = "\"sluice off\" cannot be combined with other \"sluice\" directives \
                        at the same level";
        if args[1] == b"off" && args.len() == 2 {
            if lcf.checks.as_ref().is_some_and(|c| !c.is_empty()) {
                return Err(combined.into());
            }
            lcf.off = true;
            lcf.checks = Some(Vec::new());
            return Ok(());
        }
        if lcf.off {
            return Err(combined.into());
        }
        // nginx has no TAKE1..6: the name and up to five parameters,
        // refused in nginx's own words beyond that.
        if args.len() > 7 {
            return Err("invalid number of arguments in \"sluice\" directive".into());
        }
        let checks = lcf.checks.get_or_insert_with(Vec::new);
        if checks.len() == MAX_CHECKS {
            return Err(format!(
                "too many \"sluice\" directives at one level (at most {MAX_CHECKS})"
            ));
        }
        let name = compile_name(cf, args[1])?;
        note_literal_name(cf, name)?;
        let mut weight = None;
        let mut key = None;
        let mut empty = None;
        let mut wait = None;
        let mut no_key = None;
        for arg in &args[2..] {
            if let Some(value) = arg.strip_prefix(b"weight=") {
                param_once(&mut weight, compile_weight(cf, value)?, arg)?;
            } else if let Some(value) = arg.strip_prefix(b"no_key=") {
                let n = parse_no_key(value)
                    .map_err(|why| format!("invalid value \"{}\": no_key= {why}", text(arg)))?;
                param_once(&mut no_key, n, arg)?;
            } else if let Some(value) = arg.strip_prefix(b"empty=") {
                let e = parse_empty_weight(value)
                    .map_err(|why| format!("invalid value \"{}\": empty= {why}", text(arg)))?;
                param_once(&mut empty, e, arg)?;
            } else if let Some(value) = arg.strip_prefix(b"key=") {
                param_once(&mut key, compile_key(cf, value)?, arg)?;
            } else if let Some(value) = arg.strip_prefix(b"wait=") {
                let w = parse_wait(value)
                    .map_err(|why| format!("invalid value \"{}\": wait= {why}", text(arg)))?;
                param_once(&mut wait, w, arg)?;
            } else {
                return Err(format!("invalid parameter \"{}\"", text(arg)));
            }
        }
        let mut weight = weight.unwrap_or(Weight::Fixed(1));
        match (&mut weight, empty) {
            (Weight::Value { empty: slot, .. }, Some(empty)) => *slot = empty,
            (Weight::Fixed(_), Some(_)) => {
                return Err("\"empty=\" needs a weight from a variable (weight=$...)".into())
            }
            _ => {}
        }
        if no_key.is_some() && key.is_none() {
            return Err("\"no_key=\" needs \"key=\", e.g. key=$http_x_api_token no_key=reject".into());
        }
        if is_literal(name)
            && key.is_none()
            && checks
                .iter()
                .any(|c| c.key.is_none() && literal_of(c.name) == Some(args[1]))
        {
            return Err(format!("quota \"{}\" is duplicate", text(args[1])));
        }
        checks.push(Check {
            name,
            key,
            weight,
            max_wait: wait.flatten(),
            no_key: no_key.unwrap_or_default(),
        });
        Ok(())
    }
);

/// Remembers a literal quota name and where it was given, to check it
/// against `sluice_quotas` once the `http` block is read.
fn note_literal_name(
    cf: *mut ngx_conf_t,
    name: *const ngx_http_complex_value_t,
) -> Result<(), String> {
    let Some(literal) = literal_of(name) else {
        return Ok(());
    };
    // SAFETY: `cf` is the live configuration of the directive being read.
    let (mcf, at) = unsafe { (main_conf(&*cf)?, ConfPosition::of(&*cf)) };
    mcf.literal_names.push((text(literal).into_owned(), at));
    Ok(())
}

/// A directive's quota name: a complex value; a literal one must be a
/// valid quota name.
fn compile_name(
    cf: *mut ngx_conf_t,
    arg: &[u8],
) -> Result<*const ngx_http_complex_value_t, String> {
    let name = compile(cf, arg, "quota name")?;
    if is_literal(name) {
        let literal = std::str::from_utf8(arg).unwrap_or("");
        validate_name(literal)
            .map_err(|e| format!("invalid quota name \"{}\": {}", text(arg), e.message))?;
    }
    Ok(name)
}

/// A `weight=` value: a number, or a value with variables read per
/// request (an empty one rejected unless `empty=` says otherwise).
fn compile_weight(cf: *mut ngx_conf_t, value: &[u8]) -> Result<Weight, String> {
    if value.contains(&b'$') {
        return Ok(Weight::Value {
            value: compile(cf, value, "weight")?,
            empty: EmptyWeight::Reject,
        });
    }
    parse_weight(value)
        .map(Weight::Fixed)
        .map_err(|why| format!("invalid weight \"{}\": {why}", text(value)))
}

/// A `key=` value, which must not be empty.
fn compile_key(
    cf: *mut ngx_conf_t,
    value: &[u8],
) -> Result<*const ngx_http_complex_value_t, String> {
    if value.is_empty() {
        return Err("\"key=\" needs a value, e.g. key=$http_x_api_token".into());
    }
    compile(cf, value, "key")
}

directive_handler!(
    /// `sluice_charge <name> [key=<v>] weight=<v> [if=<v>] [settle];` —
    /// counts a weight known only after the response, in the log phase
    /// (see `charge.rs`).
    set_charge,
    |cf, lcf: &mut LocConf, args| {
        // SAFETY: `cf` is the live configuration.
        main_conf(unsafe { &*cf })?.used = true;
        // The name and up to four parameters, as for "sluice".
        if args.len() > 6 {
            return Err("invalid number of arguments in \"sluice_charge\" directive".into());
        }
        if lcf.charges.as_ref().map_or(0, Vec::len) == MAX_CHECKS {
            return Err(format!(
                "too many \"sluice_charge\" directives at one level (at most {MAX_CHECKS})"
            ));
        }
        let name = compile_name(cf, args[1])?;
        note_literal_name(cf, name)?;
        let mut weight = None;
        let mut key = None;
        let mut condition = None;
        let mut settle = false;
        for arg in &args[2..] {
            if let Some(value) = arg.strip_prefix(b"weight=") {
                param_once(&mut weight, compile_weight(cf, value)?, arg)?;
            } else if let Some(value) = arg.strip_prefix(b"key=") {
                param_once(&mut key, compile_key(cf, value)?, arg)?;
            } else if let Some(value) = arg.strip_prefix(b"if=") {
                if value.is_empty() {
                    return Err("\"if=\" needs a value, e.g. if=$failed_login".into());
                }
                param_once(&mut condition, compile(cf, value, "condition")?, arg)?;
            } else if *arg == b"settle" {
                if settle {
                    return Err("duplicate parameter \"settle\"".into());
                }
                settle = true;
            } else {
                return Err(format!("invalid parameter \"{}\"", text(arg)));
            }
        }
        let weight = weight.ok_or(
            "\"sluice_charge\" needs \"weight=\", e.g. weight=$bytes_sent",
        )?;
        lcf.charges.get_or_insert_with(Vec::new).push(ChargeConf {
            name,
            key,
            weight,
            condition,
            settle,
        });
        Ok(())
    }
);

directive_handler!(
    /// `sluice_keys <size>;` — zone memory for keys of per-key quotas.
    set_keys,
    |cf, mcf: &mut MainConf, args| {
        let size = parse_size(args[1])
            .filter(|&s| s <= MAX_KEYS_SIZE)
            .ok_or_else(|| {
                format!(
                    "invalid size \"{}\": must be a size up to {}g (0 for no keys)",
                    text(args[1]),
                    MAX_KEYS_SIZE >> 30
                )
            })?;
        once(&mut mcf.keys_size, size, &args)
    }
);

directive_handler!(
    /// `sluice_overrides <size>;` — zone memory for overrides of per-key
    /// templates and penalties.
    set_overrides,
    |cf, mcf: &mut MainConf, args| {
        let size = parse_size(args[1])
            .filter(|&s| s <= MAX_OVERRIDES_SIZE)
            .ok_or_else(|| {
                format!(
                    "invalid size \"{}\": must be a size up to {}g (0 for no overrides \
                     or penalties)",
                    text(args[1]),
                    MAX_OVERRIDES_SIZE >> 30
                )
            })?;
        once(&mut mcf.overrides_size, size, &args)
    }
);

directive_handler!(
    /// `sluice_key_overflow shared|reject|pass;` — what a check does with a
    /// key that finds no entry in a key section full of live keys.
    set_key_overflow,
    |cf, mcf: &mut MainConf, args| {
        let mode = crate::table::KeyOverflow::parse(&text(args[1])).ok_or_else(|| {
            format!(
                "invalid value \"{}\": must be \"shared\", \"reject\" or \"pass\"",
                text(args[1])
            )
        })?;
        once(&mut mcf.key_overflow, mode, &args)
    }
);

directive_handler!(
    /// `sluice_key_secret_file <path>;`
    set_key_secret_file,
    |cf, mcf: &mut MainConf, args| {
        let path = full_path(cf, args[1])?;
        let contents =
            std::fs::read(&path).map_err(|e| format!("cannot read key secret file \"{path}\": {e}"))?;
        let secret = KeySecret::from_file_contents(&contents)
            .map_err(|why| format!("key secret file \"{path}\" {why}"))?;
        once(&mut mcf.key_secret, secret, &args)
    }
);

directive_handler!(
    /// `sluice_status <code>;` (400..599)
    set_status,
    |cf, lcf: &mut LocConf, args| {
        match super::args::parse_u64(args[1]) {
            Some(code @ 400..=599) => once(&mut lcf.status, code as ngx_uint_t, &args),
            _ => Err(format!(
                "invalid status \"{}\": must be between 400 and 599",
                text(args[1])
            )),
        }
    }
);

/// `on` or `off`, in nginx's words when it is neither.
fn flag(args: &[&[u8]], i: usize) -> Result<bool, String> {
    parse_flag(args[i]).ok_or_else(|| {
        format!(
            "invalid value \"{}\" in \"{}\" directive, it must be \"on\" or \"off\"",
            text(args[i]),
            text(args[0])
        )
    })
}

directive_handler!(
    /// `sluice_deny_status <code>;` (400..599): the status of a request
    /// whose key an override denies.
    set_deny_status,
    |cf, lcf: &mut LocConf, args| {
        match super::args::parse_u64(args[1]) {
            Some(code @ 400..=599) => once(&mut lcf.deny_status, code as ngx_uint_t, &args),
            _ => Err(format!(
                "invalid status \"{}\": must be between 400 and 599",
                text(args[1])
            )),
        }
    }
);

directive_handler!(
    /// `sluice_dry_run on|off;`
    set_dry_run,
    |cf, lcf: &mut LocConf, args| {
        let on = flag(&args, 1)?;
        once(&mut lcf.dry_run, on, &args)
    }
);

directive_handler!(
    /// `sluice_headers on|off [names=on|hash|off];`
    set_headers,
    |cf, lcf: &mut LocConf, args| {
        let on = flag(&args, 1)?;
        let mut names = None;
        for arg in &args[2..] {
            let value = arg
                .strip_prefix(b"names=")
                .ok_or_else(|| format!("invalid parameter \"{}\"", text(arg)))?;
            let parsed = PolicyNames::parse(value).ok_or_else(|| {
                format!(
                    "invalid value \"{}\": names= must be \"on\", \"hash\" or \"off\"",
                    text(arg)
                )
            })?;
            param_once(&mut names, parsed, arg)?;
        }
        if names.is_some() && !on {
            return Err("\"names=\" needs \"sluice_headers on\"".into());
        }
        once(&mut lcf.headers, on, &args)?;
        lcf.header_names = names.unwrap_or_default();
        Ok(())
    }
);

/// An nginx log level named as `error_log` names it (the levels sluice
/// logs requests at).
fn parse_log_level(arg: &[u8]) -> Result<ngx_uint_t, String> {
    let level = match arg {
        b"info" => NGX_LOG_INFO,
        b"notice" => NGX_LOG_NOTICE,
        b"warn" => NGX_LOG_WARN,
        b"error" => NGX_LOG_ERR,
        other => {
            return Err(format!(
                "invalid value \"{}\": must be \"info\", \"notice\", \"warn\" or \"error\"",
                text(other)
            ))
        }
    };
    Ok(level as ngx_uint_t)
}

directive_handler!(
    /// `sluice_log_level info|notice|warn|error;`
    set_log_level,
    |cf, lcf: &mut LocConf, args| {
        let level = parse_log_level(args[1])?;
        once(&mut lcf.log_level, level, &args)
    }
);

directive_handler!(
    /// `sluice_unknown_log off|info|notice|warn|error;` — the level a check
    /// of a name no quota has is logged at (rate-limited per name).
    set_unknown_log,
    |cf, lcf: &mut LocConf, args| {
        let level = match args[1] {
            b"off" => None,
            level => Some(parse_log_level(level).map_err(|_| {
                format!(
                    "invalid value \"{}\": must be \"off\", \"info\", \"notice\", \"warn\" \
                     or \"error\"",
                    text(level)
                )
            })?),
        };
        once(&mut lcf.unknown_log, level, &args)
    }
);

directive_handler!(
    /// `sluice_wait_coalesce <time>;` (0 is off)
    set_wait_coalesce,
    |cf, lcf: &mut LocConf, args| {
        let ms = parse_wait_coalesce(args[1])
            .map_err(|why| format!("invalid value \"{}\": {why}", text(args[1])))?;
        once(&mut lcf.wait_coalesce, ms, &args)
    }
);

directive_handler!(
    /// `sluice_wait_max <n>;` — at most `n` requests held by `wait=` at
    /// once under this directive, across every worker (the locations that
    /// inherit it share them); beyond, a request is rejected at once.
    /// Without it, the default cap ([`WaitMax::default_for`]).
    set_wait_max,
    |cf, lcf: &mut LocConf, args| {
        let max = std::str::from_utf8(args[1])
            .ok()
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse::<u32>().ok())
            .filter(|&n| n <= MAX_WAIT_MAX)
            .ok_or_else(|| {
                format!(
                    "invalid value \"{}\": must be a number of requests from 0 to \
                     {MAX_WAIT_MAX}",
                    text(args[1])
                )
            })?;
        // SAFETY: nginx passes the live configuration.
        let mcf = main_conf(unsafe { &*cf })?;
        // The last slot is the default cap's.
        if mcf.wait_max_slots >= DEFAULT_WAIT_MAX_SLOT {
            return Err(format!(
                "at most {DEFAULT_WAIT_MAX_SLOT} \"sluice_wait_max\" directives in one \
                 configuration"
            ));
        }
        let slot = mcf.wait_max_slots;
        mcf.wait_max_slots += 1;
        once(&mut lcf.wait_max, WaitMax { max, slot }, &args)
    }
);

directive_handler!(
    /// `sluice_metrics [top=<n>];` — this location serves the metrics.
    set_metrics,
    |cf, lcf: &mut LocConf, args| {
        let mut top = DEFAULT_METRICS_TOP;
        for arg in &args[1..] {
            let n = arg
                .strip_prefix(b"top=")
                .ok_or_else(|| format!("invalid parameter \"{}\"", text(arg)))?;
            top = super::args::parse_u64(n)
                .filter(|&n| n <= 100_000)
                .ok_or_else(|| format!("invalid value \"{}\": top must be 0 to 100000", text(arg)))?
                as usize;
        }
        once(&mut lcf.metrics, MetricsConf { top }, &args)?;
        // SAFETY: `cf` is the live configuration.
        main_conf(unsafe { &*cf })?.used = true;
        super::metrics::install(cf)
    }
);
