# make bench (not part of make test): figures for cleanup storms, memory, cloud calls, convergence and gRPC
# overhead, from the release builds of the services against a local control plane of its own and moto server.
# It prints a table and writes target/bench/results.json. Sizes are flags of target/release/peerpods-bench
# (see --help), also environment/make variables, e.g.:
#
#   make bench BENCH_ARGS="--storm 200 --memory-peerpods 2000 --memory-nodes 200 --convergence-nodes 200"
#   make bench BENCH_STORM=200 BENCH_SCENARIOS=storm,grpc
#
# The grpc scenario also prints the authenticated DeleteInstance latency (p50/p99) under a flood of 2000 idle
# connections from 40 peer addresses and 512 streams of calls without a valid token (none, or a forged one only
# the API server can refuse); the run fails if a flood call is served or an authenticated one is not.
#
#   make bench BENCH_SCENARIOS=grpc BENCH_GRPC_CALLS=200
#
# The fault storm (scenario fault_storm) runs on every cloud in turn (BENCH_FAULT_STORM_CLOUDS, default aws via
# moto and each emulator): BENCH_FAULT_STORM PeerPods (default 500) whose VMs sit behind the fault layer (20% 5xx,
# 10% throttling, 5% hangs on every cloud request, deletes of 8 polls (moto has no such knob), each kind of call
# blind to a VM for its first seconds and answers that flap, seeded); beside every tenth VM a part that is not the
# VM's. It prints per cloud the cleanup time, release p50/p95, the cloud requests and DeleteInstance calls per
# PeerPod, finalizers released early (each release checked against the cloud's state when the watch sees it),
# VMs leaked, foreign parts deleted and checks that got no answer: all must be 0, else the run fails. Its reduced
# size (20 PeerPods per cloud) is the integration test bench/tests/it/fault_storm.rs, which make test runs; make
# bench is not part of make test.
#
#   make bench BENCH_SCENARIOS=fault_storm BENCH_FAULT_STORM=100 BENCH_FAULT_STORM_CLOUDS=aws,azure
#
# The idle scenario (idle) starts all three services in a cluster of BENCH_MEMORY_PEERPODS PeerPods (default
# 10,000) and BENCH_MEMORY_NODES Nodes (default 1,000) that a PeerPodConfig selects, waits until every PeerPod is
# in peerpod-ctrl's cache and every node has its capacity, then reports each service's CPU (millicores, over 30 s at rest),
# RSS and peak RSS: the figures the chart's requests and limits are checked against (deploy/README.md).
#
#   make bench BENCH_SCENARIOS=idle

BENCH_ARGS ?=

.PHONY: bench
bench: controlplane moto libvirt-dev
	$(CARGO) build --locked --release -p provider-service -p peerpod-ctrl -p peer-pod-config-ctrl -p peerpods-bench
	$(ROOT)/target/release/peerpods-bench --bin-dir $(ROOT)/target/release --moto-python $(VENV_PYTHON) \
	  --out-dir $(ROOT)/target/bench $(BENCH_ARGS)
