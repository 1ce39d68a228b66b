package reporter

import (
	"os"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// TestOutageBacksOffAsAWhole: the partner answers 503 to every report for
// a while with a large backlog pending. After the first 5 s of the outage
// the reporter sends at most 50 posts/s on average (the retry budget's
// probes, not a flood), within 10 s after the outage it is back at ≥ 80 %
// of its pre-outage rate, and nothing is lost or doubled.
//
// The seconds are the reporter's (Config.Clock): the test drives a fake
// clock 4 × faster than the real one, so the retry budget, the backoff,
// the adaptive limit's intervals and --rate all run on it, and the 12 s
// outage takes 3 s. Rates are counted per second of that clock.
// PLAYPIPE_OUTAGE_FULL=1 runs the full-size version: 30 s, 3 000/s, on the
// real clock.
func TestOutageBacksOffAsAWhole(t *testing.T) {
	if testing.Short() {
		t.Skip("a timed outage")
	}
	// A steady rate (--rate) so that the backlog outlasts the outage: 250
	// reports a second of the reporter's clock, 1 000 real ones.
	n, outage, steady := 6000, 12*time.Second, 250.0
	var clk interface {
		Clock
		WaitFor(time.Duration)
	}
	if os.Getenv("PLAYPIPE_OUTAGE_FULL") == "1" {
		n, outage, steady = 150000, 30*time.Second, 3000.0
		clk = realWaits{systemClock{now: time.Now}}
	} else {
		fc := newFakeClock()
		t.Cleanup(fc.Drive(4 * time.Millisecond)) // after the reporter's stop (cleanups run last first)
		clk = fc
	}
	e := newE2E(t, 6)
	e.group = "reporter-outage"
	e.publish("outage", n, 0, 0)
	cfg := e.config()
	cfg.BackoffInitial, cfg.BackoffMax = 0, 0 // the defaults: 100 ms doubling to 10 s
	cfg.Rate = steady
	cfg.Clock = clk
	stop := e.start(cfg, e.client(testUA))

	posts := func() int64 {
		c := e.sb.Ledger().Counters["report"]
		var s int64
		for _, v := range c {
			s += v
		}
		return s
	}
	accepted := func() int64 { return e.sb.Ledger().AcceptedCount }
	since := func(t0 time.Time) time.Duration { return clk.Now().Sub(t0) }
	rate := func(window time.Duration) float64 {
		a := accepted()
		clk.WaitFor(window)
		return float64(accepted()-a) / window.Seconds()
	}
	waitFor(t, 30*time.Second, func() bool { return accepted() > int64(n/20) })
	before := rate(2 * time.Second)
	if left := int64(n) - accepted(); left < int64(n/2) {
		t.Fatalf("only %d reports left for the outage: the backlog must outlast it", left)
	}

	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate503: 1}})
	start := clk.Now()
	clk.WaitFor(5 * time.Second)
	p0, t0 := posts(), clk.Now()
	clk.WaitFor(outage - 5*time.Second)
	during := float64(posts()-p0) / since(t0).Seconds()
	e.sb.SetFaults(sandbox.Faults{})
	over := clk.Now()
	t.Logf("before the outage %.0f reports/s; during the outage (after its first 5 s of %v) %.1f posts/s", before, since(start).Round(time.Second), during)
	if during > 50 {
		t.Errorf("%.1f posts/s at a partner that answers every report 503, want ≤ 50", during)
	}

	var back time.Duration
	for back = 0; back < 10*time.Second; back = since(over) {
		if r := rate(time.Second); r >= 0.8*before {
			back = since(over)
			t.Logf("back at %.0f reports/s (≥ 80 %% of %.0f) %v after the outage", r, before, back.Round(100*time.Millisecond))
			break
		}
		if accepted() >= int64(n)-int64(before) {
			t.Fatalf("the backlog ran out before the rate could be measured")
		}
	}
	if back >= 10*time.Second {
		t.Errorf("not back at 80 %% of %.0f reports/s within 10 s of the outage", before)
	}
	e.waitLedger(3 * time.Minute)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
}

// realWaits is the real clock with WaitFor a sleep.
type realWaits struct{ systemClock }

func (realWaits) WaitFor(d time.Duration) {
	time.Sleep(d) // the real clock: a window of the scenario
}
