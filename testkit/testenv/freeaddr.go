package testenv

import (
	"testing"

	"github.com/playpipe/playpipe/internal/loopport"
)

// FreeAddr returns a loopback address that was free a moment ago, for a
// child process (a role, nginx) to bind: loopport's, from 20000–32767,
// below the ephemeral range (so an outgoing connection cannot take one
// before the child binds it, or between a kill and a restart), and none
// handed out twice in one test binary.
func FreeAddr(t testing.TB) string {
	t.Helper()
	a, err := loopport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return a
}
