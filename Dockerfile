# syntax=docker/dockerfile:1
#
# sluice image: our nginx 1.28 with the sluice module, and the `sluice`
# binary (quota root and CLI). Built with the same Makefile as everywhere
# else. Not built or run on the development machines (they have no Docker
# engine); tests/packaging.py (make test) checks that this file, the
# Makefile and deploy/docker-compose.yml agree.
#
#   docker build -t sluice .
#   docker run --rm -p 8080:8080 sluice                 # nginx, standalone quotas
#   docker run --rm -p 7070:7070 -v sluice:/data sluice \
#       sluice root --listen 0.0.0.0:7070 --db sqlite:///data/sluice.db \
#       --admin-token-file /data/admin.token
#   docker run --rm sluice sluice --help                # the binary
#
# A fleet (two nginx, two roots, PostgreSQL): deploy/docker-compose.yml.

# --- build ------------------------------------------------------------------
FROM debian:bookworm AS build

ARG RUST_VERSION=1.95.0
ENV DEBIAN_FRONTEND=noninteractive \
    CARGO_TERM_COLOR=never \
    PATH=/root/.cargo/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl make \
 && rm -rf /var/lib/apt/lists/*

# Debian's own Rust is too old for the crate; rustup installs a pinned one.
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain "$RUST_VERSION"

# The Makefile's nginx: the same nginx-src crate version and the same
# configure flags (the Makefile's NGINX_CONFIGURE_ARGS less --prefix and
# --builddir). The build passes the version to make and checks the flags
# in `nginx -V`; tests/packaging.py checks both against the Makefile.
ARG NGINX_SRC_CRATE_VERSION=1.28.5+1.28.3
ARG NGINX_CONFIGURE_FLAGS="--with-compat --with-threads --with-http_ssl_module --with-http_realip_module --with-http_v2_module --with-stream"

WORKDIR /src
COPY Makefile ./
RUN make deps-build

COPY . .
# nginx is configured with its final prefix, so the runtime image needs no
# -p: NGINX_PREFIX moves the nginx install and the module together.
RUN --mount=type=cache,target=/root/.cargo/registry \
    make NGINX_PREFIX=/opt/sluice/nginx NGINX_SRC_CRATE_VERSION="$NGINX_SRC_CRATE_VERSION" \
        nginx module bin \
 && nginx_v=$(/opt/sluice/nginx/sbin/nginx -V 2>&1) \
 && for flag in $NGINX_CONFIGURE_FLAGS; do \
        case "$nginx_v" in *" $flag"*) ;; *) echo "nginx lacks $flag: $nginx_v" >&2; exit 1;; esac; \
    done \
 && case "$nginx_v" in *"nginx/${NGINX_SRC_CRATE_VERSION#*+}"*) ;; \
        *) echo "nginx is not ${NGINX_SRC_CRATE_VERSION#*+}: $nginx_v" >&2; exit 1;; esac \
 && install -D -m 0755 target/release/sluice /opt/sluice/bin/sluice \
 && install -D -m 0644 nginx-conf/docker.conf /opt/sluice/nginx/conf/sluice.conf \
 && install -D -m 0644 nginx-conf/standalone-quotas.json /opt/sluice/nginx/conf/quotas.json

# --- runtime ----------------------------------------------------------------
FROM debian:bookworm-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libpcre2-8-0 libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/*

COPY --from=build /opt/sluice /opt/sluice
RUN ln -s /opt/sluice/bin/sluice /usr/local/bin/sluice \
 && ln -s /opt/sluice/nginx/sbin/nginx /usr/local/bin/nginx \
 && /opt/sluice/nginx/sbin/nginx -t -c /opt/sluice/nginx/conf/sluice.conf

EXPOSE 8080 7070
STOPSIGNAL SIGQUIT
CMD ["nginx", "-c", "/opt/sluice/nginx/conf/sluice.conf"]
