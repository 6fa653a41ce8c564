# provider-service: gRPC service that alone holds cloud credentials and deletes peer-pod VMs. One Dockerfile for
# its variants (`make docker-build`: IMAGE names the variant, FEATURES the clouds its binary serves); only
# provider-service-libvirt links a C library, libvirt, whose shared libraries stage.sh copies into the image.
# Build context: target/images/context/<IMAGE>, laid out by deploy/images/stage.sh.
FROM scratch
ARG IMAGE=provider-service
ARG FEATURES=""
COPY rootfs/ /
LABEL org.opencontainers.image.title="${IMAGE}" \
      org.opencontainers.image.description="gRPC service that alone holds cloud credentials and deletes peer-pod VMs; clouds: ${FEATURES}" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root (the chart's securityContext runs it as 65532 with a read-only root filesystem too).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/provider-service"]
