package reporter

import (
	"math"
	"testing"
	"time"
)

// feed gives l one interval of answers at rtt with the limit's posts in
// flight (saturated) or half of them (no backlog), advancing the clock.
func feed(l *limiter, now *time.Time, rtt time.Duration, saturated bool) {
	for range minSamples {
		inflight := int(l.limit)
		if !saturated {
			inflight /= 2
		}
		l.sample(*now, rtt, inflight)
		*now = now.Add(max(minInterval, rtt) / minSamples)
	}
	l.sample(*now, rtt, 0) // closes the interval
}

// TestLimiterGrowsWhileLatencyIsFlat: a partner 50 ms away whose latency
// does not move: the limit climbs from --concurrency to the cap, within
// 30 s of answers, and only while a backlog fills it.
func TestLimiterGrowsWhileLatencyIsFlat(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLimiter(48, 1024, now)
	start := now
	for l.limit < 512 {
		feed(l, &now, 50*time.Millisecond, true)
		if now.Sub(start) > 30*time.Second {
			t.Fatalf("limit %.0f after %v of flat latency, want ≥ 512", l.limit, now.Sub(start))
		}
	}
	t.Logf("48 → %.0f in %v at 50 ms", l.limit, now.Sub(start))
	for range 200 {
		feed(l, &now, 50*time.Millisecond, true)
	}
	if l.limit != 1024 {
		t.Fatalf("limit %.1f, want the cap 1024", l.limit)
	}
	if l.moves[moveGrow] == 0 || l.reason != moveGrow {
		t.Fatalf("moves %v, reason %q", l.moves, l.reason)
	}

	// Without a backlog (posts in flight well under the limit) it does
	// not grow: an idle reporter learns nothing of the partner.
	l = newLimiter(48, 1024, now)
	for range 50 {
		feed(l, &now, 50*time.Millisecond, false)
	}
	if l.limit != 48 {
		t.Fatalf("limit grew to %.1f without a backlog", l.limit)
	}
}

// TestLimiterShrinksWhenLatencyRises: a partner that slows down under load
// (its latency grows with the posts in flight past 300): the limit settles
// near where latency starts rising, before any error, and comes back up
// when the partner recovers; latency never takes it below --concurrency.
func TestLimiterShrinksWhenLatencyRises(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLimiter(48, 1024, now)
	partner := func(inflight float64) time.Duration {
		d := 50 * time.Millisecond
		if inflight > 300 {
			d += time.Duration((inflight - 300) / 300 * float64(50*time.Millisecond))
		}
		return d
	}
	var peak float64
	for range 400 {
		feed(l, &now, partner(math.Floor(l.limit)), true)
		peak = max(peak, l.limit)
	}
	if l.limit > 600 || l.limit < 250 {
		t.Fatalf("limit %.0f against a partner slowing past 300 in flight, want 250–600 (peak %.0f)", l.limit, peak)
	}
	if l.moves[moveLatency] == 0 {
		t.Fatalf("no latency cut: %v", l.moves)
	}
	if worst := partner(peak); worst > 2*partner(0) {
		t.Fatalf("the partner's latency reached %v at the peak limit %.0f: the limit backs off too late", worst, peak)
	}
	t.Logf("limit %.0f (peak %.0f), baseline %v, recent %v, moves %v", l.limit, peak, l.baseline, l.recent, l.moves)

	// A latency spike far over the threshold cuts by half at most per
	// interval, and never below the starting limit.
	for range 30 {
		feed(l, &now, 2*time.Second, true)
	}
	if l.limit != 48 {
		t.Fatalf("limit %.1f after a long spike, want the floor 48", l.limit)
	}
}

// TestLimiterHalvesOnFailure: failures halve the limit once per
// cutInterval, down to 1 (below --concurrency), and flat answers grow it
// back.
func TestLimiterHalvesOnFailure(t *testing.T) {
	now := time.Unix(1000, 0)
	l := newLimiter(64, 1024, now)
	l.failure(now)
	l.failure(now.Add(cutInterval / 2)) // the same burst
	if l.limit != 32 || l.reason != moveFailure || l.moves[moveFailure] != 1 {
		t.Fatalf("limit %.1f reason %q moves %v, want 32 after one burst", l.limit, l.reason, l.moves)
	}
	for i := range 10 {
		now = now.Add(cutInterval)
		l.failure(now)
		_ = i
	}
	if l.limit != 1 {
		t.Fatalf("limit %.2f after an outage, want 1", l.limit)
	}
	if l.allows(1) || !l.allows(0) {
		t.Fatal("limit 1 allows one post")
	}
	for range 40 {
		feed(l, &now, 20*time.Millisecond, true)
	}
	if l.limit < 64 {
		t.Fatalf("limit %.1f after recovery, want back above 64", l.limit)
	}
}
