# infergate in a container: built from source in a Rust image, run as a
# non-root user in a small Debian image.
#
#   docker build -t infergate .
#   docker run --rm -p 8080:8080 -p 9464:9464 \
#     -v $PWD/gateway.yaml:/etc/infergate/config.yaml:ro infergate
#
# The config's listeners must bind 0.0.0.0 (not 127.0.0.1) to be reachable
# from outside the container, and such a listener needs `spec.auth` (API
# keys, JWT, or `auth: {mode: none}` behind an authenticating proxy;
# docs/security.md). Without a mounted config, run
# `docker run --rm -p 8080:8080 -p 9464:9464 infergate serve
#  --listen 0.0.0.0:8080 --admin-listen 0.0.0.0:9464` for the demo fleet.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p infergate \
 && cp target/release/infergate /infergate

FROM debian:bookworm-slim
# The system trust store, for https:// replicas without a tls.caFile.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin infergate
COPY --from=build /infergate /usr/local/bin/infergate
USER 10001
# Public listener and admin listener (metrics, probes, /debug/pools).
EXPOSE 8080 9464
# SIGTERM drains in-flight requests (spec.shutdown.drainTimeout); give
# `docker stop` at least that long with --stop-timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/infergate"]
CMD ["serve", "--config", "/etc/infergate/config.yaml"]
