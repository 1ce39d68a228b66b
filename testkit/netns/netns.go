package netns

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/playpipe/playpipe/internal/loopport"
)

// Spec names a namespace: Prefix starts the namespace's and the veth ends'
// names (a few letters: interface names are at most 15 bytes), Subnet is the
// second octet of its addresses, Table the nftables table Cut adds, Node the
// id of the node put in it.
type Spec struct {
	Prefix string
	Subnet int
	Table  string
	Node   int
}

// Namespace is one namespace made by Setup.
type Namespace struct {
	Name   string // the namespace (ip netns)
	HostIf string // the host end of the veth pair
	HostIP string // the host end's address: the other nodes listen here
	NSIP   string // the namespace end's address: the node in it listens here
	Node   int    // the node put in the namespace

	table    string
	nextPort int
}

// Setup creates the namespace and the veth pair, or returns nil and says why
// it cannot (not root, no ip or nft, a step refused).
func Setup(s Spec) (*Namespace, string) {
	if os.Geteuid() != 0 {
		return nil, "not root: no network namespace"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, tool + " not installed (apt-get install -y iproute2 nftables)"
		}
	}
	pid := os.Getpid()
	x := pid%250 + 1
	n := &Namespace{
		Name:     fmt.Sprintf("%s-%d", s.Prefix, pid),
		HostIf:   fmt.Sprintf("%s%dh", s.Prefix, pid%1000000),
		HostIP:   fmt.Sprintf("10.%d.%d.1", s.Subnet, x),
		NSIP:     fmt.Sprintf("10.%d.%d.2", s.Subnet, x),
		Node:     s.Node,
		table:    s.Table,
		nextPort: 20000 + pid%20000,
	}
	nsIf := fmt.Sprintf("%s%dn", s.Prefix, pid%1000000)
	steps := [][]string{
		{"ip", "netns", "add", n.Name},
		{"ip", "link", "add", n.HostIf, "type", "veth", "peer", "name", nsIf},
		{"ip", "link", "set", nsIf, "netns", n.Name},
		{"ip", "addr", "add", n.HostIP + "/30", "dev", n.HostIf},
		{"ip", "link", "set", n.HostIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "addr", "add", n.NSIP + "/30", "dev", nsIf},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", nsIf, "up"},
		{"ip", "netns", "exec", n.Name, "ip", "link", "set", "lo", "up"},
	}
	for _, st := range steps {
		if out, err := exec.Command(st[0], st[1:]...).CombinedOutput(); err != nil {
			n.Close()
			return nil, fmt.Sprintf("%s: %v: %s", strings.Join(st, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return n, ""
}

// Exec is the command prefix that runs a program in the namespace.
func (n *Namespace) Exec() []string { return []string{"ip", "netns", "exec", n.Name} }

// Addr returns a listener address for node id: in the namespace for the
// node put there (a fresh namespace has every port free), else a free port
// on the host end of the veth below the ephemeral range (loopport): a
// node killed and restarted on its port finds it free, where an ephemeral
// one could have been taken by any client's connection from that address.
func (n *Namespace) Addr(id int) (string, error) {
	if id == n.Node {
		n.nextPort++
		return fmt.Sprintf("%s:%d", n.NSIP, n.nextPort), nil
	}
	return loopport.AddrOn(n.HostIP) // its error names the address
}

// Cut drops every packet in and out of the namespace.
func (n *Namespace) Cut() error {
	rules := fmt.Sprintf("table inet %[1]s {\n chain in { type filter hook input priority 0; policy drop; }\n chain out { type filter hook output priority 0; policy drop; }\n}\n", n.table)
	cmd := exec.Command("ip", "netns", "exec", n.Name, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s", n.Name, err, out)
	}
	return nil
}

// Heal lifts a Cut (an error when there is no cut to lift).
func (n *Namespace) Heal() error {
	if out, err := exec.Command("ip", "netns", "exec", n.Name, "nft", "delete", "table", "inet", n.table).CombinedOutput(); err != nil {
		return fmt.Errorf("nft delete in %s: %w: %s", n.Name, err, out)
	}
	return nil
}

// Close removes the veth pair and the namespace.
func (n *Namespace) Close() {
	_ = exec.Command("ip", "link", "del", n.HostIf).Run()
	_ = exec.Command("ip", "netns", "del", n.Name).Run()
}
