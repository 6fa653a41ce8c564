# peerpod-ctrl: CRD generation and the local dev loop.

.PHONY: manifests manifests-peerpod dev-peerpod-crd

# Double-colon so every controller's fragment adds its own CRDs to `make manifests`.
manifests:: manifests-peerpod

manifests-peerpod:
	$(CARGO) run --quiet -p peerpod-ctrl -- crd > $(ROOT)/deploy/crds/peerpods.yaml

# `make dev`: install the PeerPod CRD into the local control plane ...
dev-peerpod-crd: testenv-up kubectl
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) apply --server-side -f $(ROOT)/deploy/crds/peerpods.yaml

DEV_PREREQS += dev-peerpod-crd

# ... and run the controller against provider-service on 127.0.0.1:50051 (plaintext, no token: local only).
DEV_PROCS += peerpod-ctrl
DEV_CMD_peerpod-ctrl = $(CARGO) run --quiet -p peerpod-ctrl -- \
	--provider-endpoint http://127.0.0.1:50051 --provider-auth none --admin-listen 127.0.0.1:18081 \
	--orphan-scan-interval 30s --orphan-grace 1m --retry-max-delay 30s
