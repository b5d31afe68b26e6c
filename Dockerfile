# syntax=docker/dockerfile:1.7
#
# kube-discovery container image.
#
#   docker build -t kube-discovery:dev .
#   docker run --rm kube-discovery:dev --help
#
# Stage 1 builds a fully static binary (musl + rustls/ring, no OpenSSL);
# stage 2 is distroless/static: no shell, no package manager, non-root
# (uid/gid 65532), a few MB plus the binary.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS builder
ARG TARGETARCH
WORKDIR /src
# musl-tools: the C compiler ring needs for the static target. The image
# builds natively for TARGETARCH (multi-arch via `docker buildx` + QEMU or
# native runners); the target triple follows TARGETARCH.
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
RUN case "${TARGETARCH:-amd64}" in \
      amd64) echo x86_64-unknown-linux-musl > /target-triple ;; \
      arm64) echo aarch64-unknown-linux-musl > /target-triple ;; \
      *) echo "unsupported TARGETARCH ${TARGETARCH}" >&2; exit 1 ;; \
    esac \
 && rustup target add "$(cat /target-triple)"
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    triple="$(cat /target-triple)" \
 && cargo build --release --locked --no-default-features -p kube-discovery --bin kube-discovery --target "$triple" \
 && install -D -m 0755 "target/$triple/release/kube-discovery" /out/kube-discovery

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="kube-discovery" \
      org.opencontainers.image.description="Kubernetes-native service discovery: Endpoints/EndpointSlices -> DiscoveredService custom resources (APISIX-compatible)" \
      org.opencontainers.image.source="https://github.com/kube-discovery/kube-discovery" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /out/kube-discovery /usr/local/bin/kube-discovery
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kube-discovery"]
CMD ["run", "--config", "/etc/kube-discovery/config.yaml"]
