# Mutation testing of the protocol code (make mutants; part of make test):
#
#   make mutants    cargo-mutants over the deletion engine, the consistency window, the guard, the instance
#                   identity and peerpod-ctrl's decision kernel (protocol/src; .cargo/mutants.toml says which
#                   files, which tests and the equivalent mutants left out, each with its reason). Every mutant
#                   must make the tests of peerpods-protocol or peerpods-protocol-model fail; one that does not is a
#                   missing test, and the target fails listing it (target/mutants/mutants.out/missed.txt).
#
# The model's deep configurations are left out of each mutant's test run (MODEL_QUICK): the small ones catch
# what they catch in seconds. cargo-mutants is built from crates.io into .tools/bin (a debug build).

CARGO_MUTANTS_VERSION := 27.1.0
CARGO_MUTANTS := $(TOOLS)/bin/cargo-mutants

CHECKS += mutants

.PHONY: mutants cargo-mutants
cargo-mutants: $(CARGO_MUTANTS)
# A debug build: cargo-mutants only lists mutants, edits a copy of the tree and runs cargo, so its own speed is not
# what the run waits on. Measured on 2 cores: the optimised build 4 to 5 minutes (200 s of CPU), this one 1 (80 s).
$(CARGO_MUTANTS):
	$(CARGO) install --locked --quiet --debug cargo-mutants --version $(CARGO_MUTANTS_VERSION) --root $(TOOLS)

# Each job builds in its own copy of the tree (its own target/), so CARGO_TARGET_DIR must not point them
# all at one. Incremental compilation stays on even in CI: each mutant rebuilds the same two crates again,
# in about a third of the time a clean rebuild of them takes. A mutant's tests get at least a minute (the
# automatic timeout comes from the baseline, which runs the protocol's tests only).
mutants: $(CARGO_MUTANTS)
	env -u CARGO_TARGET_DIR CARGO_INCREMENTAL=1 MODEL_QUICK=1 PATH=$(TOOLS)/bin:$$PATH \
	  $(CARGO) mutants --no-shuffle --jobs 2 --minimum-test-timeout 60 --output $(CARGO_TARGET)/mutants \
	  --test-package peerpods-protocol --test-package peerpods-protocol-model
