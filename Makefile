# Peer-pods controllers: the verbs of the project.
#
#   make dev    build the services, then run the whole system locally (local control plane + services)
#   make test   install what is missing, then run every check and test, fastest first
#   make lint   rustfmt --check, then clippy (warnings are errors)
#
# `make test` runs in stages and stops at the first stage that fails: fmt-check, clippy (+ LINTS), unit-tests,
# integration-tests, CHECKS, E2E. Each cargo test stage runs with --no-fail-fast, so one failing test binary does
# not hide the others (cargo still exits non-zero).
#
# Parts of the project add their own targets in mk/*.mk. A fragment may append to:
#   SYSTEM_PACKAGES  Debian packages the project needs; `make system-packages` installs the missing ones
#   LINTS         static checks run right after clippy (compile-only, no servers)
#   TEST_PREREQS  targets run before the integration tests (tools, servers' binaries)
#   CHECKS        targets run by `make test` after the integration tests (linters, Go tests, drift checks)
#   E2E           end-to-end targets run last (a real node, Tilt)
#   BESIDE_INTEGRATION  builds a later stage needs, which `make test` runs (niced) while the integration tests run
#   DEV_PREREQS   targets `make dev` runs once the control plane is up (CRDs, samples)
#   DEV_PROCS     names of services `make dev` runs; for each NAME a fragment defines DEV_CMD_NAME, the command
#                 (run from the repo root with KUBECONFIG set to the local control plane's kubeconfig; the binaries
#                 `make dev-build` built are in $(DEV_BIN)), DEV_ADMIN_NAME, its admin address (`make dev` waits for
#                 its /readyz), DEV_INFO_NAME, where it listens, and DEV_TRY_NAME, a command to try next

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

ROOT := $(CURDIR)
TOOLS := $(ROOT)/.tools
TESTENV := $(ROOT)/.testenv
CONTROLPLANE := $(TESTENV)/bin/controlplane
KUBECTL := $(TOOLS)/bin/kubectl
KUBECONFIG_DEV := $(TESTENV)/kubeconfig
CARGO ?= cargo
GO ?= go
# Where cargo puts its builds (the services `make dev` starts, the binaries the tests run).
CARGO_TARGET := $(or $(CARGO_TARGET_DIR),$(ROOT)/target)
DEV_BIN := $(CARGO_TARGET)/debug

# CI (CI=true or CI=1 in the environment, as CI services and .ci/run set it) builds from scratch once:
# incremental compilation's bookkeeping only costs time and disk there.
# Line tables are dropped there too: a panic still names its file and line, and every test binary links
# smaller, which matters where the disk is short (a cold `make test` writes tens of GiB: Rust's and Go's builds,
# the images).
ifneq ($(filter true 1,$(CI)),)
export CARGO_INCREMENTAL := 0
export CARGO_PROFILE_DEV_DEBUG := false
endif

SYSTEM_PACKAGES :=
LINTS :=
TEST_PREREQS := system-packages controlplane
CHECKS :=
E2E :=
BESIDE_INTEGRATION :=
DEV_PREREQS :=
DEV_PROCS :=

