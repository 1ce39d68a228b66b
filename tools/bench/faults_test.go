//go:build linux

package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/testkit/testenv"
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

// TestPlainClientRetriesTimeouts: with a share of all posts held past the
// client's timeout (the hold-rate round), the plain client retries each
// timed-out post until it is accepted: every report accepted exactly once,
// a retry for each post the sandbox held, the steady window measured.
func TestPlainClientRetriesTimeouts(t *testing.T) {
	sb := testenv.StartSandbox(t)
	_, _, bodies := benchPlays(200)
	admin := strings.TrimPrefix(sb.AdminURL, "http://")
	defer func(d time.Duration) { plainTimeout = d }(plainTimeout)
	plainTimeout = 300 * time.Millisecond
	res, err := ceiling(context.Background(), sb.URL, admin, 0, bodies, 16, sandboxFaults{holdRate: 0.05, hold: 2 * time.Second, seed: 5})
	if err != nil {
		t.Fatal(err)
	}
	c := sb.Counts()
	if c.Accepted != 200 || c.Duplicates != 0 {
		t.Fatalf("accepted %d (%d duplicates); want 200 reports accepted once", c.Accepted, c.Duplicates)
	}
	if int64(res.retried) != c.Injected || c.Injected == 0 {
		t.Fatalf("the client retried %d posts, the sandbox held %d", res.retried, c.Injected)
	}
	if res.half <= 0 || res.most < res.half || res.steadyRate() <= 0 {
		t.Fatalf("steady window %v → %v: no steady rate", res.half, res.most)
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

// TestPoisonTrackFault: poisonPlays spreads the share of reports of the
// poison track evenly, and with the poison fault set the sandbox answers
// 500 to each of them and takes every other report: a real sandbox, the
// plain client posting all the bodies once (its retries would never end).
func TestPoisonTrackFault(t *testing.T) {
	keys, values, bodies, others := poisonPlays(1000, 0.03)
	if len(keys) != 1000 || len(values) != 1000 || len(bodies) != 1000 {
		t.Fatalf("%d keys, %d values, %d bodies; want 1000", len(keys), len(values), len(bodies))
	}
	poisoned := len(bodies) - len(others)
	if poisoned < 30 || poisoned > 34 {
		t.Fatalf("%d poisoned reports of 1000 at 3 %%", poisoned)
	}
	for i, b := range bodies[:100] {
		if got := strings.Contains(string(b), `"trackid":666,`); got != (i%33 == 16) {
			t.Fatalf("report %d: poison %v: %s", i, got, b)
		}
	}
	sb := testenv.StartSandbox(t)
	admin := strings.TrimPrefix(sb.AdminURL, "http://")
	if err := setFaults(context.Background(), admin, sandboxFaults{poison: true}); err != nil {
		t.Fatal(err)
	}
	res, err := ceiling(context.Background(), sb.URL, admin, 0, others, 8, sandboxFaults{poison: true})
	if err != nil {
		t.Fatal(err)
	}
	if c := sb.Counts(); c.Accepted != int64(len(others)) || res.retried != 0 {
		t.Fatalf("accepted %d of %d other reports, %d retried", c.Accepted, len(others), res.retried)
	}
	// Each poisoned report is answered 500: the sandbox counts one injected
	// answer per post of them, and takes none.
	var poisonBodies [][]byte
	for _, b := range bodies {
		if strings.Contains(string(b), `"trackid":666,`) {
			poisonBodies = append(poisonBodies, b)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// The plain client retries a 500 until the context ends.
	_, _ = ceiling(ctx, sb.URL, admin, 0, poisonBodies, 8, sandboxFaults{poison: true})
	if c := sb.Counts(); c.Accepted != 0 || c.Injected < int64(len(poisonBodies)) {
		t.Fatalf("poisoned reports: %d accepted, %d answered 500; want none and at least %d", c.Accepted, c.Injected, len(poisonBodies))
	}
}
