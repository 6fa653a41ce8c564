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

# ... and run the controller (built by `make dev-build`) against provider-service on 127.0.0.1:50051 (plaintext,
# no token: local only).
DEV_PROCS += peerpod-ctrl
DEV_ADMIN_peerpod-ctrl := 127.0.0.1:18081
DEV_INFO_peerpod-ctrl := health and metrics on http://127.0.0.1:18081 (watches PeerPods in every namespace)
DEV_TRY_peerpod-ctrl := make dev-peerpod-demo   (a Pod and its PeerPod as CAA makes them; deleting the Pod reaps the VM)
DEV_CMD_peerpod-ctrl = $(DEV_BIN)/peerpod-ctrl \
	--provider-endpoint http://127.0.0.1:50051 --provider-auth none --admin-listen 127.0.0.1:18081 \
	--orphan-scan-interval 30s --orphan-grace 1m --retry-max-delay 30s

# With `make dev` running in another terminal: a Pod and its PeerPod exactly as cloud-api-adaptor creates
# them (api/tests/fixtures/caa-peerpod.json) for the first VM provider-service lists; deleting the Pod makes the
# garbage collector delete the PeerPod, and peerpod-ctrl delete the VM and release the finalizer.
.PHONY: dev-peerpod-demo
dev-peerpod-demo: python-tools
	@export KUBECONFIG=$(KUBECONFIG_DEV); ns=peerpod-demo; \
	vm=$$($(GRPCURL) -plaintext -d '{"cloud_provider":"libvirt"}' 127.0.0.1:50051 \
	  peerpods.provider.v1.ProviderService/ListInstances \
	  | python3 -c 'import json,sys; print(json.load(sys.stdin)["instances"][0]["instanceId"])'); \
	echo "VM to reap: libvirt $$vm"; \
	$(KUBECTL) create namespace $$ns --dry-run=client -o yaml | $(KUBECTL) apply -f - >/dev/null; \
	$(KUBECTL) -n $$ns run demo --image=nginx --restart=Never; \
	uid=$$($(KUBECTL) -n $$ns get pod demo -o jsonpath='{.metadata.uid}'); \
	sed -e "s/nginx-resource-q7z9r/demo-resource-q7z9r/; s/\"namespace\":\"default\"/\"namespace\":\"$$ns\"/" \
	  -e "s/\"name\":\"nginx\"/\"name\":\"demo\"/; s/00000000-0000-0000-0000-000000000000/$$uid/" \
	  -e "s/\"aws\"/\"libvirt\"/; s/i-0123456789abcdef0/$$vm/" \
	  api/tests/fixtures/caa-peerpod.json | $(KUBECTL) create -f -; \
	$(KUBECTL) -n $$ns get peerpods; \
	$(KUBECTL) -n $$ns delete pod demo --wait=false; \
	$(KUBECTL) -n $$ns wait --for=delete peerpod/demo-resource-q7z9r --timeout=60s; \
	$(KUBECTL) -n $$ns get events --field-selector involvedObject.name=demo-resource-q7z9r; \
	$(GRPCURL) -plaintext -d '{"cloud_provider":"libvirt"}' 127.0.0.1:50051 \
	  peerpods.provider.v1.ProviderService/ListInstances
