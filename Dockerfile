# syntax=docker/dockerfile:1
#
# holdfast: one minimal image with both binaries, statically linked (musl), on `scratch`:
#   /usr/local/bin/holdfast-webhook      (the Deployment holdfast-webhook runs this)
#   /usr/local/bin/holdfast-controller   (the Deployment holdfast-controller runs this)
# plus the CA bundle for HTTPS to registries (reqwest's platform verifier reads SSL_CERT_FILE).
# No shell, no package manager, no libc; runs as UID/GID 65532, matching manifests/.
#
# Build: `make image` (IMAGE=holdfast:dev by default). Needs Docker with BuildKit (the cache
# mounts below). Only the paths the COPY lines name go into the image; BuildKit transfers just
# those from the build context, while a builder that sends the whole directory would also send
# target/ (a .dockerignore listing /target and /.holdfast avoids that).

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-alpine AS build
# musl-dev: ring's C and assembly; ca-certificates: copied into the final image.
RUN apk add --no-cache musl-dev ca-certificates
WORKDIR /src
# Every workspace member must be present for cargo to load the workspace (manifest-checks and
# e2e are not built).
COPY Cargo.toml Cargo.lock rustfmt.toml clippy.toml ./
COPY registry registry
COPY peers peers
COPY pins pins
COPY certs certs
COPY webhook webhook
COPY controller controller
COPY manifest-checks manifest-checks
COPY e2e e2e
# On Alpine the host target is x86_64/aarch64-unknown-linux-musl, which links statically by
# default; the loop refuses a binary that still needs a shared library.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p holdfast-webhook -p holdfast-controller --bins \
 && mkdir -p /out \
 && cp target/release/holdfast-webhook target/release/holdfast-controller /out/ \
 && for bin in /out/*; do \
      if readelf -d "$bin" | grep -q NEEDED; then echo "$bin is not statically linked" >&2; exit 1; fi; \
    done

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/holdfast-webhook /out/holdfast-controller /usr/local/bin/
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
# 8443: admission (TLS); 8080: admin (/healthz, /readyz, /metrics). The controller listens on nothing.
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/holdfast-webhook"]
