package reporter

import (
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// TestKillAt512InFlight: the reporter process posts with 512 in flight to
// a partner 250 ms away (far enough that even a -race child on two shared
// cores keeps all 512 posts out: 2 048 reports/s) (the in-flight the commit metadata capped at about
// 200 before progress format 2), two partitions, and is killed with SIGKILL
// mid-run, then restarted. The crash promise holds unchanged: no report
// whose final outcome was recorded is posted again, every report the
// partner has twice is labelled in doubt (the audit's doubles bound the
// partner's from above), and the re-posts stay within what was at stake.
func TestKillAt512InFlight(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	const (
		n    = 20000
		conc = 512
	)
	e := newE2EApache(t, 2)
	const latency = 250 * time.Millisecond
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: latency}})
	e.group = "reporter-kill512"
	e.publish("kill512", n, 0, 0)
	watch := e.watchMetadata()
	c := e.startChild(0, conc)
	// The rate between a tenth and a fifth of the reports says how many
	// posts were in flight (Little's law): logged, not asserted (2 shared
	// cores under -race).
	waitFor(t, 90*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= n/10 })
	a0, t0 := e.sb.Ledger().AcceptedCount, time.Now()
	waitFor(t, 90*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= n/5 })
	rate := float64(e.sb.Ledger().AcceptedCount-a0) / time.Since(t0).Seconds()
	stopChild(t, c, syscall.SIGKILL)
	first := c.out.String()
	l := e.sb.Ledger()
	t.Logf("killed after %d accepted; %.0f reports/s just before (≈ %.0f in flight at %v)", l.AcceptedCount, rate, rate*latency.Seconds(), latency)

	c = e.startChild(0, conc)
	e.waitLedger(120 * time.Second)
	stopChild(t, c, syscall.SIGTERM)
	longest := watch()
	t.Logf("longest commit metadata %d bytes (Kafka's default bound %d)", longest, DefaultMetadataMaxBytes)
	if longest > DefaultMetadataMaxBytes {
		t.Errorf("a commit carried %d bytes of metadata: a broker with default settings refuses it", longest)
	}
	dups := e.checkExactlyOnce(true)
	e.checkAllCommitted()
	e.checkDeliveries(false)
	inDoubt := e.checkCrashPromise()
	// At stake at a kill: ≤ 2 × the limit (posts on the wire and answers on
	// their way to Kafka); reports leased ahead are labelled but never
	// posted twice.
	t.Logf("kill -9 at %d in flight: %d of %d reports posted twice, %d labelled in doubt", conc, dups, n, len(inDoubt))
	if dups > 2*conc {
		t.Errorf("%d reports posted twice: more than at stake at the kill (≤ %d)", dups, 2*conc)
	}
	if len(inDoubt) < dups {
		t.Errorf("only %d reports labelled in doubt, but the partner has %d duplicates", len(inDoubt), dups)
	}
	if t.Failed() {
		t.Logf("first process output:\n%s\nsecond process output:\n%s", first, c.out.String())
	}
}

// checkCrashPromise checks what a crash may and may not cause: every
// report the partner holds twice is labelled in doubt (the audit's doubles
// bound the partner's from above), and no report is posted again after its
// final outcome was recorded. It returns the reports labelled in doubt.
func (e *e2e) checkCrashPromise() (inDoubt map[string]bool) {
	e.t.Helper()
	inDoubt, recorded := e.deliveredRecords()
	for id, k := range e.ledgerCounts() {
		if k > 1 && !inDoubt[id] {
			e.t.Errorf("report %s accepted %d times but not labelled in doubt: the audit would under-count", id, k)
		}
	}
	for id, k := range recorded {
		if k > 1 {
			e.t.Errorf("report %s has %d delivered records: posted again after its final outcome was recorded", id, k)
		}
	}
	return inDoubt
}
