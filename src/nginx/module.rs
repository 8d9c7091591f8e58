//! What nginx sees: the module context (configuration structures and
//! hooks, the merge that gives a location the default cap on holds), the
//! directive table, `init_module` (the default cap's number, once
//! `worker_connections` is read), `init_process` / `exit_process`, the
//! `ngx_module_t` and the `ngx_modules` export.

use core::ffi::{c_char, c_void};
use core::ptr::{addr_of, addr_of_mut};

use ngx::ffi::{
    ngx_command_t, ngx_conf_t, ngx_cycle_t, ngx_http_add_variable, ngx_http_module_t,
    ngx_http_phases_NGX_HTTP_ACCESS_PHASE, ngx_http_request_t, ngx_http_variable_value_t,
    ngx_int_t, ngx_module_t, ngx_str_t, ngx_uint_t, NGX_CONF_1MORE, NGX_CONF_NOARGS,
    NGX_CONF_TAKE1, NGX_CONF_TAKE12, NGX_ERROR, NGX_HTTP_LOC_CONF, NGX_HTTP_LOC_CONF_OFFSET,
    NGX_HTTP_MAIN_CONF, NGX_HTTP_MAIN_CONF_OFFSET, NGX_HTTP_MODULE, NGX_HTTP_SRV_CONF,
    NGX_HTTP_VAR_NOCACHEABLE, NGX_LOG_WARN, NGX_OK,
};
use ngx::http::{HttpModule, HttpModuleLocationConf, HttpModuleMainConf, Merge};

use super::conf::{LocConf, MainConf, WaitMax, DEFAULT_WAIT_MAX_SLOT};
use super::directives;
use super::util::{conf_boundary, conf_boundary_at, runtime_boundary, ConfPosition};
use super::{charge, handler, in_flight, request_state, util, worker, zone};

/// Type through which the `ngx` crate reaches this module's configuration
/// and provides the configuration callbacks.
pub(crate) struct Module;

impl HttpModule for Module {
    fn module() -> &'static ngx_module_t {
        // SAFETY: nginx writes to the module structure (its `index` and
        // `ctx_index`) only while loading modules and starting a
        // configuration, in a single thread and never while a callback of
        // this module holds the reference returned here.
        unsafe { &*addr_of!(ngx_http_sluice_module) }
    }

    unsafe extern "C" fn preconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        let ok = conf_boundary(cf, || add_variables(cf));
        status_of(ok)
    }

    unsafe extern "C" fn postconfiguration(cf: *mut ngx_conf_t) -> ngx_int_t {
        let ok = conf_boundary(cf, || {
            install_access_handler(cf)?;
            // Charges first among the log handlers (`charge.rs`), so the
            // access log sees `$sluice_charge_status`; in-flight slots go
            // back in the log phase too (`in_flight.rs`), whether or not
            // anything was charged.
            charge::install(cf)?;
            in_flight::install_log_handler(cf)
        });
        status_of(ok)
    }

    unsafe extern "C" fn init_main_conf(cf: *mut ngx_conf_t, conf: *mut c_void) -> *mut c_char {
        conf_boundary_at(cf, || {
            // SAFETY: nginx passes our MainConf, created by create_main_conf.
            let mcf = unsafe { &mut *conf.cast::<MainConf>() };
            finish_main_conf(cf, mcf)
        })
    }

    /// Merges a level's location configuration into the next. Where no
    /// level gave `sluice_wait_max`, the location takes the default cap,
    /// whose number `init_module` sets once `worker_connections` is known.
    ///
    /// # Safety
    /// `cf` is the live configuration; `prev` and `conf` are distinct
    /// `LocConf`s this module created (`create_loc_conf`).
    unsafe extern "C" fn merge_loc_conf(
        cf: *mut ngx_conf_t,
        prev: *mut c_void,
        conf: *mut c_void,
    ) -> *mut c_char {
        let lcf_ptr = conf.cast::<LocConf>();
        // SAFETY: per the contract; nginx merges in one thread.
        let (prev, lcf) = unsafe { (&*prev.cast::<LocConf>(), &mut *lcf_ptr) };
        conf_boundary(cf, || {
            lcf.merge(prev)
                .map_err(|e| format!("sluice: cannot merge the configuration: {e}"))?;
            if lcf
                .wait_max
                .is_none_or(|cap| cap.slot == DEFAULT_WAIT_MAX_SLOT)
            {
                // The number is set by `init_module`; until then, from
                // nginx's own default of connections.
                lcf.wait_max = Some(WaitMax::default_for(NGINX_DEFAULT_CONNECTIONS));
                // SAFETY: `cf` is the live configuration.
                let mcf = Module::main_conf_mut(unsafe { &*cf })
                    .ok_or("sluice: no http configuration")?;
                mcf.default_caps.push(lcf_ptr);
            }
            Ok(())
        })
    }
}

