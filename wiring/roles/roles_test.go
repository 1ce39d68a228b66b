package roles

import (
	"testing"

	"github.com/playpipe/playpipe/partnerapi"
)

// TestPoolSizeRule: one sizing rule for the CLI and the harness.
func TestPoolSizeRule(t *testing.T) {
	for _, c := range []struct{ maxConns, inFlight, want int }{
		{0, 0, partnerapi.DefaultMaxConns},
		{0, 48, partnerapi.DefaultMaxConns},
		{0, 100, 100},
		{8, 48, 48},
		{200, 48, 200},
	} {
		if got := PoolSize(c.maxConns, c.inFlight); got != c.want {
			t.Errorf("PoolSize(%d, %d) = %d, want %d", c.maxConns, c.inFlight, got, c.want)
		}
	}
	if InFlight(0, false) != 48 || InFlight(100, true) != 108 {
		t.Errorf("InFlight: %d, %d", InFlight(0, false), InFlight(100, true))
	}
}
