package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// revokeViaAdmin revokes every session token through the sandbox's admin
// HTTP API, as an operator would from outside, and returns the number of
// revocations so far.
func revokeViaAdmin(t testing.TB, adminURL string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, adminURL+"/admin/revoke-tokens", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /admin/revoke-tokens: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out struct {
		Revocations uint64 `json:"revocations"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &out) != nil {
		t.Fatalf("POST /admin/revoke-tokens: %d %s", resp.StatusCode, body)
	}
	return out.Revocations
}

// TestTokensRevokedMidRun: the reporter runs as a separate process (the
// child of kill_test.go) and delivers thousands of reports while the test
// revokes every session token server-side several times, through the
// sandbox's admin HTTP API. The sandbox answers reports after 20 ms, so
// about 30 posts are in flight when a token dies. Every revocation must show up as 401s on
// reports, followed by a new session shared by all workers (single
// flight: at most 2 sessions per revocation, 1 expected), and every report
// must land in the partner's ledger exactly once.
func TestTokensRevokedMidRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	const (
		n           = 6000
		rate        = 1500.0                // reports/s: the run lasts ~4 s, revocations fall mid-run
		conc        = 32                    // many posts in flight when a token dies:
		latency     = 20 * time.Millisecond // ~30 in flight at the rate
		revocations = 4
		maxSessions = 2 // per revocation
	)
	e := newE2E(t, 3)
	e.group = "reporter-revoke"
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Latency: latency}})
	e.publish("revoke", n, 0, 0)
	c := e.startChild(rate, conc)
	defer func() {
		if t.Failed() {
			t.Logf("reporter process output:\n%s", c.out.String())
		}
	}()

	counter := func(ep string, status int) int64 { return e.sb.Ledger().Counters[ep][status] }
	// Sessions taken before the first revocation: the reporter's first one.
	waitFor(t, 60*time.Second, func() bool { return e.sb.Counts().Accepted >= n/(revocations+1) })
	var perRevocation []string
	for i := 1; i <= revocations; i++ {
		if i > 1 {
			waitFor(t, 60*time.Second, func() bool { return e.sb.Counts().Accepted >= int64(i*n/(revocations+1)) })
		}
		sessions0, r401 := counter("session", 200), counter("report", 401)
		accepted0 := e.sb.Counts().Accepted
		if accepted0 >= n {
			t.Fatalf("revocation %d: all %d reports already accepted; the run is over", i, n)
		}
		if got := revokeViaAdmin(t, e.sb.AdminURL); got != uint64(i) {
			t.Fatalf("revocation %d: sandbox counts %d revocations", i, got)
		}
		// Delivery resumes: a new session, then 200 more reports accepted.
		for deadline := time.Now().Add(30 * time.Second); counter("session", 200) == sessions0 || e.sb.Counts().Accepted < min(accepted0+200, n); {
			if time.Now().After(deadline) {
				t.Fatalf("revocation %d: within 30s, %d new sessions, %d report 401s, %d more reports accepted; want a new session and 200 more reports",
					i, counter("session", 200)-sessions0, counter("report", 401)-r401, e.sb.Counts().Accepted-accepted0)
			}
			time.Sleep(20 * time.Millisecond) // polls the sandbox's counters (a child process posts)
		}
		sessions, n401 := counter("session", 200)-sessions0, counter("report", 401)-r401
		perRevocation = append(perRevocation, fmt.Sprintf("#%d at %d accepted: %d report 401s, %d sessions", i, accepted0, n401, sessions))
		if n401 == 0 {
			t.Errorf("revocation %d: no report answered 401; the revoked token was not in use", i)
		}
		if sessions > maxSessions {
			t.Errorf("revocation %d: %d sessions created for %d 401s; renewal must be single flight (≤ %d)", i, sessions, n401, maxSessions)
		}
	}

	e.waitLedger(90 * time.Second)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("reporter did not stop cleanly: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
	by := e.checkDeliveries(true)
	if d := e.sb.Counts().Duplicates; d != 0 {
		t.Errorf("sandbox counted %d duplicates", d)
	}

	l := e.sb.Ledger()
	total401, sessions := l.Counters["report"][401], l.Counters["session"][200]
	retried401 := 0
	for _, d := range by[schemas.OutcomeRetry] {
		if d.Reason == delivery.ReasonUnauthorized && d.HTTPStatus == 401 {
			retried401++
		}
	}
	t.Logf("%d reports, %d revocations; per revocation: %v", n, revocations, perRevocation)
	t.Logf("totals: report 401s %d, 401 retry deliveries %d, sessions created %d (1 initial + %d after revocations)",
		total401, retried401, sessions, sessions-1)
	if total401 < revocations {
		t.Errorf("%d report 401s for %d revocations", total401, revocations)
	}
	// Every answered attempt has its deliveries record (no crash, no
	// rebalance here): each 401 must be there as a retry.
	if int64(retried401) != total401 {
		t.Errorf("%d 401 retry deliveries published, the sandbox answered %d report 401s", retried401, total401)
	}
	if sessions > 1+maxSessions*revocations {
		t.Errorf("%d sessions in all for %d revocations: renewal is not single flight", sessions, revocations)
	}
}
