// The cluster DNS of the real test node: CoreDNS with only the plugins its Corefile names
// (tests/support/real_node.py writes it). It answers the cluster domain from the apiserver
// and nothing else: no forward plugin is built in, so no query can leave the machine.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	// The order a query meets them, as CoreDNS's own plugin.cfg orders these.
	dnsserver.Directives = []string{"bind", "ready", "errors", "log", "cache", "kubernetes"}
}

func main() {
	coremain.Run()
}