include $(sort $(wildcard mk/*.mk))

.PHONY: help
help:
	@echo "make dev            run the whole system locally (Ctrl-C stops the services)"
	@echo "make test           run every check and test, fastest first (installs what is missing)"
	@echo "                    stages: fmt-check clippy unit-tests integration-tests, then $(CHECKS) $(E2E)"
	@echo "make system-packages  install the Debian packages the project needs: $(SYSTEM_PACKAGES)"
	@echo "make lint           rustfmt --check, then clippy -D warnings ($(LINTS))"
	@echo "make deps           cargo-deny (licenses, duplicate versions, sources) + cargo-shear (unused dependencies)"
	@echo "make testenv-up     start the local control plane in the background ($(KUBECONFIG_DEV))"
	@echo "make testenv-down   stop it"
	@echo "make kubectl        build kubectl (matching the control plane) into .tools/bin"
	@echo "make node           build the test node (kubelet, containerd, runc, kube-proxy, CoreDNS) into .testenv/node"
	@echo "make test-node      the Helm chart on that node (part of make test; needs root)"
	@echo "make bench          run the benchmark scenarios (release builds; not part of make test)"
	@echo "make manifests      regenerate the CRDs in deploy/crds from the Rust types"
	@echo "make install | uninstall | run | deploy IMG=... | undeploy | docker-build | docker-push | helm-lint"

## Debian packages (the only place the project runs apt-get)

.PHONY: system-packages
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s "$$p" >/dev/null 2>&1 || echo "$$p"; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	fi

## The local control plane (testenv/controlplane): etcd + kube-apiserver + kube-controller-manager in one process.

# Always asks `go build`: it relinks only when a source or go.sum changed, and is quick otherwise.
.PHONY: controlplane
controlplane:
	@mkdir -p $(dir $(CONTROLPLANE))
	testenv/controlplane/build.sh $(CONTROLPLANE)

# kubectl from the same Kubernetes release as the control plane, stamped with its version.
KUBE_VERSION = $(shell cd testenv/controlplane && $(GO) list -m -f '{{.Version}}' k8s.io/kubernetes)
KUBE_LDFLAGS = -X k8s.io/component-base/version.gitVersion=$(KUBE_VERSION) \
	-X k8s.io/client-go/pkg/version.gitVersion=$(KUBE_VERSION)

.PHONY: kubectl
kubectl: $(KUBECTL)
$(KUBECTL): testenv/controlplane/go.mod testenv/controlplane/go.sum
	@mkdir -p $(dir $@)
	cd testenv/controlplane && $(GO) build -ldflags "$(KUBE_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/kubectl

.PHONY: testenv-up
testenv-up: controlplane
	@mkdir -p $(TESTENV)
	@if [ -f $(TESTENV)/controlplane.pid ] && kill -0 "$$(cat $(TESTENV)/controlplane.pid)" 2>/dev/null; then \
	  echo "local control plane already running (pid $$(cat $(TESTENV)/controlplane.pid)), kubeconfig $(KUBECONFIG_DEV)"; \
	else \
	  rm -f $(KUBECONFIG_DEV); \
	  setsid $(CONTROLPLANE) --kubeconfig $(KUBECONFIG_DEV) > $(TESTENV)/controlplane.log 2>&1 < /dev/null & \
	  echo $$! > $(TESTENV)/controlplane.pid; \
	  for i in $$(seq 1 1800); do \
	    if grep -q '^ready ' $(TESTENV)/controlplane.log; then break; fi; \
	    if ! kill -0 "$$(cat $(TESTENV)/controlplane.pid)" 2>/dev/null; then \
	      echo "local control plane failed to start:"; tail -30 $(TESTENV)/controlplane.log; exit 1; \
	    fi; \
	    sleep 0.1; \
	  done; \
	  grep '^ready ' $(TESTENV)/controlplane.log || { echo "local control plane not ready after 180s"; exit 1; }; \
	fi

.PHONY: testenv-down
testenv-down:
	@if [ -f $(TESTENV)/controlplane.pid ]; then \
	  pid=$$(cat $(TESTENV)/controlplane.pid); \
	  if kill -TERM "$$pid" 2>/dev/null; then \
	    for i in $$(seq 1 200); do kill -0 "$$pid" 2>/dev/null || break; sleep 0.1; done; \
	    echo "local control plane stopped"; \
	  fi; \
	  rm -f $(TESTENV)/controlplane.pid $(KUBECONFIG_DEV); \
	fi

## Tests and lint, fastest first: a formatting error fails in seconds, a lint before any test is built.
## Each stage is its own make run so the order holds under `make -j` too.

# --no-fail-fast: every test binary runs and every failure is reported; cargo still exits non-zero.
CARGO_TEST := $(CARGO) test --workspace --locked --no-fail-fast

.PHONY: test lint fmt-check clippy unit-tests integration-tests
# Each stage (and each check) prints how long it took, so a run that creeps toward its time budget says where.
# $(2): variables for that stage's make.
timed = start=$$(date +%s); $(MAKE) --no-print-directory $(1) $(2); \
	echo "time: $(1): $$(( $$(date +%s) - start )) s (total $$(( $$(date +%s) - $(TEST_START) )) s)"
TEST_START := $(shell date +%s)

test:
	@# The free disk, first: a build that runs out of it fails late, in whatever it was linking.
	@df -h $(CARGO_TARGET) $(ROOT) 2>/dev/null | sed 's/^/disk: /' || true
	@$(call timed,lint)
	@$(call timed,unit-tests)
	@# The integration tests mostly wait on their servers (one crate's measured at about half of one core of two), so
	@# the builds later stages need run beside them at the lowest priority, each logging to
	@# target/beside-integration/<target>.log, shown if it fails; the stage then waits for them.
	@mkdir -p $(CARGO_TARGET)/beside-integration; pids=(); \
	for t in $(BESIDE_INTEGRATION); do \
	  nice -n 19 $(MAKE) --no-print-directory $$t > $(CARGO_TARGET)/beside-integration/$$t.log 2>&1 & pids+=("$$t=$$!"); \
	done; \
	rc=0; start=$$(date +%s); $(MAKE) --no-print-directory integration-tests || rc=$$?; \
	echo "time: integration-tests: $$(( $$(date +%s) - start )) s (total $$(( $$(date +%s) - $(TEST_START) )) s)"; \
	start=$$(date +%s); \
	for p in "$${pids[@]}"; do \
	  wait "$${p#*=}" || { echo "$${p%%=*}, built beside the integration tests, failed:"; \
	    cat $(CARGO_TARGET)/beside-integration/$${p%%=*}.log; rc=1; }; \
	done; \
	$(if $(BESIDE_INTEGRATION),echo "time: then waiting for $(BESIDE_INTEGRATION): $$(( $$(date +%s) - start )) s";) \
	exit $$rc
	@$(foreach c,$(CHECKS),$(call timed,$(c));)true
	@# Every check has passed: an end-to-end target may use what they built (CHECKS_PASSED=yes) instead of
	@# building it again (each stage is a make of its own, so a prerequisite would run once more).
	@$(foreach c,$(E2E),$(call timed,$(c),CHECKS_PASSED=yes);)true

lint:
	@$(MAKE) --no-print-directory fmt-check
	@$(MAKE) --no-print-directory clippy

# Needs nothing but rustfmt.
fmt-check:
	$(CARGO) fmt --all -- --check

# Needs nothing but the Rust toolchain and the C libraries the workspace links (libvirt-dev): no control plane,
# no Python tools, no helm.
clippy: libvirt-dev
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	@$(if $(strip $(LINTS)),$(MAKE) --no-print-directory $(LINTS),true)

# Libraries' and binaries' own tests (pure logic: no servers), and doc tests. The same feature set as every other
# cargo test here (--workspace), so the integration tests reuse these builds.
unit-tests: libvirt-dev
	$(CARGO_TEST) --lib --bins
	$(CARGO_TEST) --doc

# Every tests/ target of the workspace, against the local control plane, moto and the emulators.
integration-tests: $(TEST_PREREQS)
	$(CARGO_TEST) --test '*'

## The whole system, locally

.PHONY: dev dev-build
# The services, built once and with the test build's feature set: `--workspace --bins --tests` unifies features
# exactly as `cargo test --workspace` does (dev-dependencies turn on features a plain `cargo build` leaves off,
# e.g. opentelemetry_sdk's `testing`, which would rebuild everything above it), so after `make test` this builds
# nothing, and `make test` after `make dev` reuses it all. On a fresh machine it builds what `make test` builds.
dev-build: libvirt-dev
	@echo "Building the services (cargo build --workspace --bins --tests: the test build, shared with make test)"
	$(CARGO) build --workspace --locked --bins --tests

# make dev asks each service's /readyz with curl.
SYSTEM_PACKAGES += curl

dev: dev-build testenv-up kubectl $(DEV_PREREQS)
	@mkdir -p $(TESTENV)/logs
	@echo
	@echo "Local control plane is up. Use it with:"
	@echo "  export KUBECONFIG=$(KUBECONFIG_DEV) PATH=$(TOOLS)/bin:\$$PATH"
	@echo "  kubectl get namespaces"
	@echo "Stop it with: make testenv-down"
	@$(if $(strip $(DEV_PROCS)),true,echo "No services configured yet."; exit 0)
	@echo
	@echo "Starting services (logs in .testenv/logs/, Ctrl-C stops them): $(DEV_PROCS)"
	@export KUBECONFIG=$(KUBECONFIG_DEV); pids=(); declare -A pid_of; \
	trap 'kill $${pids[@]} 2>/dev/null; wait; exit 0' INT TERM; \
	$(foreach p,$(DEV_PROCS),( $(DEV_CMD_$(p)) ) > $(TESTENV)/logs/$(p).log 2>&1 & pids+=($$!); pid_of[$(p)]=$$!; echo "  $(p): pid $$!, log .testenv/logs/$(p).log";) \
	echo; \
	$(foreach p,$(DEV_PROCS),$(call dev_ready,$(p))) \
	echo; echo "Try next:"; \
	$(foreach p,$(DEV_PROCS),echo "  $(DEV_TRY_$(p))";) \
	echo "  make testenv-down   (after Ctrl-C) stops the local control plane"; \
	wait

# Waits (up to 2 minutes) for service $(1) to answer /readyz on DEV_ADMIN_$(1), then says where it listens; if it
# exits or is not ready in time, says so with the end of its log (the others keep running).
dev_ready = ready=; for i in $$(seq 1 1200); do \
	  curl -sf -o /dev/null http://$(DEV_ADMIN_$(1))/readyz && { ready=1; break; }; \
	  kill -0 "$${pid_of[$(1)]}" 2>/dev/null || break; \
	  sleep 0.1; \
	done; \
	if [ -n "$$ready" ]; then echo "  $(1) ready: $(DEV_INFO_$(1))"; \
	else echo "  $(1) is not ready (see .testenv/logs/$(1).log):"; tail -5 $(TESTENV)/logs/$(1).log | sed 's/^/    /'; fi;
