# A real node for the local control plane (testenv/node, the testenv crate's `node` module): kubelet, kube-proxy
# and kube-scheduler from the control plane's Kubernetes release; containerd, runc and CoreDNS from their Go
# modules; the pause and CoreDNS images built here; an image registry (CNCF distribution, its own module: its
# storage drivers' dependencies stay out of the others). `make test` runs `test-node`: the Helm chart installed on
# that node, its pods running, peer pods served from the DRA pool (capacityMode dra, with the project's kubelet
# plugin registered with the node's kubelet), and Tilt's cluster mode deploying onto it.
#
#   make node        the node's binaries and images into .testenv/node
#   make test-node   the chart-on-a-node test (needs root: it runs in namespaces of its own)

NODE_DIR := $(TESTENV)/node
NODE_BIN := $(NODE_DIR)/bin
NODE_IMAGES := $(NODE_DIR)/images
# containerd without the snapshotters that need C libraries; runc with seccomp (the chart's pods ask for
# RuntimeDefault), which needs cgo and libseccomp.
CONTAINERD_TAGS := no_btrfs no_devmapper no_zfs

# conntrack and iptables for kube-proxy, the CNI bridge/host-local/loopback/portmap plugins, libseccomp for runc.
SYSTEM_PACKAGES += conntrack iptables containernetworking-plugins libseccomp-dev util-linux iproute2

# Last in `make test`: the slowest check, and the one that needs every image built.
E2E += test-node

.PHONY: node node-binaries node-images test-node

node: node-binaries node-images

# Always asks `go build`: it relinks only what changed.
node-binaries: system-packages
	@mkdir -p $(NODE_BIN)
	cd testenv/controlplane && $(GO) build -ldflags "$(KUBE_LDFLAGS)" -o $(NODE_BIN)/ \
	  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler
	cd testenv/node && CGO_ENABLED=0 $(GO) build -tags "$(CONTAINERD_TAGS)" -o $(NODE_BIN)/ \
	  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
	  github.com/containerd/containerd/v2/cmd/ctr
	cd testenv/node && CGO_ENABLED=1 $(GO) build -tags seccomp -o $(NODE_BIN)/runc github.com/opencontainers/runc
	cd testenv/node && CGO_ENABLED=0 $(GO) build -o $(NODE_BIN)/ ./coredns ./pause
	cd testenv/node/registry && CGO_ENABLED=0 $(GO) build -o $(NODE_BIN)/registry \
	  github.com/distribution/distribution/v3/cmd/registry

node-images: node-binaries buildah
	@mkdir -p $(NODE_IMAGES)
	@set -e; for image in pause coredns; do \
	  ctx=$(NODE_DIR)/context/$$image; rm -rf $$ctx; mkdir -p $$ctx; cp $(NODE_BIN)/$$image $$ctx/; \
	  ref=localhost/peerpods-node/$$image:test; \
	  $(BUILDAH) build --quiet --isolation chroot --layers=false -f $(ROOT)/testenv/node/images/$$image.Dockerfile \
	    -t $$ref $$ctx >/dev/null; \
	  rm -f $(NODE_IMAGES)/$$image.oci.tar; \
	  $(BUILDAH) push --quiet $$ref oci-archive:$(NODE_IMAGES)/$$image.oci.tar:$$ref; \
	  $(BUILDAH) rmi $$ref >/dev/null; \
	  echo "node image $$ref -> $(NODE_IMAGES)/$$image.oci.tar"; \
	done

# The services' images are those images-check builds from the debug binaries (target/images/*.oci.tar). In
# `make test` images-check has just passed as one of CHECKS (CHECKS_PASSED=yes): its images are used as they are,
# where running it again took about a minute (both buildah builds of every image, and their checks).
# `--workspace` keeps the workspace's feature set: with `-p deploy-tests`, Cargo would build its dependencies a
# second time with other features.
test-node: node $(if $(filter yes,$(CHECKS_PASSED)),,images-check) tilt
	$(CARGO) test --workspace --test it --locked -- --ignored --test-threads=1 --exact \
	  node::the_chart_runs_on_a_node node::tilt_cluster_mode_deploys_onto_the_node
