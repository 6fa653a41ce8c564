# peer-pod-config-ctrl: CRD generation and the local dev loop.

.PHONY: manifests manifests-peerpodconfig dev-peerpodconfig install-webhook-configuration

# Double-colon so every controller's fragment adds its own CRDs to `make manifests`.
manifests:: manifests-peerpodconfig

manifests-peerpodconfig:
	$(CARGO) run --quiet -p peer-pod-config-ctrl -- crd > $(ROOT)/deploy/crds/peerpodconfigs.yaml

# `make dev`: install the CRD, the webhook configuration the chart would create (the controller only adds its
# webhook to it), the peer-pods namespace, a few Node objects (three of them labelled as workers) and the sample
# PeerPodConfig; the controller then spreads its limit over the workers. Once it has, this prints what every node
# advertises.
PEERPODS_DEV_NAMESPACE := confidential-containers-system

dev-peerpodconfig: $(KUBECTL)
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) apply -f deploy/crds/peerpodconfigs.yaml
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) apply --server-side --field-manager=peerpods-dev \
	  -f deploy/samples/webhook-configuration.yaml
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) wait --for condition=established --timeout=60s \
	  crd/peerpodconfigs.confidentialcontainers.org
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) apply -f deploy/samples/dev-nodes.yaml
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) create namespace $(PEERPODS_DEV_NAMESPACE) --dry-run=client -o yaml \
	  | $(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) apply -f -
	$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) apply -n $(PEERPODS_DEV_NAMESPACE) -f deploy/samples/peerpodconfig.yaml
	@echo "peer-pod-config-ctrl prints the capacity each node got into its log; see it again with"
	@echo "  make dev-peerpodconfig-capacity"

# Prints the capacity each node got once the controller (started by `make dev`) has written it.
.PHONY: dev-peerpodconfig-capacity
dev-peerpodconfig-capacity: $(KUBECTL)
	@$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) get nodes \
	  -o custom-columns='NODE:.metadata.name,WORKER:.metadata.labels.node\.kubernetes\.io/worker,KATA_PEERPODS_VM:.status.capacity.kata\.peerpods\.io/vm'
	@$(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) get peerpodconfigs -A

DEV_PREREQS += dev-peerpodconfig
DEV_PROCS += peer-pod-config-ctrl
DEV_ADMIN_peer-pod-config-ctrl := 127.0.0.1:18082
DEV_INFO_peer-pod-config-ctrl := health and metrics on http://127.0.0.1:18082 (PeerPodConfigs in $(PEERPODS_DEV_NAMESPACE))
DEV_TRY_peer-pod-config-ctrl := make dev-peerpodconfig-capacity   (the kata.peerpods.io/vm capacity each node got)
# The controller (exec'd, so stopping `make dev` stops it), talking to the local provider-service for
# capacityFromProvider, and wiring the CAA DaemonSet to it (plaintext: provider-service runs without TLS here; CAA
# runs host-networked, so 127.0.0.1 is the node's provider-service). Beside it, a loop waits for the sample's setupCompleted and prints the capacity every node
# got, into the log and to the terminal when there is one.
DEV_CMD_peer-pod-config-ctrl = \
	{ for i in $$(seq 1 600); do \
	    [ "$$($(KUBECTL) --kubeconfig $(KUBECONFIG_DEV) get peerpodconfig -n $(PEERPODS_DEV_NAMESPACE) peerpodconfig \
	          -o jsonpath='{.status.setupCompleted}' 2>/dev/null)" = true ] && break; sleep 1; \
	  done; \
	  out="$$($(MAKE) --no-print-directory dev-peerpodconfig-capacity 2>&1)"; echo "$$out"; \
	  { printf '\npeer-pod-config-ctrl: capacity per node\n%s\n' "$$out" > /dev/tty; } 2>/dev/null || true; } & \
	exec env PEERPODS_NAMESPACE=$(PEERPODS_DEV_NAMESPACE) $(DEV_BIN)/peer-pod-config-ctrl \
	  --admin-listen 127.0.0.1:18082 --provider-endpoint http://127.0.0.1:50051 --provider-auth none \
	  --caa-provider-endpoint http://127.0.0.1:50051

# `make run` (against the current KUBECONFIG, without the chart): the webhook configuration the chart would create.
install-webhook-configuration: $(KUBECTL)
	$(KUBECTL) apply --server-side --field-manager=peerpods-dev -f $(ROOT)/deploy/samples/webhook-configuration.yaml
