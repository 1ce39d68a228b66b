package reporter

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
)

// inDoubtDelivered counts the reports whose delivered record is labelled in
// doubt: what the audit reports as possibly delivered twice.
func (e *e2e) inDoubtDelivered() int { return len(e.doubts()) }

// doubts returns the report ids with a delivered record labelled in doubt,
// and recordedTwice those with more than one delivered record.
func (e *e2e) doubts() (inDoubt map[string]bool) {
	inDoubt, _ = e.deliveredRecords()
	return inDoubt
}

func (e *e2e) deliveredRecords() (inDoubt map[string]bool, recorded map[string]int) {
	inDoubt, recorded = map[string]bool{}, map[string]int{}
	for _, d := range e.deliveries() {
		if d.Outcome == schemas.OutcomeDelivered {
			recorded[d.ReportID]++
			if d.InDoubt {
				inDoubt[d.ReportID] = true
			}
		}
	}
	return inDoubt, recorded
}

// stopChild sends sig to c and waits for it; SIGTERM must end in exit 0.
func stopChild(t *testing.T, c *child, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	err := c.cmd.Wait()
	if sig == syscall.SIGTERM && err != nil {
		t.Fatalf("reporter did not stop cleanly on SIGTERM: %v\n%s", err, c.out.String())
	}
}

// waitResume waits until the ledger grows past from and returns how long
// it took from since.
func (e *e2e) waitResume(t *testing.T, from int64, since time.Time, timeout time.Duration) time.Duration {
	t.Helper()
	waitFor(t, timeout, func() bool { return e.sb.Ledger().AcceptedCount > from })
	return time.Since(since)
}

// TestKillThreeTimes: the reporter process (concurrency 48, no rate limit)
// is killed with SIGKILL three times mid-run and restarted each time with
// the same static instance id. Every report ends in the partner's ledger;
// the reports posted twice are only posts whose answer was not on record at
// a kill, never a report whose final outcome was recorded; every one of
// them is labelled in doubt, so the audit's "possibly twice" bounds the
// partner's duplicates from above; each restart resumes within 10 s.
func TestKillThreeTimes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	const (
		n    = 6000
		conc = 48
	)
	e := newE2E(t, 6)
	e.group = "reporter-kill3"
	e.publish("kill3", n, 0, 0)
	instance := "PLAYPIPE_REPORTER_CHILD_INSTANCE=reporter-0"
	c := e.startChild(0, conc, instance)
	var outs []string
	for k := 1; k <= 3; k++ {
		waitFor(t, 60*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= int64(k*n/4) })
		stopChild(t, c, syscall.SIGKILL)
		outs = append(outs, c.out.String())
		l := e.sb.Ledger()
		t.Logf("kill %d: %d accepted, %d duplicates so far", k, l.AcceptedCount, l.Duplicates)
		start := time.Now()
		c = e.startChild(0, conc, instance)
		took := e.waitResume(t, l.AcceptedCount+conc, start, 30*time.Second)
		t.Logf("restart %d resumed delivery %v after starting", k, took.Round(10*time.Millisecond))
		if took > 10*time.Second {
			t.Errorf("restart %d resumed delivery only after %v (want ≤ 10s)", k, took)
		}
	}
	e.waitRestartDone(90*time.Second, 60*time.Second)
	stopChild(t, c, syscall.SIGTERM)
	outs = append(outs, c.out.String())
	dups := e.checkExactlyOnce(true)
	e.checkAllCommitted()
	e.checkDeliveries(false)
	inDoubt, recorded := e.deliveredRecords()
	counts := e.ledgerCounts()
	// Every report the partner has twice was re-posted because its first
	// answer never reached Kafka (in flight, or on its way to Kafka, at the
	// kill): it is labelled in doubt, and it has one delivered record.
	for id, c := range counts {
		if c > 1 && !inDoubt[id] {
			t.Errorf("report %s accepted %d times but not labelled in doubt: the audit would under-count", id, c)
		}
	}
	// A report whose delivered outcome was on record is never posted again.
	for id, c := range recorded {
		if c > 1 {
			t.Errorf("report %s has %d delivered records: posted again after its final outcome was recorded", id, c)
		}
	}
	// Posts without a recorded answer at a kill: at most --concurrency on
	// the wire, plus the answers on their way to Kafka (about rate × produce
	// latency). Twice the concurrency per kill bounds both here.
	t.Logf("3 kills: %d of %d reports posted twice (%d per kill; concurrency %d), %d delivered reports labelled in doubt",
		dups, n, dups/3, conc, len(inDoubt))
	if dups > 3*2*conc {
		t.Errorf("%d reports posted twice: more than the posts without a recorded answer at 3 kills can be (≤ %d)", dups, 3*2*conc)
	}
	if len(inDoubt) < dups {
		t.Errorf("only %d reports labelled in doubt, but the partner has %d duplicates: the audit would under-count", len(inDoubt), dups)
	}
	if t.Failed() {
		for i, o := range outs {
			t.Logf("process %d output:\n%s", i+1, o)
		}
	}
}

// TestSigtermDuringStorm: SIGTERM while 30% of posts are answered 503 (many
// reports waiting in backoff, many later ones final past the commit point),
// then a restart and a drain: nothing missing, nothing posted twice, nothing
// in doubt. The same after a standby window that follows the storm.
func TestSigtermDuringStorm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	for _, standby := range []bool{false, true} {
		t.Run(fmt.Sprintf("standby=%v", standby), func(t *testing.T) {
			const (
				n    = 6000
				conc = 48
			)
			e := newE2E(t, 6)
			e.group = fmt.Sprintf("reporter-term-%v", standby)
			e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate503: 0.3}})
			e.publish("term", n, 0, 0)
			c := e.startChild(0, conc)
			waitFor(t, 60*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= n/3 })
			if standby {
				e.sb.SetFaults(sandbox.Faults{})
				e.sb.SetMode(sandbox.ModeStandby)
				waitFor(t, 30*time.Second, func() bool { return e.sb.Ledger().StandbyCount > 0 })
				time.Sleep(200 * time.Millisecond) // a real wait (scenario): the child is in the standby episode for a while before its SIGTERM
			}
			stopChild(t, c, syscall.SIGTERM)
			first := c.out.String()
			l := e.sb.Ledger()
			t.Logf("SIGTERM after %d accepted (%d standby answers)", l.AcceptedCount, l.StandbyCount)
			if standby {
				e.sb.SetMode(sandbox.ModeLive)
			}
			c = e.startChild(0, conc)
			time.Sleep(time.Second) // a real wait (scenario): the restarted child (its own clock) works in the storm for a second
			e.sb.SetFaults(sandbox.Faults{})
			e.waitRestartDone(90*time.Second, 60*time.Second)
			stopChild(t, c, syscall.SIGTERM)
			dups := e.checkExactlyOnce(false)
			e.checkAllCommitted()
			e.checkDeliveries(false)
			doubt := e.inDoubtDelivered()
			t.Logf("SIGTERM mid-storm, restart, drain: %d duplicates, %d in doubt", dups, doubt)
			if doubt != 0 {
				t.Errorf("%d reports in doubt after a graceful stop, want 0", doubt)
			}
			if t.Failed() {
				t.Logf("first process output:\n%s\nsecond process output:\n%s", first, c.out.String())
			}
		})
	}
}
