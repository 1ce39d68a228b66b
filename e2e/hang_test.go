//go:build linux

package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/producer/simulator"
)

// TestHangingTrackParked: a partner that hangs on one track — the sandbox
// holds every report of it past the reporter's --api-timeout, the way an
// upstream timeout behind a partner's gateway looks — stops nothing. Every
// role a process of the built binary on Apache Kafka (one node), the
// reporter's flags the defaults but a shorter --api-timeout and budget, so
// the test takes minutes:
//
//  1. A first fleet without the fault: its rate is the baseline.
//  2. A second fleet with every report of one track (about 2.5 % of its
//     plays) held 3 s, past the 2 s timeout: every other report delivered
//     (the rate logged against the baseline), the reporter warns of the
//     stall within a minute, and, while a third fleet keeps the partner
//     answering, the hanging reports are parked with reason timeout and
//     listed by the audit. The reporter never exits. The alert rules are
//     evaluated on its real /metrics.
//  3. The fault lifted, the slow lane delivers them: every play exactly
//     once at the partner (the held posts were never accepted), nothing
//     parked or pending in the audit.
//
// With PLAYPIPE_HANG_DEFAULTS=1 the reporter runs with its default flags
// (--api-timeout 30s, the hold 35 s, the budget 20 failures over 10
// minutes of others' answers) and the first two fleets are of 8 800 events
// each (~48 000 reports, ~8 000 a partition: within the progress window
// that a hanging report at a partition's commit point leaves, see
// docs/reporter.md, Known limits), the third of 20 000 at 25 a second
// (13 minutes). Once the track's budget is spent (suspect.go) its reports
// waiting are parked without another post (parkhang.go): every hanging
// report of the second fleet must be parked and listed by the audit within
// the budget plus the time to the track's first failure, three timeouts and
// a margin (14.5 minutes after the fault); then the fault is lifted and the
// slow lane delivers them, every play exactly once. About 25 minutes; not
// part of make test.
func TestHangingTrackParked(t *testing.T) {
	// The defaults but the timeout (2 s: the hold is 3 s) and the budget
	// (3 failures over 10 s, where the defaults ask 20 over 10 minutes), and
	// a slow lane retrying every 5 s, so that the parked reports are
	// delivered soon after the fault is lifted.
	apiTimeout, hold, fleetEvents := 2*time.Second, 3*time.Second, 1500
	reportFlags := []string{"--api-timeout", apiTimeout.String(), "--park-after-attempts", "3", "--park-after", "10s", "--park-retries", "5s"}
	defaults := os.Getenv("PLAYPIPE_HANG_DEFAULTS") == "1"
	if defaults {
		apiTimeout, hold, fleetEvents = partnerapi.DefaultRequestTimeout, partnerapi.DefaultRequestTimeout+5*time.Second, 8800
		reportFlags = nil
	}
	r := startParkRig(t, 6, 33, reportFlags...)
	sb, testStart, report, plain := r.sb, r.start, r.report, r.plain
	fleet, atPartner, waitFor := r.fleet, r.atPartner, r.waitFor

	// 1. The baseline.
	t0 := time.Now()
	wantA := fleet("a", simArgs{events: fleetEvents, rate: 1000, devices: 30, seed: 41, startMS: simulator.DefaultStart(time.Now())})
	nA := total(wantA)
	waitFor("the first fleet's plays at the partner", 3*time.Minute, func() bool { return r.distinct() >= int64(len(wantA)) })
	rateA := float64(nA) / time.Since(t0).Seconds()
	t.Logf("%s fleet a: %d reports delivered at %.0f reports/s (publish to last delivery)", since(testStart), nA, rateA)

	// 2. The hanging track: the one nearest 2.5 % of the second fleet's
	// plays (generated in-process first: the same messages).
	sbArgs := simArgs{events: fleetEvents, rate: 1000, devices: 30, seed: 42, startMS: simulator.DefaultStart(time.Now())}
	bad, _ := r.badTrack(sbArgs, 0.025)
	hang := plain
	hang.Report.TrackIDs, hang.Report.Hold = []int64{bad}, hold
	sb.SetFaults(hang)
	faultAt := time.Now()
	t1 := time.Now()
	wantB := fleet("b", sbArgs)
	nB, nBad := total(wantB), 0
	goodB := 0
	for p, n := range wantB {
		if p.TrackID == bad {
			nBad += n
		} else {
			goodB++
		}
	}
	if nBad == 0 || nBad == nB {
		t.Fatalf("track %d has %d of the second fleet's %d reports: the fault must hit some and spare others", bad, nBad, nB)
	}
	goodDelivered := func() int {
		if r.distinct() < int64(len(wantA)+goodB) {
			return 0 // not yet: the exact count below reads the whole ledger
		}
		got, n := atPartner(), 0
		for p := range wantB {
			if p.TrackID != bad && got[p] > 0 {
				n++
			}
		}
		return n
	}
	waitFor("every other report of the second fleet at the partner", 3*time.Minute, func() bool { return goodDelivered() >= goodB })
	rateB := float64(nB-nBad) / time.Since(t1).Seconds()
	t.Logf("%s fleet b: %d reports, %d of track %d held %v each time (past --api-timeout %v); the other %d delivered at %.0f reports/s (%.0f %% of fleet a's rate)",
		since(testStart), nB, nBad, bad, hold, apiTimeout, nB-nBad, rateB, 100*rateB/rateA)

	// A third fleet keeps the partner answering while the budgets run (a
	// report's budget moves only while other reports are answered).
	eventsC, parkWait := 1200, 3*time.Minute
	if defaults {
		eventsC, parkWait = 20000, 16*time.Minute
	}
	cStart := time.Now()
	simC := r.startFleet("c", simArgs{events: eventsC, rate: 25, devices: 10, seed: 43, startMS: simulator.DefaultStart(time.Now())})

	// Loud: a warning naming the track within a minute of the fault (the
	// time its line carries): the stall warning (reports failing again and
	// again), or — when the track's budget runs out before any of its
	// reports failed twice, its waiting reports then parked without another
	// post (CI: all 208 parked 9–20 s after the fault, no report failing
	// twice, so no stall warning) — the first of its reports' park
	// warnings. With the default 30 s timeout a report fails twice 60–70 s
	// after the fault: the warning is due within a minute of that.
	stallDue := time.Minute
	if defaults {
		stallDue += 2*apiTimeout + 10*time.Second
	}
	badTrack := strconv.FormatInt(bad, 10)
	var stallLine string
	waitFor("the reporter's warning of the hanging track", stallDue, func() bool {
		b, _ := os.ReadFile(report.p.Log)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "delivery stalled") || strings.Contains(line, "report parked") && strings.Contains(line, "track_id="+badTrack+" ") {
				stallLine = line
				return true
			}
		}
		return false
	})
	ts, _, _ := strings.Cut(strings.TrimPrefix(stallLine, "time="), " ")
	warnedAt, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		t.Fatalf("the warning's time: %v: %s", err, stallLine)
	}
	t.Logf("%s the reporter warned %v after the fault: %s", since(testStart), warnedAt.Sub(faultAt).Round(time.Second), stallLine)
	if warnedAt.Sub(faultAt) > stallDue {
		t.Errorf("the warning came %v after the fault, want within %v", warnedAt.Sub(faultAt), stallDue)
	}
	switch {
	case strings.Contains(stallLine, "delivery stalled"):
		if !strings.Contains(stallLine, badTrack) || !strings.Contains(stallLine, "last_status=timeout") {
			t.Errorf("the stall warning does not name track %d and the timeout: %s", bad, stallLine)
		}
	case !strings.Contains(stallLine, "reason=timeout") && !strings.Contains(stallLine, "its track hangs"):
		t.Errorf("the park warning of track %d's report says neither the timeout nor that its track hangs: %s", bad, stallLine)
	}

	var rep analytics.Audit
	if defaults {
		// Once the track's budget is spent (20 failures over 10 minutes of
		// others' answers, from its first failure, 30–70 s after the fault)
		// every report of it waiting is parked without another post, the
		// posts out at their failure: all of the second fleet's within the
		// budget plus three timeouts and a margin. The second fleet's
		// parked plays are those recorded before the third fleet began.
		parkWait = partnerapi.DefaultRequestTimeout*2 + 10*time.Minute + 3*apiTimeout + 2*time.Minute
		by := faultAt.Add(parkWait)
		parkedB := 0
		for {
			if rep = r.audit(); rep.Parked >= uint64(nBad) {
				parkedB = 0
				for _, row := range auditList(t, r.bin, r.chArgs, "parked") {
					if row.At.Before(cStart) {
						parkedB++
					}
				}
				if parkedB >= nBad {
					break
				}
			}
			if time.Now().After(by) {
				r.ps.DumpLogs(30)
				t.Fatalf("%d of the second fleet's %d hanging reports parked %v after the fault (audit: %d parked), want all within %v",
					parkedB, nBad, time.Since(faultAt).Round(time.Second), rep.Parked, parkWait)
			}
			for _, x := range r.live {
				if !x.p.Running() {
					t.Fatalf("%s exited on its own: %v (log %s)", x.name, x.p.Err, x.p.Log)
				}
			}
			time.Sleep(5 * time.Second)
		}
		first, last, unposted, n := parkLog(t, report.p.Log, bad)
		t.Logf("%s all %d hanging reports of the second fleet parked and listed %v after the fault (the reporter's log: %d parked, the first %v and the last %v after the fault, %d of them without another post)",
			since(testStart), nBad, time.Since(faultAt).Round(time.Second), n, first.Sub(faultAt).Round(time.Second), last.Sub(faultAt).Round(time.Second), unposted)
		if unposted == 0 {
			t.Errorf("no report of the hanging track was parked without another post")
		}
	} else {
		waitFor("the audit to count the second fleet's parked plays", parkWait, func() bool {
			rep = r.audit()
			return rep.Parked >= uint64(nBad)
		})
	}
	parkedAfter := time.Since(faultAt)
	if defaults {
		simC.Wait(t, 10*time.Minute) // 13 minutes at 25 events/s
	}
	wantC := r.fleetWant("c", simC)
	rows := auditList(t, r.bin, r.chArgs, "parked")
	// Each with its reason: its last answer a timeout, or not posted
	// (parked without a post once its track's budget was spent).
	timeouts := 0
	for _, row := range rows {
		if strings.Contains(row.Detail, "timeout") || strings.Contains(row.Detail, "not posted: its track hangs") {
			timeouts++
		}
	}
	if timeouts < nBad {
		t.Errorf("audit --list parked: %d of %d rows with the last answer a timeout or not posted (its track hangs), want ≥ %d (first %+v)", timeouts, len(rows), nBad, firstRows(rows, 2))
	}
	got := atPartner()
	for p := range wantB {
		if p.TrackID == bad && got[p] > 0 {
			t.Fatalf("a report of track %d is at the partner while every post of it was held past the timeout", bad)
		}
	}
	t.Logf("%s %d plays parked (reason timeout, or not posted: its track hangs) %v after the fault and listed by the audit; delivered %d, pending %d",
		since(testStart), rep.Parked, parkedAfter.Round(time.Second), rep.Delivered, rep.Pending)

	// The reporter's real /metrics: the stuck and parked alerts read series
	// it exports, as it exports them.
	resp, err := http.Get("http://" + report.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	exposition, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	checkAlertRules(t, exposition, reportAlerts)

	// 3. The fault lifted: the slow lane delivers the parked reports.
	sb.SetFaults(plain)
	want := merge(wantA, wantB, wantC)
	// With the defaults the slow lane retries a parked report 1 minute
	// after it was parked, then 5 minutes after that (--park-retries
	// 1m,5m,30m,1h): those retried while the fault was on are due within
	// about 5 minutes of the lift.
	liftWait := 3 * time.Minute
	if defaults {
		liftWait = 12 * time.Minute
	}
	liftedAt := time.Now()
	waitFor("every play at the partner", liftWait, func() bool { return r.distinct() >= int64(len(want)) })
	t.Logf("%s every play at the partner %v after the fault was lifted", since(testStart), time.Since(liftedAt).Round(time.Second))
	waitFor("the audit to see the parked plays delivered", 2*time.Minute, func() bool {
		rep = r.audit()
		return rep.Parked == 0 && rep.Delivered >= uint64(total(want))
	})
	r.stopAll()
	led := sb.Ledger()
	missing, dups, unexpected := compare(want, atPartner())
	if len(missing) > 0 || len(unexpected) > 0 || dups > 0 {
		t.Errorf("the partner's ledger differs: %d missing (first %v), %d duplicates, %d unexpected (first %v)", len(missing), firstPlays(missing, 3), dups, len(unexpected), firstPlays(unexpected, 3))
	}
	t.Logf("partner: %d accepted, %d duplicates, %d held posts injected; audit: delivered %d, parked %d, pending %d",
		led.AcceptedCount, dups, led.InjectedCount, rep.Delivered, rep.Parked, rep.Pending)
	if rep.Pending != 0 || rep.Parked != 0 {
		t.Errorf("audit after the fault was lifted: %d pending, %d parked, want none", rep.Pending, rep.Parked)
	}
}