/// nginx's `worker_connections` when none is given (`DEFAULT_CONNECTIONS`).
const NGINX_DEFAULT_CONNECTIONS: usize = 512;

/// `init_module`: runs once the whole configuration is read (in the
/// master, before the workers start; again for each reload's
/// configuration): sets the default cap on holds from one worker's
/// `worker_connections`.
unsafe extern "C" fn init_module(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: nginx passes the new cycle.
    let log_to = unsafe { (*cycle).log };
    runtime_boundary(log_to, "init_module", NGX_ERROR as ngx_int_t, || {
        // SAFETY: as above; nginx is single-threaded here.
        let cycle = unsafe { &*cycle };
        let Some(mcf) = Module::main_conf(cycle) else {
            return NGX_OK as ngx_int_t;
        };
        let cap = WaitMax::default_for(cycle.connection_n);
        for &lcf in &mcf.default_caps {
            // SAFETY: a location configuration of this cycle (its pool
            // lives as long as the cycle), recorded by `merge_loc_conf`;
            // nothing else reads or writes it now.
            unsafe { (*lcf).wait_max = Some(cap) };
        }
        NGX_OK as ngx_int_t
    })
}

// SAFETY: `MainConf` is the type `create_main_conf` (the trait's default,
// installed in the context below) allocates for this module.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}

// SAFETY: `LocConf` is the type `create_loc_conf` allocates.
unsafe impl HttpModuleLocationConf for Module {
    type LocationConf = LocConf;
}

/// nginx's status for a configuration step that returned `conf_boundary`'s
/// verdict.
fn status_of(verdict: *mut c_char) -> ngx_int_t {
    if verdict.is_null() {
        NGX_OK as ngx_int_t
    } else {
        NGX_ERROR as ngx_int_t
    }
}

fn add_variables(cf: *mut ngx_conf_t) -> Result<(), String> {
    add_variable(cf, c"sluice_status", request_state::status_variable)?;
    add_variable(cf, c"sluice_charge_status", charge::charge_status_variable)
}

/// Adds the variable `$name`, read by `get` on every use (not cached).
fn add_variable(
    cf: *mut ngx_conf_t,
    name: &'static core::ffi::CStr,
    get: unsafe extern "C" fn(
        *mut ngx_http_request_t,
        *mut ngx_http_variable_value_t,
        usize,
    ) -> ngx_int_t,
) -> Result<(), String> {
    let mut var_name = ngx_str_t {
        len: name.count_bytes(),
        data: name.as_ptr().cast_mut().cast(),
    };
    // SAFETY: `cf` is the live configuration; nginx copies the name.
    let var =
        unsafe { ngx_http_add_variable(cf, &mut var_name, NGX_HTTP_VAR_NOCACHEABLE as ngx_uint_t) };
    if var.is_null() {
        return Err(format!(
            "sluice: cannot add the ${} variable",
            name.to_string_lossy()
        ));
    }
    // SAFETY: nginx returned a live variable of this configuration.
    unsafe { (*var).get_handler = Some(get) };
    Ok(())
}

fn install_access_handler(cf: *mut ngx_conf_t) -> Result<(), String> {
    util::add_phase_handler(
        cf,
        ngx_http_phases_NGX_HTTP_ACCESS_PHASE,
        handler::access_handler,
    )
}

/// Checks what only the whole `http` block shows, and asks for the zone
/// when anything uses sluice. An error about root groups names the
/// `sluice_root` line of the highest group; the others the end of the
/// block.
fn finish_main_conf(
    cf: *mut ngx_conf_t,
    mcf: &mut MainConf,
) -> Result<(), (String, Option<ConfPosition>)> {
    if let Some(timeout) = mcf.sync_timeout_ms {
        let interval = mcf.interval().as_millis() as u64;
        if timeout >= interval {
            return Err((
                format!(
                    "\"sluice_sync_timeout\" ({timeout}ms) must be shorter than \
                     \"sluice_sync_interval\" ({interval}ms)"
                ),
                None,
            ));
        }
    }
    // Each directive was checked on its own line; this is the whole set by
    // the rules the C ABI and the simulator use (a host name that is not a
    // valid id is replaced by "limiter" before this).
    mcf.sync_config().validate().map_err(|e| {
        let at = (e.field == "root_groups")
            .then(|| mcf.group_lines.iter().max_by_key(|(g, _)| *g))
            .flatten()
            .map(|(_, at)| at.clone());
        (format!("sluice: invalid sync configuration: {e}"), at)
    })?;
    check_literal_names(cf, mcf)?;
    if mcf.used {
        zone::add(cf, mcf).map_err(|message| (message, None))?;
    }
    Ok(())
}

