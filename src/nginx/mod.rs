//! The nginx module `ngx_http_sluice_module` (cargo feature `nginx`).
//!
//! Built as a dynamic module against the nginx tree the Makefile configures
//! (`make module`) and loaded with
//!
//! ```nginx
//! load_module modules/ngx_http_sluice_module.so;
//! ```
//!
//! For now the module only registers itself with an (empty) `http`-level
//! configuration. The directives, the access-phase check, the shared zone
//! and the sync thread are added on top of this skeleton.
//!
//! Everything nginx sees is here: the module context (which configuration
//! structures exist and which hooks run), the directive table, the
//! `ngx_module_t` itself and the `ngx_modules` list that makes the `.so`
//! loadable.

use core::ffi::c_void;
use core::ptr::{addr_of, addr_of_mut};

use ngx::ffi::{ngx_command_t, ngx_http_module_t, ngx_module_t, NGX_HTTP_MODULE};
use ngx::http::{HttpModule, HttpModuleMainConf};

/// The module's `http`-level configuration, one per `http {}` block.
///
/// Empty until the directives exist; the root list, the zone and the sync
/// interval will live here.
#[derive(Debug, Default)]
pub(crate) struct MainConf {}

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
}

// SAFETY: `MainConf` is the type `create_main_conf` (the trait's default,
// installed in the context below) allocates for this module.
unsafe impl HttpModuleMainConf for Module {
    type MainConf = MainConf;
}

/// Which configuration structures the module has and which configuration
/// hooks nginx calls. `postconfiguration` is a no-op for now; it is where
/// the access-phase handler will be installed.
static NGX_HTTP_SLUICE_MODULE_CTX: ngx_http_module_t = ngx_http_module_t {
    preconfiguration: None,
    postconfiguration: Some(Module::postconfiguration),
    create_main_conf: Some(Module::create_main_conf),
    init_main_conf: Some(Module::init_main_conf),
    create_srv_conf: None,
    merge_srv_conf: None,
    create_loc_conf: None,
    merge_loc_conf: None,
};

/// The module's directives, terminated by the empty command nginx expects.
///
/// `static mut` because nginx takes `*mut ngx_command_t`; nothing writes
/// to it.
static mut NGX_HTTP_SLUICE_COMMANDS: [ngx_command_t; 1] = [ngx_command_t::empty()];

/// The module nginx loads. nginx finds it through `ngx_modules` below and
/// owns it from then on (it writes the module's indices while loading).
#[used]
#[allow(non_upper_case_globals)]
pub(crate) static mut ngx_http_sluice_module: ngx_module_t = ngx_module_t {
    ctx: addr_of!(NGX_HTTP_SLUICE_MODULE_CTX) as *mut c_void,
    commands: addr_of_mut!(NGX_HTTP_SLUICE_COMMANDS) as *mut ngx_command_t,
    type_: NGX_HTTP_MODULE as usize,
    ..ngx_module_t::default()
};

// Exports `ngx_modules`, `ngx_module_names` and `ngx_module_order`: the
// symbols `load_module` looks up in a dynamic module.
ngx::ngx_modules!(ngx_http_sluice_module);
