# syntax=docker/dockerfile:1
#
# sluice image: our nginx 1.28 with the sluice module, and the `sluice`
# binary (quota root and CLI). Built with the same Makefile as everywhere
# else. Not tested on the development machines (they have no Docker
# engine).
#
#   docker build -t sluice .
#   docker run --rm -p 8080:8080 sluice                 # nginx, standalone quotas
#   docker run --rm -p 7070:7070 -v sluice:/data sluice \
#       sluice root --listen 0.0.0.0:7070 --db sqlite:///data/sluice.db
#   docker run --rm sluice sluice --help                # the binary

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

WORKDIR /src
COPY Makefile ./
RUN make deps-build

COPY . .
# nginx is configured with its final prefix, so the runtime image needs no
# -p: NGINX_PREFIX moves the nginx install and the module together.
RUN --mount=type=cache,target=/root/.cargo/registry \
    make NGINX_PREFIX=/opt/sluice/nginx nginx module bin \
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
