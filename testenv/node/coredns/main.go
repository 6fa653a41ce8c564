// Command coredns is CoreDNS with only the plugins the node's cluster DNS uses (Services and Pods by name from
// the API, health and readiness for its probes), so the test node builds a small binary instead of CoreDNS's
// every-plugin default. The plugin order below is CoreDNS's own (core/dnsserver/zdirectives.go).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"errors", "health", "ready", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
