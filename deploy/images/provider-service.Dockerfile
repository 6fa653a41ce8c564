# provider-service: gRPC service that alone holds cloud credentials and deletes peer-pod VMs (links libvirt: the shared libraries it needs are in the image).
# Build context: target/images/context/provider-service, laid out by deploy/images/stage.sh (`make docker-build`).
FROM scratch
COPY rootfs/ /
LABEL org.opencontainers.image.title="provider-service" \
      org.opencontainers.image.description="gRPC service that alone holds cloud credentials and deletes peer-pod VMs (links libvirt: the shared libraries it needs are in the image)" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root (the chart's securityContext runs it as 65532 with a read-only root filesystem too).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/provider-service"]
