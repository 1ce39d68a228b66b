package reporter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
)

// TestStallWarning: reports failing once say nothing; once a set of them
// failed twice, one warning names how many, their tracks, the last status
// (or timeout) and the oldest — once, until stallRepeat — and an all-clear
// when the set is gone. Readiness: degraded while the partner answers and
// nothing is made final for a minute; ready again after a final answer.
func TestStallWarning(t *testing.T) {
	clk := newFakeClock()
	var logs bytes.Buffer
	cfg := Config{Clock: clk, Logger: slog.New(slog.NewTextHandler(&logs, nil))}.withDefaults()
	r := &Reporter{cfg: cfg, log: cfg.Logger}
	rn := r.newRun(context.Background(), func() {})
	r.cur.Store(rn)
	timeout := delivery.Decision{Action: delivery.ActRetry, Reason: delivery.ReasonTimeout, Signal: delivery.SignalTimeout}
	delivered := delivery.Decision{Action: delivery.ActDelivered, Outcome: "delivered", Status: 200}
	jobs := make([]*job, 5)
	for i := range jobs {
		jobs[i] = &job{id: fmt.Sprintf("r%d", i), rec: &kgo.Record{}, ps: &partState{}, body: fmt.Appendf(nil, `{"trackid":%d}`, 400001+i%2)}
	}
	warnings := func() int { return strings.Count(logs.String(), "delivery stalled") }

	// One failure each, the partner answering others: no warning.
	rn.mu.Lock()
	for _, j := range jobs {
		rn.noteAnswer(timeout, clk.Now())
		rn.noteFailure(j, timeout, clk.Now())
		rn.noteAnswer(delivered, clk.Now())
		clk.Advance(time.Second)
	}
	rn.checkStall(clk.Now())
	rn.mu.Unlock()
	if warnings() != 0 || r.Ready() != nil {
		t.Fatalf("one failure each: %d warnings, ready %v", warnings(), r.Ready())
	}
	// A second failure of each, 40 s later, nothing made final since.
	clk.Advance(40 * time.Second)
	rn.mu.Lock()
	for _, j := range jobs {
		rn.noteAnswer(timeout, clk.Now())
		rn.noteFailure(j, timeout, clk.Now())
	}
	rn.checkStall(clk.Now())
	clk.Advance(stallCheck)
	rn.checkStall(clk.Now()) // within stallRepeat: no second warning
	rn.mu.Unlock()
	out := logs.String()
	if warnings() != 1 {
		t.Fatalf("%d stall warnings, want 1:\n%s", warnings(), out)
	}
	for _, want := range []string{"reports=5", "tracks=\"[400001 400002]\"", "last_status=timeout", "oldest_report_id=r0", "oldest_failing_for=45s", "oldest_failures=2"} {
		if !strings.Contains(out, want) {
			t.Errorf("the stall warning lacks %s:\n%s", want, out)
		}
	}
	// Degraded: the partner answered (timeouts) within the minute, nothing
	// final for more than one.
	clk.Advance(10 * time.Second)
	rn.mu.Lock()
	rn.noteAnswer(timeout, clk.Now())
	rn.mu.Unlock()
	if err := r.Ready(); !errors.Is(err, errDegraded) || !strings.Contains(err.Error(), "5 reports failing") {
		t.Fatalf("nothing delivered for 65 s while the partner answers: ready %v, want degraded", err)
	}
	// Delivered and parked: the set is gone, ready again, an all-clear.
	rn.mu.Lock()
	rn.noteAnswer(delivered, clk.Now())
	for _, j := range jobs {
		rn.notFailing(j)
	}
	rn.checkStall(clk.Now())
	rn.mu.Unlock()
	if err := r.Ready(); err != nil {
		t.Fatalf("after a delivery: %v", err)
	}
	if !strings.Contains(logs.String(), "no longer stalled") {
		t.Fatalf("no all-clear:\n%s", logs.String())
	}
	// Nothing posted for a minute (idle, or the partner unreachable): not
	// degraded.
	clk.Advance(2 * time.Minute)
	if err := r.Ready(); err != nil {
		t.Fatalf("idle: %v", err)
	}
}

// TestLimitCutWarning: a cut below --concurrency for back-pressure or
// timeouts is a warning, once per limitCutRepeat however many cuts; a cut
// by the latency rule or above --concurrency is not; the limit back at
// --concurrency says so once.
func TestLimitCutWarning(t *testing.T) {
	clk := newFakeClock()
	var logs bytes.Buffer
	cfg := Config{Concurrency: 64, Clock: clk, Logger: slog.New(slog.NewTextHandler(&logs, nil))}.withDefaults()
	r := &Reporter{cfg: cfg, log: cfg.Logger}
	rn := r.newRun(context.Background(), func() {})
	cuts := func() int { return strings.Count(logs.String(), "in-flight limit cut") }
	backs := func() int { return strings.Count(logs.String(), "in-flight limit back") }
	rn.noteLimit(clk.Now(), 256, 128, moveTimeout) // above --concurrency
	rn.noteLimit(clk.Now(), 64, 48, moveLatency)   // the latency rule
	if cuts() != 0 {
		t.Fatalf("%d warnings for cuts that are not the partner's overload below --concurrency:\n%s", cuts(), logs.String())
	}
	for l := 64.0; l > 1; l /= 2 {
		rn.noteLimit(clk.Now(), l, l/2, moveTimeout)
		clk.Advance(time.Second)
	}
	if cuts() != 1 || !strings.Contains(logs.String(), "reason=timeout") {
		t.Fatalf("6 timeout cuts within a minute: %d warnings, want 1:\n%s", cuts(), logs.String())
	}
	clk.Advance(limitCutRepeat)
	rn.noteLimit(clk.Now(), 2, 1, moveBackPressure)
	if cuts() != 2 {
		t.Fatalf("a cut after limitCutRepeat: %d warnings, want 2", cuts())
	}
	rn.noteLimit(clk.Now(), 32, 64, moveLatency)
	rn.noteLimit(clk.Now(), 64, 96, moveLatency)
	if backs() != 1 {
		t.Fatalf("the limit back at --concurrency: %d notes, want 1:\n%s", backs(), logs.String())
	}
}
