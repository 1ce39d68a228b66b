//go:build linux

package main

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/playpipe/playpipe/wiring/testenv"
)

// TestPlainClientRetries500s: with a share of the posts answered 500, the
// plain client retries each one until it is accepted: every report is
// accepted exactly once, and the retries it counts are the sandbox's
// injected answers, about the share set.
func TestPlainClientRetries500s(t *testing.T) {
	sb := testenv.StartSandbox(t)
	_, _, bodies := benchPlays(400)
	admin := strings.TrimPrefix(sb.AdminURL, "http://")
	const rate = 0.05
	res, err := ceiling(context.Background(), sb.URL, admin, 0, bodies, 8, sandboxFaults{rate500: rate, seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Counts()
	if c.Accepted != 400 || c.Duplicates != 0 || res.posts != 400 {
		t.Fatalf("accepted %d (%d duplicates), posts %d; want 400 reports accepted once", c.Accepted, c.Duplicates, res.posts)
	}
	if int64(res.retried) != c.Injected || c.Injected == 0 {
		t.Fatalf("the client retried %d answers, the sandbox injected %d", res.retried, c.Injected)
	}
	// The injected 500s are a share of every post, retries included.
	posts := float64(400 + res.retried)
	if d := math.Abs(float64(c.Injected) - rate*posts); d > 5*math.Sqrt(posts*rate*(1-rate)) {
		t.Fatalf("%d of %.0f posts answered 500, want about %.0f", c.Injected, posts, rate*posts)
	}
	n, err := injectedCount(context.Background(), admin)
	if err != nil || n != c.Injected {
		t.Fatalf("injectedCount %d, %v; want %d", n, err, c.Injected)
	}
}

func TestParseErrorRates(t *testing.T) {
	rs, err := parseErrorRates("0, 0.001,0.01,0.02")
	if err != nil || len(rs) != 4 || rs[1] != 0.001 || rs[3] != 0.02 {
		t.Fatalf("%v, %v", rs, err)
	}
	for _, bad := range []string{"", "0.6", "-0.1", "1%", "0,,0.1"} {
		if _, err := parseErrorRates(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
