package loopport

import (
	"net"
	"strconv"
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
