package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

// FreeAddr returns a loopback address that was free a moment ago, for a
// child process (a role, nginx) to bind. Ports come from 20000–32767, below
// the ephemeral range (so an outgoing connection cannot take one before the
// child binds it), and none is handed out twice in one test binary (a
// listen-then-close port can come back at once otherwise).
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedMu.Lock()
	defer handedMu.Unlock()
	for range 1000 {
		port := 20000 + rand.IntN(12768)
		if handed[port] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // in use
		}
		ln.Close()
		handed[port] = true
		return ln.Addr().String()
	}
	t.Fatal("no free loopback port in 20000–32767")
	return ""
}

var (
	handedMu sync.Mutex
	handed   = map[int]bool{}
)