// auditList runs `playpipe audit --list name --limit 0 --format json` and
// returns its rows (all of them).
func auditList(t *testing.T, bin string, chArgs []string, name string) []analytics.ListRow {
	t.Helper()
	out, code := runBinary(t, bin, append(append([]string{"audit"}, chArgs...), "--from", "-2h", "--to", "+1h", "--list", name, "--limit", "0", "--format", "json")...)
	if code != 0 && code != 3 {
		t.Fatalf("playpipe audit --list %s exited %d:\n%s", name, code, out)
	}
	// The JSON array starts a line of its own (logs go before it).
	js := out
	if i := strings.LastIndex(out, "\n["); i >= 0 {
		js = out[i+1:]
	}
	var rows []analytics.ListRow
	if err := json.Unmarshal([]byte(js), &rows); err != nil {
		t.Fatalf("playpipe audit --list %s --format json: %v\n%s", name, err, out)
	}
	return rows
}

func firstRows(rows []analytics.ListRow, n int) []analytics.ListRow { return rows[:min(n, len(rows))] }

// parkLog reads the reporter's "report parked" lines of track: how many,
// the first and the last one's time, and how many were parked without
// another post (their track hanging).
func parkLog(t *testing.T, path string, track int64) (first, last time.Time, unposted, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tr := "track_id=" + strconv.FormatInt(track, 10) + " "
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "report parked") || !strings.Contains(line, tr) {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		if n == 0 {
			first = at
		}
		last = at
		n++
		if strings.Contains(line, "without another post") || strings.Contains(line, "not posted") {
			unposted++
		}
	}
	return first, last, unposted, n
}
