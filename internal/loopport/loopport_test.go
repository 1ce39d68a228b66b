package loopport

import (
	"net"
	"strconv"
	"strings"
	"testing"
)

// TestPick: the ports are distinct, below the ephemeral range, free to
// bind, and never handed out twice by one process.
func TestPick(t *testing.T) {
	seen := map[int]bool{}
	for range 50 {
		ps, err := Pick(3)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p < Low || p >= High || seen[p] {
				t.Fatalf("port %d: outside %d–%d or handed out twice", p, Low, High-1)
			}
			seen[p] = true
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
			if err != nil {
				t.Fatalf("port %d is not free: %v", p, err)
			}
			ln.Close()
		}
	}
	a, err := Addr()
	if err != nil {
		t.Fatalf("Addr: %q, %v", a, err)
	}
}

// TestAddrOn: an address on a given local IP, its port in the range and
// free to bind there; an address this host does not have is refused with
// the range and the address named.
func TestAddrOn(t *testing.T) {
	a, err := AddrOn("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	host, ps, err := net.SplitHostPort(a)
	if err != nil || host != "127.0.0.1" {
		t.Fatalf("AddrOn = %q, %v", a, err)
	}
	if p, _ := strconv.Atoi(ps); p < Low || p >= High {
		t.Fatalf("AddrOn = %q: port outside %d–%d", a, Low, High-1)
	}
	ln, err := net.Listen("tcp", a)
	if err != nil {
		t.Fatalf("%s is not free: %v", a, err)
	}
	ln.Close()
	if a, err := AddrOn("192.0.2.1"); err == nil || !strings.Contains(err.Error(), "192.0.2.1") {
		t.Fatalf("AddrOn(an address not on this host) = %q, %v; want an error naming it", a, err)
	}
}
