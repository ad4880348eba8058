# localdir-csi container image: one image for every mode.
#
# The binary is static (CGO_ENABLED=0) and needs nothing from the base image
# at run time: it mounts with mount(2), attaches loop devices with their
# ioctls, talks to btrfs through its ioctls, and execs no helper (no mount(8),
# losetup or btrfs-progs). distroless/static has only CA certificates,
# tzdata and /etc/passwd. The default user is nonroot (65532), which the
# controller keeps; the node DaemonSet runs the container privileged as root
# (securityContext in deploy/).
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

FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=devel
LABEL org.opencontainers.image.title="localdir-csi" \
      org.opencontainers.image.description="CSI driver: local directories as Kubernetes volumes, with enforced capacity on btrfs, snapshots and crash-safe state" \
      org.opencontainers.image.source="https://github.com/localdir-csi/localdir" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/localdir-csi /localdir-csi
USER 65532:65532
ENTRYPOINT ["/localdir-csi"]
