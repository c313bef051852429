# The gpuhealth image: /gpuhealth (agent, device plugin, extender, breaker controller, CLI) and
# /gpuhealth-agent (the agent alone, smaller in memory, which the chart's DaemonSet runs) on a
# minimal glibc runtime: the binaries plus exactly the glibc files they link, nothing else.
#
# Anywhere with docker or podman and network:
#   docker build -t gpuhealth/gpuhealth:0.1.0 --build-arg VERSION=0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 ...   (arm64 is cross-compiled)
# Offline, as `make image` does: hack/image.sh stages each architecture's root filesystem under
# bin/image/ and builds with --build-arg BUILD=prebuilt, which pulls nothing.
#
# Build arguments:
#   BUILD          source (default: compile in GO_IMAGE) or prebuilt (take bin/image/rootfs-<arch>)
#   GO_IMAGE       the Go toolchain image of the source stage (Debian-based)
#   RUNTIME_IMAGE  the base of the final image: scratch (default, distroless-style: the rootfs
#                  brings its own glibc) or any glibc base image you prefer
#   VERSION        the version `gpuhealth version` prints and the image is labelled with
#   LICENSE        the SPDX licence label (NOASSERTION until the project states its licence)
ARG BUILD=source
ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=scratch

FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS source
ARG TARGETARCH
ARG VERSION=dev
RUN if [ "$TARGETARCH" = arm64 ] && [ "$(dpkg --print-architecture)" != arm64 ]; then \
      apt-get update && apt-get install -y --no-install-recommends gcc-aarch64-linux-gnu libc6-dev-arm64-cross binutils; \
    elif [ "$TARGETARCH" = amd64 ] && [ "$(dpkg --print-architecture)" != amd64 ]; then \
      apt-get update && apt-get install -y --no-install-recommends gcc-x86-64-linux-gnu libc6-dev-amd64-cross binutils; \
    fi
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN hack/image-rootfs.sh "$TARGETARCH" /rootfs "$VERSION"

FROM scratch AS prebuilt
ARG TARGETARCH
COPY bin/image/rootfs-${TARGETARCH}/ /rootfs/

FROM ${BUILD} AS rootfs

FROM ${RUNTIME_IMAGE}
ARG VERSION=dev
ARG LICENSE=NOASSERTION
LABEL org.opencontainers.image.title="gpuhealth" \
      org.opencontainers.image.description="Keeps Kubernetes from putting work on broken GPUs: per-GPU health, recovery, every scheduler path" \
      org.opencontainers.image.source="https://github.com/gpuhealth/gpuhealth" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="${LICENSE}"
COPY --from=rootfs /rootfs/ /
ENTRYPOINT ["/gpuhealth"]
