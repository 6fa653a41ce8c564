# peerpod-ctrl: Deletes the cloud VMs of deleted PeerPods, stale PeerPods and orphan VMs.
# Build context: target/images/context/peerpod-ctrl, laid out by deploy/images/stage.sh (`make docker-build`).
FROM scratch
COPY rootfs/ /
LABEL org.opencontainers.image.title="peerpod-ctrl" \
      org.opencontainers.image.description="Deletes the cloud VMs of deleted PeerPods, stale PeerPods and orphan VMs" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root (the chart's securityContext runs it as 65532 with a read-only root filesystem too).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/peerpod-ctrl"]
