# The node's cluster DNS (testenv/node/coredns).
FROM scratch
COPY coredns /coredns
USER 65532:65532
ENTRYPOINT ["/coredns"]
