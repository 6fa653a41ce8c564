#!/usr/bin/env bash
# Builds the local control plane into $1, stamped with the Kubernetes release it is built from (so /version
# reports it, as a released kube-apiserver does). Used by `make controlplane` and by the testenv crate.
set -euo pipefail
out=${1:?usage: build.sh OUTPUT}
cd "$(dirname "$0")"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=$(echo "$version" | cut -d. -f2)
flags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  flags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done
exec go build -ldflags "$flags" -o "$out" .
