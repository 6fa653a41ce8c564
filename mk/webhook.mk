# peerpods-webhook: the Go reference its comparison tests run beside it (cloud-api-adaptor v0.22's pod mutation on
# the controller-runtime admission handler upstream's binary uses; webhook/tests/caa-reference, test tooling only).
#
#   make caa-reference        build it where the tests look for it (Cargo's target/tmp); modules from the Go proxy
#   make caa-reference-check  go vet and gofmt on it (proto/'s checks cover only proto/)

CAA_REFERENCE_DIR := $(ROOT)/webhook/tests/caa-reference
CAA_REFERENCE_BIN := $(CARGO_TARGET)/tmp/caa-reference

TEST_PREREQS += caa-reference
CHECKS += caa-reference-check

.PHONY: caa-reference caa-reference-check

# Go's build cache makes this a second when nothing changed; the tests run the same `go build` themselves, so a
# plain `cargo test -p peerpods-webhook` works without it.
caa-reference:
	cd $(CAA_REFERENCE_DIR) && $(GO) build -o $(CAA_REFERENCE_BIN) .

caa-reference-check:
	cd $(CAA_REFERENCE_DIR) && $(GO) vet ./...
	@cd $(CAA_REFERENCE_DIR) && unformatted=$$("$$(dirname "$$(command -v $(GO))")/gofmt" -l .) && \
	  { [ -z "$$unformatted" ] || { echo "gofmt -l: $$unformatted"; exit 1; }; }
