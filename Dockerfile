# localdir-csi container image: one image for every mode.
#
# The binary is static (CGO_ENABLED=0). Directory and raw block volumes need
# nothing from the base image: it attaches loop devices and talks to btrfs
# through their ioctls (tests/image runs it on an empty userland). Image
# volumes (StorageClass parameter csi.storage.k8s.io/fstype: ext4 or xfs)
# are formatted, checked and grown by the filesystems' own tools, through
# k8s.io/mount-utils: mkfs.ext4, e2fsck and resize2fs (e2fsprogs),
# mkfs.xfs and xfs_growfs (xfsprogs), blkid and mount (util-linux). A
# distroless/static base has none of them, and re-implementing mkfs would be
# neither small nor safe, so the base is Debian's slim image (the same
# Debian release as the build image's toolchain, security-maintained, about
# 30 MB more with the three packages). The default user is nonroot (65532),
# which the controller keeps; the node DaemonSet runs the container
# privileged as root (securityContext in deploy/).
#
# The build command is the one `make static` runs (tests/image checks that
# binary on an empty userland); keep the two in sync.
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY cmd cmd
COPY pkg pkg
ARG VERSION=devel
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=false \
      -ldflags "-s -w -X github.com/localdir-csi/localdir/pkg/driver.version=${VERSION}" \
      -o /out/localdir-csi ./cmd/localdir-csi

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends e2fsprogs xfsprogs util-linux \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin nonroot
ARG VERSION=devel
LABEL org.opencontainers.image.title="localdir-csi" \
      org.opencontainers.image.description="CSI driver: local directories as Kubernetes volumes, with enforced capacity on btrfs, snapshots and crash-safe state" \
      org.opencontainers.image.source="https://github.com/localdir-csi/localdir" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/localdir-csi /localdir-csi
USER 65532:65532
ENTRYPOINT ["/localdir-csi"]
