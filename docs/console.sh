#!/bin/sh
# Makes docs/console.png, the README's picture of the root's console, from
# a real run: t/092-console-figures.t starts a root and an nginx, sends
# them a known load for SLUICE_CONSOLE_SECONDS (default 60, so the charts
# have a minute of history), checks the figures in headless Chromium and
# saves the window with a per-key quota's editor open.
#
#   docs/console.sh            # builds what it needs first (make nginx module bin)
set -eu
cd "$(dirname "$0")/.."
make nginx module bin
export TEST_NGINX_BINARY="$PWD/build/nginx/sbin/nginx"
export TEST_NGINX_SLUICE_MODULE="$PWD/build/nginx/modules/ngx_http_sluice_module.so"
export TEST_NGINX_SLUICE_BIN="$PWD/target/release/sluice"
export SLUICE_CONSOLE_SECONDS="${SLUICE_CONSOLE_SECONDS:-60}"
export SLUICE_CONSOLE_SHOT="$PWD/docs/console.png"
prove -I t/lib t/092-console-figures.t
ls -l docs/console.png
