package confcheck

import (
	"errors"
	"testing"
	"time"
)

func TestFirstRule(t *testing.T) {
	if err := First(Rule(false, "x: A", "≥ 1", 0), nil); err != nil {
		t.Fatalf("no rule broken: got %v", err)
	}
	err := First(
		Rule(false, "x: A", "≥ 1", 0),
		Rule(true, "x: B (--b)", "> 0", -time.Second),
		Rule(true, "x: C", "≥ 1", -1),
	)
	if want := "x: B (--b) must be > 0, got -1s"; err == nil || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	other := errors.New("other")
	if err := First(nil, other, Rule(true, "x: C", "≥ 1", -1)); err != other {
		t.Fatalf("got %v, want the first error given", err)
	}
}
