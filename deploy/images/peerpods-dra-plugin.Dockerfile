# peerpods-dra-plugin: DRA kubelet plugin of the peer-pods VM pool: registers driver vm.peerpods.io with the kubelet and prepares its claims with nothing to inject.
# Build context: target/images/context/peerpods-dra-plugin, laid out by deploy/images/stage.sh (`make docker-build`).
FROM scratch
COPY rootfs/ /
LABEL org.opencontainers.image.title="peerpods-dra-plugin" \
      org.opencontainers.image.description="DRA kubelet plugin of the peer-pods VM pool: registers driver vm.peerpods.io with the kubelet and prepares its claims with nothing to inject" \
      org.opencontainers.image.licenses="Apache-2.0"
# Non-root by default. Its sockets go into the kubelet's directories (root's, 0750 as the kubelet makes them):
# the DaemonSet that mounts them decides the user that may write there.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/peerpods-dra-plugin"]
