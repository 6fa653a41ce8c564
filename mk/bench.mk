# make bench (not part of make test): figures for cleanup storms, memory, cloud calls, convergence and gRPC
# overhead, from the release builds of the services against a local control plane of its own and moto server.
# It prints a table and writes target/bench/results.json. Sizes are flags of target/release/peerpods-bench
# (see --help), also environment/make variables, e.g.:
#
#   make bench BENCH_ARGS="--storm 200 --memory-peerpods 2000 --memory-nodes 200 --convergence-nodes 200"
#   make bench BENCH_STORM=200 BENCH_SCENARIOS=storm,grpc

BENCH_ARGS ?=

.PHONY: bench
bench: controlplane moto libvirt-dev
	$(CARGO) build --locked --release -p provider-service -p peerpod-ctrl -p peer-pod-config-ctrl -p peerpods-bench
	$(ROOT)/target/release/peerpods-bench --bin-dir $(ROOT)/target/release --moto-python $(VENV_PYTHON) \
	  --out-dir $(ROOT)/target/bench $(BENCH_ARGS)
