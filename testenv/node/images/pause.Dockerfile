# The node's sandbox image (testenv/node/pause).
FROM scratch
COPY pause /pause
USER 65535:65535
ENTRYPOINT ["/pause"]
