//go:build linux

package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
)

// TestPoisonTrackParked is the end-to-end proof of parking, every role a
// process of the built binary on Apache Kafka: a partner that answers 500
// to every report of one track (a bug on one payload; 500 is transient, so
// it is retried) no longer stops the flow.
//
//  1. A first fleet without the fault: its rate is the baseline.
//  2. A second fleet with the sandbox answering 500 to every report of one
//     track (about 3 % of its plays): every other report is delivered (the
//     rate is logged against the baseline: rates are the bench's to judge,
//     not a test's), the bad track's reports are parked with a Delivery
//     record each and `playpipe audit --list parked` lists them with their
//     last answer, never as delivered.
//  3. The fault lifted, `playpipe redrive --parked` delivers them: then
//     the partner holds every expected play, duplicates no more than the
//     posts labelled in doubt, and the audit has nothing parked or pending.
func TestPoisonTrackParked(t *testing.T) {
	// A small budget, so the test parks within seconds; a slow lane that
	// waits an hour, so only the redrive delivers the parked reports.
	r := startParkRig(t, 6, 29, "--park-after-attempts", "3", "--park-after", "2s", "--park-retries", "1h", "--backoff-max", "300ms")
	sb, testStart := r.sb, r.start

	// 1. The baseline: a fleet without the fault. (The simulator's
	// timeline is its own: each fleet's plays differ by seed.)
	t0 := time.Now()
	wantA := r.fleet("a", simArgs{events: 1500, rate: 1000, devices: 30, seed: 31, startMS: simulator.DefaultStart(time.Now())})
	nA := total(wantA)
	r.waitFor("the first fleet's plays at the partner", 3*time.Minute, func() bool { return r.distinct() >= int64(len(wantA)) })
	rateA := float64(nA) / time.Since(t0).Seconds()
	t.Logf("%s fleet a: %d reports delivered at %.0f reports/s (publish to last delivery)", since(testStart), nA, rateA)

	// 2. The bad track: the one nearest 3 % of the second fleet's plays.
	sb2 := simArgs{events: 1500, rate: 1000, devices: 30, seed: 32, startMS: simulator.DefaultStart(time.Now())}
	bad, _ := r.badTrack(sb2, 0.03)
	sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: 2 * time.Millisecond, TrackIDs: []int64{bad}, TrackStatus: 500}})
	t1 := time.Now()
	wantB := r.fleet("b", sb2)
	nB, nBad := total(wantB), 0
	for p, n := range wantB {
		if p.TrackID == bad {
			nBad += n
		}
	}
	if nBad == 0 || nBad == nB {
		t.Fatalf("track %d has %d of the second fleet's %d reports: the fault must hit some and spare others", bad, nBad, nB)
	}
	goodB := 0
	for p := range wantB {
		if p.TrackID != bad {
			goodB++
		}
	}
	goodDelivered := func() int {
		got, n := r.atPartner(), 0
		for p := range wantB {
			if p.TrackID != bad && got[p] > 0 {
				n++
			}
		}
		return n
	}
	r.waitFor("every other report of the second fleet at the partner", 3*time.Minute, func() bool { return goodDelivered() >= goodB })
	rateB := float64(nB-nBad) / time.Since(t1).Seconds()
	t.Logf("%s fleet b: %d reports, %d of track %d answered 500 each time; the other %d delivered at %.0f reports/s (%.0f %% of fleet a's rate)",
		since(testStart), nB, nBad, bad, nB-nBad, rateB, 100*rateB/rateA)

	// The bad track's reports are parked, durably: the audit lists them.
	// A report's budget runs while the partner takes other reports (an
	// outage of the whole partner parks nothing): a third fleet goes on
	// publishing slowly, as fleets do, while the second's bad reports are
	// parked. Its own reports of the bad track may be parked or still
	// failing when the fault is lifted; either way they end delivered.
	simC := r.startFleet("c", simArgs{events: 600, rate: 30, devices: 10, seed: 33, startMS: simulator.DefaultStart(time.Now())})
	var rep analytics.Audit
	r.waitFor("the audit to count the second fleet's parked plays", 3*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked >= uint64(nBad)
	})
	wantC := r.fleetWant("c", simC)
	nBadC := 0
	for p, n := range wantC {
		if p.TrackID == bad {
			nBadC += n
		}
	}
	rep = r.audit()
	if rep.Parked < uint64(nBad) || rep.Parked > uint64(nBad+nBadC) {
		t.Errorf("the audit counts %d parked plays, want %d of the second fleet and at most %d more of the third (track %d)", rep.Parked, nBad, nBadC, bad)
	}
	// Each row's own last answer: a count over the whole output would also
	// count "500" in ids, times and the header.
	rows, with500 := auditList(t, r.bin, r.chArgs, "parked"), 0
	for _, row := range rows {
		if strings.Contains(row.Detail, "HTTP 500 ") {
			with500++
		}
	}
	if with500 < nBad {
		t.Errorf("audit --list parked shows %d of %d rows with the last answer 500, want %d (first %+v)", with500, len(rows), nBad, firstRows(rows, 3))
	}
	for p := range wantB {
		if p.TrackID == bad && r.atPartner()[p] > 0 {
			t.Fatalf("a report of track %d is at the partner while every post of it was answered 500", bad)
		}
	}
	t.Logf("%s %d plays parked and listed by the audit; delivered %d, pending %d", since(testStart), rep.Parked, rep.Delivered, rep.Pending)

	// 3. The fault lifted, redrive delivers the parked reports.
	sb.SetFaults(sandbox.Faults{})
	redrive := append(append(append([]string{"redrive"}, r.kafkaArgs...), r.chArgs...), "--api-url", sb.URL, "--parked",
		"--track", strconv.FormatInt(bad, 10), "--reason", fmt.Sprintf("partner fixed track %d", bad), "--rate", "0", "--concurrency", "16")
	rd := r.ps.Start("redrive", redrive...) // the sandbox's credentials in its environment
	code := rd.Wait(t, 2*time.Minute)
	rdOut, _ := os.ReadFile(rd.Log)
	if code != 0 {
		t.Fatalf("playpipe redrive --parked exited %d:\n%s", code, rdOut)
	}
	t.Logf("redrive: %s", lastLine(string(rdOut)))
	want := merge(wantA, wantB, wantC)
	r.waitFor("every play at the partner", 2*time.Minute, func() bool { return r.distinct() >= int64(len(want)) })
	r.waitFor("the audit to see the parked plays delivered", 2*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked == 0 && rep.Delivered >= uint64(total(want))
	})
	r.stopAll()
	led := sb.Ledger()
	missing, dups, unexpected := compare(want, r.atPartner())
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Errorf("the partner's ledger differs: %d missing (first %v), %d unexpected (first %v)", len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3))
	}
	inDoubt, _, _ := readDeliveries(t, r.k)
	t.Logf("partner: %d accepted, %d duplicates; %d delivered reports labelled in doubt; audit: delivered %d, parked %d, pending %d",
		led.AcceptedCount, dups, inDoubt, rep.Delivered, rep.Parked, rep.Pending)
	if dups > inDoubt {
		t.Errorf("%d duplicates at the partner, more than the %d posts labelled in doubt", dups, inDoubt)
	}
	if rep.Pending != 0 || rep.Parked != 0 {
		t.Errorf("audit after the redrive: %d pending, %d parked, want none", rep.Pending, rep.Parked)
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
