// Package loopport picks loopback ports for servers that a process starts
// and may start again on the same port: a ClickHouse server of its own
// (internal/chlocal), the test kit's replicas, ZooKeeper and brokers.
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
	mu.Lock()
	defer mu.Unlock()
	var out []int
	for try := 0; len(out) < n; try++ {
		if try >= 1000*n {
			return nil, fmt.Errorf("loopport: no free loopback port in %d–%d", Low, High-1)
		}
		port := Low + rand.IntN(High-Low)
		if handed[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
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