/// Catches a misspelled quota name before a request does: a literal name
/// of a `sluice` or `sluice_charge` directive that no quota of
/// `sluice_quotas` has is an error at its line when there are no roots
/// (nothing else could define it: its checks would pass uncounted), and a
/// warning with roots (their quotas may have it).
fn check_literal_names(
    cf: *mut ngx_conf_t,
    mcf: &MainConf,
) -> Result<(), (String, Option<ConfPosition>)> {
    let Some(file) = &mcf.quotas else {
        return Ok(());
    };
    let mut warned: Vec<&str> = Vec::new();
    for (name, at) in &mcf.literal_names {
        if file.set.quotas.iter().any(|q| q.name == *name) || warned.contains(&name.as_str()) {
            continue;
        }
        let missing = format!("no quota is named \"{name}\" in \"{}\"", file.path);
        if mcf.roots.is_empty() {
            return Err((
                format!(
                    "{missing}: without sluice_root nothing else defines it, and its checks \
                     would pass uncounted"
                ),
                Some(at.clone()),
            ));
        }
        util::conf_log_at(
            cf,
            NGX_LOG_WARN as ngx_uint_t,
            at,
            &format!("{missing}: its checks pass uncounted unless a root has it"),
        );
        warned.push(name);
    }
    Ok(())
}

unsafe extern "C" fn init_process(cycle: *mut ngx_cycle_t) -> ngx_int_t {
    // SAFETY: nginx passes the worker's cycle.
    let log_to = unsafe { (*cycle).log };
    runtime_boundary(log_to, "init_process", NGX_OK as ngx_int_t, || {
        // SAFETY: as above; used from this thread only.
        match worker::start(unsafe { &mut *cycle }) {
            Ok(()) => NGX_OK as ngx_int_t,
            Err(message) => {
                // Limiting still works without the thread (with stale
                // cluster levels); the worker keeps serving.
                // SAFETY: the cycle's log.
                unsafe {
                    util::log(
                        ngx::ffi::NGX_LOG_ALERT as ngx_uint_t,
                        log_to,
                        format_args!("{message}"),
                    )
                };
                NGX_OK as ngx_int_t
            }
        }
    })
}

unsafe extern "C" fn exit_process(cycle: *mut ngx_cycle_t) {
    // SAFETY: nginx passes the worker's cycle.
    let log_to = unsafe { (*cycle).log };
    runtime_boundary(log_to, "exit_process", (), worker::stop);
}

/// Which configuration structures the module has and which configuration
/// hooks nginx calls.
static NGX_HTTP_SLUICE_MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: Some(Module::preconfiguration),
    postconfiguration: Some(Module::postconfiguration),
    create_main_conf: Some(Module::create_main_conf),
    init_main_conf: Some(Module::init_main_conf),
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: Some(Module::create_loc_conf),
    merge_loc_conf: Some(Module::merge_loc_conf),
};

/// A directive entry.
const fn directive(
    name: &'static core::ffi::CStr,
    type_: u32,
    set: unsafe extern "C" fn(*mut ngx_conf_t, *mut ngx_command_t, *mut c_void) -> *mut c_char,
    conf: usize,
) -> ngx_command_t {
    ngx_command_t {
        // nginx compares names with strcmp: they must end in NUL.
        name: ngx_str_t {
            len: name.count_bytes(),
            data: name.as_ptr().cast_mut().cast(),
        },
        type_: type_ as ngx_uint_t,
        set: Some(set),
        conf,
        offset: 0,
        post: core::ptr::null_mut(),
    }
}

const HTTP: u32 = NGX_HTTP_MAIN_CONF;
const ANY_LEVEL: u32 = NGX_HTTP_MAIN_CONF | NGX_HTTP_SRV_CONF | NGX_HTTP_LOC_CONF;
const MAIN: usize = NGX_HTTP_MAIN_CONF_OFFSET;
const LOC: usize = NGX_HTTP_LOC_CONF_OFFSET;

