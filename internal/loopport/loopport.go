// Package loopport picks ports for servers that a process starts
// and may start again on the same port: a ClickHouse server of its own
// (internal/chlocal), the test kit's replicas, ZooKeeper and brokers; on
// loopback, or on another local address (AddrOn: a test's veth end).
//
// The ports come from 20000–32767, below Linux's ephemeral range
// (32768–60999 by default). A port the kernel hands out for port 0 is an
// ephemeral one, which any outgoing connection may take as its local port
// the moment its server dies: a server restarted on it then fails with
// "Address already in use" (seen in CI: a killed ClickHouse replica's port
// taken by a client's connection to the other replica before the replica
// came back). Below that range only a listener can hold a port.
package loopport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
)

// Low and High bound the half-open range the ports come from.
const (
	Low  = 20000
	High = 32768
)

var (
	mu     sync.Mutex
	handed = map[int]bool{}
)

// Pick returns n distinct loopback ports that were free a moment ago, none
// handed out before by this process (a listen-then-close port can come
// back at once otherwise).
func Pick(n int) ([]int, error) {
	return pickOn("127.0.0.1", n)
}

// pickOn is Pick for the local address ip.
func pickOn(ip string, n int) ([]int, error) {
	mu.Lock()
	defer mu.Unlock()
	var out []int
	for try := 0; len(out) < n; try++ {
		if try >= 1000*n {
			return nil, fmt.Errorf("loopport: no free port on %s in %d–%d", ip, Low, High-1)
		}
		port := Low + rand.IntN(High-Low)
		if handed[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
		if err != nil {
			continue // in use
		}
		ln.Close()
		handed[port] = true
		out = append(out, port)
	}
	return out, nil
}

// Addr returns a free loopback address ("127.0.0.1:port") as Pick picks.
func Addr() (string, error) {
	p, err := Pick(1)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p[0]), nil
}

// AddrOn returns a free address on the local address ip (the host end of
// a test's veth pair, say) with a port as Pick picks: below the ephemeral
// range, where no outgoing connection from ip can take it while its
// listener is down.
func AddrOn(ip string) (string, error) {
	p, err := pickOn(ip, 1)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(ip, strconv.Itoa(p[0])), nil
}
