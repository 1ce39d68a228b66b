package reporter

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// childTrack is the child reporter's partner for the parking kill test:
// every report of one track goes to a sandbox that answers 500 while a
// file exists (the parent removes it to lift the fault).
type childTrack struct {
	good, bad *partnerapi.Client
	track     int64
	while     string
}

func childBadTrack(t *testing.T, log *slog.Logger, good *partnerapi.Client, badURL string) *childTrack {
	bad, err := partnerapi.New(partnerapi.Config{
		BaseURL:     badURL,
		Credentials: partnerapi.Credentials{ClientID: "playpipe01", ClientSignature: "SANDBOX-ONLY-signature-not-a-real-secret"},
		UserAgent:   testUA, MaxConns: 8, RequestTimeout: 5 * time.Second, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	track, _ := strconv.ParseInt(os.Getenv(envChildBadTrack), 10, 64)
	return &childTrack{good: good, bad: bad, track: track, while: os.Getenv(envChildBadFile)}
}

func (c *childTrack) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	if trackKey(body) == c.track {
		if _, err := os.Stat(c.while); err == nil {
			return c.bad.ReportPlayJSON(ctx, body)
		}
	}
	return c.good.ReportPlayJSON(ctx, body)
}

func (c *childTrack) Session(ctx context.Context) (partnerapi.Meta, error) {
	return c.good.Session(ctx)
}

// TestKillWhileParking: a reporter process parks the reports of a track the
// partner fails (500) while the others flow, and is killed with SIGKILL
// three times: while it parks, while its slow lane retries the parked
// reports, and once more after the fault is lifted. In the end every report
// is at the partner; none with a recorded final outcome is posted again,
// and every report the partner has twice is labelled in doubt.
func TestKillWhileParking(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	e := newE2E(t, 3)
	e.group = "reporter-park-kill"
	failing := testenv.StartSandbox(t)
	failing.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 1}})
	flag := filepath.Join(t.TempDir(), "failing")
	if err := os.WriteFile(flag, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{envChildBadAPI + "=" + failing.URL, envChildBadTrack + "=666", envChildBadFile + "=" + flag,
		"PLAYPIPE_REPORTER_CHILD_INSTANCE=reporter-0"}
	e.publish("pk-good", 600, 0, 0)
	bad := e.publishTrack("pk-bad", 30, 666)
	e.publish("pk-good2", 600, 0, 0)
	const conc = 16
	c := e.startChild(0, conc, env...)
	var outs []string
	kill := func(k int) {
		stopChild(t, c, syscall.SIGKILL)
		outs = append(outs, c.out.String())
		t.Logf("kill %d: %d accepted, %d parked records, %d posts to the failing partner", k, e.sb.Ledger().AcceptedCount, len(e.parkedRecords()),
			failing.Ledger().Counters["report"][500])
		c = e.startChild(0, conc, env...)
	}
	trickle := func(i int) { e.publish(fmt.Sprintf("pk-more-%d", i), 5, 0, 0) } // other reports keep the budgets moving
	i := 0
	waitFor(t, 60*time.Second, func() bool { i++; trickle(i); return len(e.parkedRecords()) >= len(bad)/3 })
	kill(1) // while parking
	waitFor(t, 60*time.Second, func() bool { i++; trickle(i); return len(e.parkedRecords()) == len(bad) })
	time.Sleep(time.Second) // slow retries every 300 ms: a real wait, so the lane is mid-round
	kill(2)                 // while the slow lane retries
	if err := os.Remove(flag); err != nil {
		t.Fatal(err)
	}
	e.expectDelivered(bad)
	waitFor(t, 60*time.Second, func() bool {
		n := 0
		for _, d := range e.deliveries() {
			if bad[d.ReportID] && d.Outcome == schemas.OutcomeDelivered {
				n++
			}
		}
		return n >= len(bad)/2
	})
	kill(3) // while the slow lane delivers
	e.waitRestartDone(90*time.Second, 60*time.Second)
	waitFor(t, 30*time.Second, func() bool { return strings.Contains(c.out.String(), "partitions recovered") }) // SIGTERM after its handler is in place
	stopChild(t, c, syscall.SIGTERM)
	outs = append(outs, c.out.String())

	dups := e.checkExactlyOnce(true)
	e.checkAllCommitted()
	inDoubt, recorded := e.deliveredRecords()
	for id, n := range e.ledgerCounts() {
		if n > 1 && !inDoubt[id] {
			t.Errorf("report %s accepted %d times but not labelled in doubt", id, n)
		}
	}
	for id, n := range recorded {
		if n > 1 {
			t.Errorf("report %s has %d delivered records: posted again after its final outcome was recorded", id, n)
		}
	}
	left := 0
	live := map[string]bool{}
	for _, r := range e.kafka.ReadAll(t, e.kafka.Config.Topics().Parked) {
		live[string(r.Key)] = len(r.Value) > 0
	}
	for _, l := range live {
		if l {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d parked entries still live after every report was delivered", left)
	}
	var parkedDoubt int
	for id := range bad {
		if inDoubt[id] {
			parkedDoubt++
		}
	}
	t.Logf("3 kills while parking: %d duplicates at the partner (all labelled), %d delivered reports in doubt (%d of the parked track)", dups, len(inDoubt), parkedDoubt)
	if t.Failed() {
		for i, o := range outs {
			t.Logf("process %d output:\n%s", i+1, o)
		}
	}
}
