# peer-pod-config-ctrl: PeerPodConfig controller: CAA DaemonSet, peer-pods webhook, node capacity.
# Build context: target/images/context/peer-pod-config-ctrl, laid out by deploy/images/stage.sh (`make docker-build`).
FROM scratch
COPY rootfs/ /
LABEL org.opencontainers.image.title="peer-pod-config-ctrl" \
      org.opencontainers.image.description="PeerPodConfig controller: CAA DaemonSet, peer-pods webhook, node capacity" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root (the chart's securityContext runs it as 65532 with a read-only root filesystem too).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/peer-pod-config-ctrl"]
