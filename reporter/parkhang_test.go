package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// TestHangingTrackParkedWithoutAPost: once a suspect track's budget is
// spent (its reports' failures together, 3 over a minute here), the
// coordinator's next pass takes every report of the track waiting — a
// retry waiting its backoff, a retry due, a fresh report aside, a fresh one
// leased and not posted — out of its queue to be parked without a post, and
// a fresh report of the track taken later goes the same way; none of them
// is handed to a worker. Reports of other tracks stay where they are. A
// report whose post is out at that moment is not touched: its failure
// parks it. The parked record repeats the last answer without its doubt
// cause (nothing was sent), or says the report was not posted.
func TestHangingTrackParkedWithoutAPost(t *testing.T) {
	clk := newFakeClock()
	met, err := newMetrics(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &Reporter{cfg: Config{Concurrency: 8, MaxConcurrency: 64, ParkAfterAttempts: 3, ParkAfter: time.Minute, Clock: clk,
		Logger: testLogger(t), PartnerURL: "http://partner.test"}.withDefaults(), met: met}
	r.log = r.cfg.Logger
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	rn := r.newRun(ctx, cancel)
	ps := &partState{key: tpKey{"p.reports", 0}, unsure: map[*job]struct{}{}, recovered: map[int64]recState{}}
	rn.parts[ps.key] = ps
	const hanging, other = 777, 42
	var off int64
	mk := func(track int64, attempt int) *job {
		rec := &kgo.Record{Topic: "p.reports", Offset: off}
		j := &job{ps: ps, seq: ps.wm.add(off, 0, clk.Now().UnixNano()), rec: rec, id: fmt.Sprintf("r-%d", off),
			body: fmt.Appendf(nil, `{"trackid":%d}`, track), track: track, attempt: attempt, failures: attempt}
		off++
		if attempt > 0 {
			// Posted before: its last answer a timeout, in doubt.
			j.dec = delivery.Decision{Action: delivery.ActRetry, Outcome: schemas.OutcomeRetry, Reason: delivery.ReasonTimeout,
				Doubt: schemas.DoubtTimeout, Err: context.DeadlineExceeded, Signal: delivery.SignalTimeout}
			j.inDoubt = true
			rn.active[j.id] = j
		}
		return j
	}
	out1, out2 := mk(hanging, 1), mk(hanging, 1) // posts out
	waiting := mk(hanging, 2)                    // its backoff
	due := mk(hanging, 1)                        // due, waiting for a retry slot
	aside := mk(hanging, 0)                      // fresh, waiting for a slot of its suspect track
	leased := mk(hanging, 0)                     // fresh, leased, not posted
	fresh := mk(hanging, 0)                      // fresh, not taken yet
	otherWaiting, otherFresh := mk(other, 2), mk(other, 0)

	rn.mu.Lock()
	sus := &rn.thr.lim.sus
	sus.stalled(hanging, clk.Now())
	sus.stalled(hanging, clk.Now().Add(2*time.Second))
	for _, j := range []*job{waiting, otherWaiting} {
		j.readyAt = clk.Now().Add(time.Hour)
		rn.delayed.add(j)
	}
	rn.ready.push(due)
	rn.aside.push(aside)
	rn.active[leased.id] = leased
	leased.leasedOnly, leased.suspect, leased.suspectSlot = true, true, true
	rn.suspectSlots++
	ps.unsure[leased] = struct{}{}
	rn.leased.push(leased)
	rn.fresh.push(fresh)
	rn.fresh.push(otherFresh)
	rn.inflight = 2 // out1, out2

	// out1's failures spend the track's budget (others answered in
	// between): the third is a minute after the first.
	spent := 0
	for i := 1; i <= 3 && spent == 0; i++ {
		clk.Advance(30 * time.Second)
		rn.successes += 10
		if rn.budgetSpent(out1) {
			spent = i
		}
	}
	if spent == 0 || !sus.hangs(hanging) {
		rn.mu.Unlock()
		t.Fatalf("the track's budget (3 failures over a minute) not spent by 3 failures 30 s apart (spent at %d, hangs %v)", spent, sus.hangs(hanging))
	}
	rn.mu.Unlock()

	// One coordinator pass.
	batch := rn.takeHanging()
	want := []*job{waiting, due, aside, leased}
	for _, j := range want {
		if !slices.Contains(batch, j) {
			t.Errorf("report %s (attempt %d) of the hanging track not queued for parking in one pass", j.id, j.attempt)
		}
	}
	for _, j := range batch {
		if !slices.Contains(want, j) {
			t.Errorf("report %s (track %d) queued for parking, want only the hanging track's waiting reports", j.id, j.track)
		}
	}

	rn.mu.Lock()
	if slices.Contains(rn.delayed, waiting) || !slices.Contains(rn.delayed, otherWaiting) || rn.ready.len() != 0 || rn.aside.len() != 0 || rn.leased.len() != 0 {
		t.Errorf("after the pass: delayed %d (the other track's kept: %v), ready %d, aside %d, leased %d; want the hanging track's gone, the other's kept",
			len(rn.delayed), slices.Contains(rn.delayed, otherWaiting), rn.ready.len(), rn.aside.len(), rn.leased.len())
	}
	if leased.leasedOnly || rn.suspectSlots != 0 {
		t.Errorf("the leased report's lease not given up (leasedOnly %v) or its slot kept (%d held)", leased.leasedOnly, rn.suspectSlots)
	}
	// Leasing goes on: the hanging track's fresh report is queued for
	// parking, the other track's leased; no worker gets a hanging one.
	l, _ := rn.takeLease()
	if l == nil || len(l.jobs) != 1 || l.jobs[0] != otherFresh {
		t.Errorf("lease after the pass: %v, want the other track's fresh report alone", l)
	}
	if !slices.Contains(rn.hangPark, fresh) {
		t.Errorf("the hanging track's fresh report, taken, not queued for parking")
	}
	rn.leased.push(otherFresh)
	if j := rn.next(); j != otherFresh {
		t.Errorf("next: %v, want the other track's report", j)
	}
	ps.mu.Lock()
	inflight := ps.inflight
	ps.mu.Unlock()
	if inflight != 6 { // the five queued (1 posted: otherFresh)
		t.Errorf("partition in flight %d, want 6: the five queued for parking count until their park is on record, and one post", inflight)
	}
	// The post out is parked at its failure, not before.
	if slices.Contains(batch, out2) || slices.Contains(rn.hangPark, out2) {
		t.Error("a report whose post is out was queued for parking")
	}
	clk.Advance(30 * time.Second)
	rn.successes++
	if !rn.budgetSpent(out2) || !out2.trackHangs {
		t.Error("the report out when the track's budget ran out is not parked at its failure")
	}
	rn.mu.Unlock()

	// The records: the last answer without its own doubt cause, or "not
	// posted".
	for _, c := range []struct {
		j       *job
		attempt int
		reason  string
		msg     string
		inDoubt bool
	}{{waiting, 2, delivery.ReasonTimeout, hangNoRepost, true}, {aside, 0, "", hangNotPosted, false}} {
		c.j.dec = hangDecision(c.j)
		rec := rn.deliveryRecord(context.Background(), c.j)
		asParked(rec)
		var del schemas.Delivery
		if err := json.Unmarshal(rec.Value, &del); err != nil {
			t.Fatal(err)
		}
		src := ""
		for _, h := range rec.Headers {
			if h.Key == schemas.HeaderSource {
				src = string(h.Value)
			}
		}
		if del.Outcome != schemas.OutcomeParked || del.Attempt != c.attempt || del.Reason != c.reason || del.DoubtCause != "" ||
			del.InDoubt != c.inDoubt || !strings.HasPrefix(del.Message, c.msg) || !strings.HasSuffix(src, ":fp") {
			t.Errorf("parked record of %s: %+v, source %q; want parked, attempt %d, reason %q, no doubt cause, in doubt %v, message %q…, source …:fp",
				c.j.id, del, src, c.attempt, c.reason, c.inDoubt, c.msg)
		}
		if e := rn.parkEntry(c.j); e.Attempts != c.attempt || !strings.HasPrefix(e.Message, c.msg) {
			t.Errorf("parked entry of %s: attempts %d, message %q", c.j.id, e.Attempts, e.Message)
		}
	}

	// A post of the track answered: it no longer hangs, its next fresh
	// report is leased.
	rn.mu.Lock()
	defer rn.mu.Unlock()
	sus.answered(hanging)
	again := mk(hanging, 0)
	rn.fresh.push(again)
	if l, _ := rn.takeLease(); l == nil || len(l.jobs) != 1 || l.jobs[0] != again {
		t.Errorf("a fresh report of the track answered again: lease %v, want it leased", l)
	}
}