/// The module's directives, terminated by the empty command nginx expects.
///
/// `static mut` because nginx takes `*mut ngx_command_t`; nothing writes
/// to it.
static mut NGX_HTTP_SLUICE_COMMANDS: [ngx_command_t; 25] = [
    directive(
        c"sluice_zone",
        HTTP | NGX_CONF_TAKE1,
        directives::set_zone,
        MAIN,
    ),
    directive(
        c"sluice_root",
        HTTP | NGX_CONF_1MORE,
        directives::set_root,
        MAIN,
    ),
    directive(
        c"sluice_quotas",
        HTTP | NGX_CONF_TAKE1,
        directives::set_quotas,
        MAIN,
    ),
    directive(
        c"sluice_sync_interval",
        HTTP | NGX_CONF_TAKE1,
        directives::set_sync_time,
        MAIN,
    ),
    directive(
        c"sluice_sync_timeout",
        HTTP | NGX_CONF_TAKE1,
        directives::set_sync_time,
        MAIN,
    ),
    directive(
        c"sluice_in_flight_lease",
        HTTP | NGX_CONF_TAKE1,
        directives::set_sync_time,
        MAIN,
    ),
    directive(
        c"sluice_sync_token_file",
        HTTP | NGX_CONF_TAKE1,
        directives::set_token_file,
        MAIN,
    ),
    directive(
        c"sluice_host_id",
        HTTP | NGX_CONF_TAKE1,
        directives::set_host_id,
        MAIN,
    ),
    directive(
        c"sluice_sync_early",
        HTTP | NGX_CONF_TAKE12,
        directives::set_early_sync,
        MAIN,
    ),
    directive(
        c"sluice_keys",
        HTTP | NGX_CONF_TAKE1,
        directives::set_keys,
        MAIN,
    ),
    directive(
        c"sluice_overrides",
        HTTP | NGX_CONF_TAKE1,
        directives::set_overrides,
        MAIN,
    ),
    directive(
        c"sluice_key_overflow",
        HTTP | NGX_CONF_TAKE1,
        directives::set_key_overflow,
        MAIN,
    ),
    directive(
        c"sluice_key_secret_file",
        HTTP | NGX_CONF_TAKE1,
        directives::set_key_secret_file,
        MAIN,
    ),
    directive(
        c"sluice",
        ANY_LEVEL | NGX_CONF_1MORE,
        directives::set_check,
        LOC,
    ),
    directive(
        c"sluice_charge",
        ANY_LEVEL | NGX_CONF_1MORE,
        directives::set_charge,
        LOC,
    ),
    directive(
        c"sluice_status",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_status,
        LOC,
    ),
    directive(
        c"sluice_deny_status",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_deny_status,
        LOC,
    ),
    directive(
        c"sluice_dry_run",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_dry_run,
        LOC,
    ),
    directive(
        c"sluice_log_level",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_log_level,
        LOC,
    ),
    directive(
        c"sluice_unknown_log",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_unknown_log,
        LOC,
    ),
    directive(
        c"sluice_headers",
        ANY_LEVEL | NGX_CONF_TAKE12,
        directives::set_headers,
        LOC,
    ),
    directive(
        c"sluice_wait_coalesce",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_wait_coalesce,
        LOC,
    ),
    directive(
        c"sluice_wait_max",
        ANY_LEVEL | NGX_CONF_TAKE1,
        directives::set_wait_max,
        LOC,
    ),
    directive(
        c"sluice_metrics",
        NGX_HTTP_LOC_CONF | NGX_CONF_NOARGS | NGX_CONF_TAKE1,
        directives::set_metrics,
        LOC,
    ),
    ngx_command_t::empty(),
];

/// The module nginx loads. nginx finds it through `ngx_modules` below and
/// owns it from then on (it writes the module's indices while loading).
#[used]
#[allow(non_upper_case_globals)]
pub(crate) static mut ngx_http_sluice_module: ngx_module_t = ngx_module_t {
    ctx: addr_of!(NGX_HTTP_SLUICE_MODULE_CTX) as *mut c_void,
    commands: addr_of_mut!(NGX_HTTP_SLUICE_COMMANDS) as *mut ngx_command_t,
    type_: NGX_HTTP_MODULE as usize,
    init_module: Some(init_module),
    init_process: Some(init_process),
    exit_process: Some(exit_process),
    ..ngx_module_t::default()
};

// Exports `ngx_modules`, `ngx_module_names` and `ngx_module_order`: the
// symbols `load_module` looks up in a dynamic module.
ngx::ngx_modules!(ngx_http_sluice_module);
