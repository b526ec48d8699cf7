# syntax=docker/dockerfile:1
#
# The packsync image: one static binary at /packsync in an otherwise empty
# (FROM scratch) image.
#
#   docker build -t packsync-image .
#   docker run --rm packsync-image --help
#
# It is meant to be copied into other images (pack images, StackStorm images,
# CI images) with one line:
#
#   COPY --from=packsync-image /packsync /usr/local/bin/packsync
#
# The binary targets musl, so it is statically linked and runs on any Linux of
# the same architecture. The build stage runs on the target platform, so
# `docker buildx build --platform linux/amd64,linux/arm64` makes one image per
# architecture.

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
RUN set -eu; \
    target="$(uname -m)-unknown-linux-musl"; \
    rustup target add "$target"; \
    cargo build --release --locked --target "$target"; \
    cp "target/$target/release/packsync" /packsync; \
    if readelf -l /packsync | grep -q 'program interpreter'; then \
        echo "packsync is not statically linked" >&2; exit 1; \
    fi; \
    /packsync --help >/dev/null

FROM scratch
COPY --from=build /packsync /packsync
ENTRYPOINT ["/packsync"]
