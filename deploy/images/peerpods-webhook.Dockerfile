# peerpods-webhook: Peer-pods mutating admission webhook: peer pods request kata.peerpods.io/vm, their size goes to annotations.
# Build context: target/images/context/peerpods-webhook, laid out by deploy/images/stage.sh (`make docker-build`).
FROM scratch
COPY rootfs/ /
LABEL org.opencontainers.image.title="peerpods-webhook" \
      org.opencontainers.image.description="Peer-pods mutating admission webhook: peer pods request kata.peerpods.io/vm, their size goes to annotations" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root (the Deployment peer-pod-config-ctrl renders runs it with a read-only root filesystem too).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/peerpods-webhook"]
