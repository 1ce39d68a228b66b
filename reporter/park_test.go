package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// badPartner is the partner stand-in of the parking tests: it answers every report
// in a set (by the report's userid, which the harness sets to the report
// id) with the answer of a second sandbox that fails every report with 500,
// and every other report with the real sandbox's answer, until lifted.
type badPartner struct {
	good, bad *partnerapi.Client
	failing   atomic.Bool
	mu        sync.Mutex
	ids       map[string]bool
	badPosts  atomic.Int64
}

func (b *badPartner) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	if b.failing.Load() {
		var r struct {
			UserID string `json:"userid"`
		}
		_ = json.Unmarshal(body, &r)
		b.mu.Lock()
		bad := b.ids[r.UserID]
		b.mu.Unlock()
		if bad {
			b.badPosts.Add(1)
			return b.bad.ReportPlayJSON(ctx, body)
		}
	}
	return b.good.ReportPlayJSON(ctx, body)
}

func (b *badPartner) Session(ctx context.Context) (partnerapi.Meta, error) {
	return b.good.Session(ctx)
}

// newBadPartner is a badPartner failing ids, on e's sandbox and a second
// one that answers 500 to every report.
func (e *e2e) newBadPartner(ids map[string]bool) *badPartner {
	e.t.Helper()
	failing := testenv.StartSandbox(e.t)
	failing.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 1}})
	bad, err := partnerapi.New(partnerapi.Config{
		BaseURL:     failing.URL,
		Credentials: partnerapi.Credentials{ClientID: failing.ClientID, ClientSignature: failing.ClientSignature},
		UserAgent:   testUA, MaxConns: 8, RequestTimeout: 5 * time.Second, Logger: testLogger(e.t),
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(bad.Close)
	b := &badPartner{good: e.client(testUA), bad: bad, ids: ids}
	b.failing.Store(true)
	return b
}

// parkedRecords returns the last parked Delivery record of each report.
func (e *e2e) parkedRecords() map[string]schemas.Delivery {
	out := map[string]schemas.Delivery{}
	for _, d := range e.deliveries() {
		if d.Outcome == schemas.OutcomeParked {
			out[d.ReportID] = d
		}
	}
	return out
}

// publishTrack publishes n plays of track, returning their report ids.
func (e *e2e) publishTrack(prefix string, n int, track int64) map[string]bool {
	e.t.Helper()
	ids := map[string]bool{}
	var recs []*kgo.Record
	for i := range n {
		tp := play(fmt.Sprintf("%s-%d", prefix, i), false, false)
		tp.Report.TrackID = track
		ids[tp.ReportID] = true
		v, err := json.Marshal(tp)
		if err != nil {
			e.t.Fatal(err)
		}
		recs = append(recs, &kgo.Record{Topic: e.kafka.Config.Topics().Reports, Key: []byte(tp.ReportID), Value: v})
	}
	e.produce(recs)
	return ids
}

// waitParked publishes a steady trickle of other reports (per batch
// reports named prefix-more-i every 100 ms: a report's budget moves only
// while others are answered; in an outage of the whole partner nothing is
// parked) until every report of bad has a parked record, for up to 60 s.
// A run that ends meanwhile (ended, when not nil) fails the test with
// stop's error.
func (e *e2e) waitParked(bad map[string]bool, prefix string, per int, ended <-chan struct{}, stop func() error) {
	e.t.Helper()
	for i := 0; len(e.parkedRecords()) < len(bad); i++ {
		if i == 600 {
			e.t.Fatalf("%d of %d reports parked after 60 s", len(e.parkedRecords()), len(bad))
		}
		select {
		case <-ended:
			e.t.Fatalf("the reporter stopped: %v", stop())
		default:
		}
		e.publish(fmt.Sprintf("%s-more-%d", prefix, i), per, 0, 0)
		time.Sleep(100 * time.Millisecond)
	}
}

// TestParkedTrackDoesNotHoldOthers: the partner answers 500 to
// every report of one track. Every other report is delivered; the bad ones
// are parked (a parked Delivery record with the last answer and attempts),
// and every partition's commit point moves past them. A restart re-posts
// none of them from the reports topic; once the fault is lifted the slow
// retries deliver each exactly once.
func TestParkedTrackDoesNotHoldOthers(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 4)
	e.group = "reporter-park"
	e.publish("good", 400, 0, 0)
	bad := e.publishTrack("bad", 24, 666)
	e.publish("good-after", 400, 0, 0)
	partner := e.newBadPartner(bad)

	cfg := e.config()
	cfg.ParkAfterAttempts, cfg.ParkAfter = 3, 100*time.Millisecond
	cfg.WarnAfterAttempts = 2
	cfg.ParkRetries = []time.Duration{time.Hour} // no slow retry in the first run
	stop := e.start(cfg, partner)
	e.waitParked(bad, "good", 5, nil, nil)
	e.waitLedger(60 * time.Second)
	e.waitAllCommitted(30 * time.Second) // past the parked reports
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	for id := range bad {
		d, ok := e.parkedRecords()[id]
		switch {
		case !ok:
			t.Errorf("report %s not parked", id)
		case d.HTTPStatus != 500 || d.Reason != delivery.ReasonHTTP500 || d.Attempt < 3 || d.InDoubt:
			t.Errorf("parked record of %s: %+v, want status 500, reason http_500, ≥ 3 attempts, not in doubt", id, d)
		}
	}
	e.checkExactlyOnce(false) // the good ones, once each; none of the bad track
	postsBefore := partner.badPosts.Load()

	// A restart with the fault still on: nothing of the parked reports is
	// posted again from the reports topic (their slow retry is an hour away).
	stop = e.start(cfg, partner)
	e.publish("good-restart", 100, 0, 0)
	e.waitLedger(60 * time.Second)
	e.waitAllCommitted(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := partner.badPosts.Load() - postsBefore; n != 0 {
		t.Errorf("%d posts of parked reports after a restart, want 0", n)
	}

	// The fault lifted, a run whose slow schedule is short delivers each
	// parked report once.
	partner.failing.Store(false)
	e.expectDelivered(bad)
	// The entries written in the first run are due an hour later: a run
	// whose clock is two hours ahead finds them due.
	cfg.Clock = offsetClock{systemClock{now: time.Now}, 2 * time.Hour}
	stop = e.start(cfg, partner)
	e.waitLedger(60 * time.Second)
	waitFor(t, 30*time.Second, func() bool {
		final := 0
		for _, d := range e.deliveries() {
			if bad[d.ReportID] && d.Outcome == schemas.OutcomeDelivered {
				final++
			}
		}
		return final == len(bad)
	})
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkDeliveries(true)
	if left := e.kafka.ReadAll(t, e.kafka.Config.Topics().Parked); len(left) > 0 {
		live := map[string]bool{}
		for _, r := range left {
			live[string(r.Key)] = len(r.Value) > 0
		}
		for id, l := range live {
			if l {
				t.Errorf("parked entry of %s still live after its delivery", id)
			}
		}
	}
}

// offsetClock is the real clock, shifted.
type offsetClock struct {
	systemClock
	by time.Duration
}

func (c offsetClock) Now() time.Time { return c.systemClock.Now().Add(c.by) }

// TestFullPartitionPausesAlone: every report of one partition fails (and is
// never parked), with --max-pending far below that partition's backlog.
// The other partitions are delivered and committed to their ends: the cap is
// per partition. Lifted, the stuck partition drains, every report once.
func TestFullPartitionPausesAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 4)
	e.group = "reporter-pause"
	recs := e.publish("pause", 2000, 0, 0)
	stuck := map[string]bool{}
	for _, r := range recs {
		if r.Partition == 0 {
			stuck[string(r.Key)] = true
		}
	}
	if len(stuck) < 200 {
		t.Fatalf("only %d reports in partition 0", len(stuck))
	}
	partner := e.newBadPartner(stuck)
	cfg := e.config()
	cfg.Concurrency, cfg.MaxConcurrency, cfg.MaxPending = 8, 8, 64
	cfg.ParkAfterAttempts = -1
	// The harness's short backoff (20–300 ms): the stuck reports' retries
	// ask for far more failed posts than the retry budget's floor; fresh
	// reports are leased first while the budget is short, so the others
	// still flow.
	stop := e.start(cfg, partner)
	t0 := time.Now()
	waitFor(t, 60*time.Second, func() bool {
		counts := e.ledgerCounts()
		for _, r := range recs {
			if r.Partition != 0 && counts[string(r.Key)] == 0 {
				return false
			}
		}
		return true
	})
	waitFor(t, 30*time.Second, func() bool {
		committed, end := e.committed()
		for p, o := range end {
			if p != 0 && committed[p] != o {
				return false
			}
		}
		return true
	})
	t.Logf("the other partitions delivered and committed in %v", time.Since(t0).Round(100*time.Millisecond))
	if committed, _ := e.committed(); committed[0] > 64 {
		t.Errorf("partition 0 committed at %d with every report failing", committed[0])
	}
	partner.failing.Store(false)
	e.waitLedger(60 * time.Second)
	e.waitAllCommitted(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
}

// TestParkBudget feeds the retry budget failures and the partner's other
// answers: a report is parked only once it failed ParkAfterAttempts times
// over ParkAfter while other reports were answered; in an outage of the
// whole partner (no other answer) its budget never moves.
func TestParkBudget(t *testing.T) {
	clk := newFakeClock()
	cfg := Config{ParkAfterAttempts: 5, ParkAfter: 10 * time.Minute, Clock: clk, Logger: testLogger(t)}.withDefaults()
	r := &Reporter{cfg: cfg, log: cfg.Logger}
	rn := r.newRun(context.Background(), func() {})
	fail := func(j *job, others uint64, after time.Duration) bool {
		clk.Advance(after)
		rn.successes += others
		j.attempt++
		return rn.budgetSpent(j)
	}
	cases := []struct {
		name   string
		others uint64        // other reports answered between two failures
		every  time.Duration // between two failures
		want   int           // the failure that spends the budget (0: none of 100)
	}{
		{"outage of the whole partner", 0, time.Minute, 0},
		{"one payload failing, the others taken", 10, 10 * time.Second, 61}, // 60 intervals of 10 s after the first failure
		{"many quick failures", 10, time.Second, 0},                         // 100 s < ParkAfter
		{"a slow failure rate", 1, 5 * time.Minute, 5},                      // the attempts bound it: 4 intervals of 5 m ≥ 10 m
	}
	for _, c := range cases {
		j := &job{id: "r", rec: &kgo.Record{}, ps: &partState{}}
		got := 0
		for i := 1; i <= 100 && got == 0; i++ {
			if fail(j, c.others, c.every) {
				got = i
			}
		}
		if got != c.want {
			t.Errorf("%s: spent at failure %d, want %d", c.name, got, c.want)
		}
	}
	// The pressure rule: its partition full (MaxPending records pending,
	// or its progress window leased), a report is parked at its third failure once another report was
	// answered after its first — never in an outage of the whole partner.
	rn.cfg.MaxPending = 4
	full := &partState{}
	for i := range 4 {
		full.wm.add(int64(i), 0, 0)
	}
	// Fewer than MaxPending pending, but a report held back past the
	// progress window: leasing of the partition has stopped behind it.
	windowFull := &partState{}
	windowFull.wm.add(0, 0, 0)
	windowFull.pastWindow.push(&job{id: "past"})
	for _, c := range []struct {
		name    string
		others  uint64 // other reports answered between two failures
		failing uint64 // other reports failing between two failures
		ps      *partState
		want    int
	}{
		{"full partition, the others taken", 10, 0, full, 3},
		{"full partition, outage of the whole partner", 0, 10, full, 0},
		{"full partition, nothing else posted (it fails alone)", 0, 0, full, 3},
		{"room in the partition", 10, 0, &partState{}, 61},
		{"progress window full", 10, 0, windowFull, 3},
	} {
		j := &job{id: "r", rec: &kgo.Record{}, ps: c.ps}
		got := 0
		for i := 1; i <= 100 && got == 0; i++ {
			rn.failed += c.failing
			rn.partnerFailed += c.failing // an outage: the limiter takes them for the partner's
			if fail(j, c.others, 10*time.Second) {
				got = i
			}
		}
		if got != c.want || j.pressured != (c.want == 3) {
			t.Errorf("pressure, %s: spent at failure %d (pressured %v), want %d", c.name, got, j.pressured, c.want)
		}
	}
	// Others failing too, but for their payload (a hanging track's reports,
	// nothing answered: the partition leased up to its window behind them):
	// it fails alone, parked at its third failure.
	j0 := &job{id: "r", rec: &kgo.Record{}, ps: full}
	got := 0
	for i := 1; i <= 10 && got == 0; i++ {
		rn.failed += 10 // judged their payload's: partnerFailed unchanged
		if fail(j0, 0, 30*time.Second) {
			got = i
		}
	}
	if got != 3 || !j0.pressured {
		t.Errorf("pressure, full partition, the others failing for their payload: spent at failure %d (pressured %v), want 3", got, j0.pressured)
	}
	// The pressure rule counts no failure of a whole-partner outage: three
	// failures in an outage, then one other report answered, then the
	// outage again — not parked (it was, at the fourth failure, when every
	// failure after the first success counted).
	j := &job{id: "r", rec: &kgo.Record{}, ps: full}
	for i, others := range []uint64{0, 0, 0, 1, 0, 0, 0, 0} {
		rn.failed += 10        // the other reports fail too …
		rn.partnerFailed += 10 // … the partner's, to the limiter
		if fail(j, others, 10*time.Second) {
			t.Fatalf("pressure: parked at failure %d of an outage with one answer in between", i+1)
		}
	}
	// Nor a report behind another pending one: it does not hold the
	// partition's commit point (seq 0 does), parking it frees nothing.
	j = &job{id: "r", rec: &kgo.Record{}, ps: full, seq: 2}
	for i := range 10 {
		if fail(j, 10, 10*time.Second) {
			t.Fatalf("pressure: parked a report behind the commit point at failure %d", i+1)
		}
	}
	// Parking off.
	rn.cfg.ParkAfterAttempts = -1
	j = &job{id: "r", rec: &kgo.Record{}, ps: full}
	for range 100 {
		if fail(j, 10, time.Minute) {
			t.Fatal("parked with --park-after-attempts -1")
		}
	}
}

// TestPoisonTrackSandboxFault is the parking test against the sandbox's own fault
// (Faults.Report.TrackIDs: every report of a track answered 500 until
// lifted): the reports of that track are parked while the others are
// delivered and every partition committed to its end; lifted, the slow
// retries deliver each once.
func TestPoisonTrackSandboxFault(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 3)
	e.group = "reporter-poison-track"
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{TrackIDs: []int64{666}, TrackStatus: 500}})
	e.publish("pt-good", 300, 0, 0)
	bad := e.publishTrack("pt-bad", 20, 666)
	cfg := e.config()
	cfg.ParkAfterAttempts, cfg.ParkAfter = 3, 100*time.Millisecond
	cfg.ParkRetries = []time.Duration{500 * time.Millisecond}
	stop := e.start(cfg, e.client(testUA))
	e.waitParked(bad, "pt", 5, nil, nil)
	e.waitLedger(60 * time.Second)
	e.waitAllCommitted(30 * time.Second)
	for id, d := range e.parkedRecords() {
		if !bad[id] || d.HTTPStatus != 500 {
			t.Errorf("parked record %+v: want only the poison track's reports, answered 500", d)
		}
	}
	e.sb.SetFaults(sandbox.Faults{})
	e.expectDelivered(bad)
	e.waitLedger(60 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkDeliveries(true)
}

// TestParkedUnderPressure: with the default retry budget (20 failures over
// 10 minutes), a report of a poison track at its partition's commit point
// would stop fetching of the partition once MaxPending records wait behind
// it, for minutes — at any real rate the partition stalls. The pressure
// rule parks it once the partition is full: one partition, a poison report
// before each of three runs of 500 others, MaxPending 64: every other
// report is delivered and the partition committed to its end within a
// minute, the poison reports parked after a few attempts.
func TestParkedUnderPressure(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 1)
	e.group = "reporter-pressure"
	bad := map[string]bool{}
	for i := range 3 {
		for id := range e.publishTrack(fmt.Sprintf("bad%d", i), 1, 666) {
			bad[id] = true
		}
		e.publish(fmt.Sprintf("good%d", i), 500, 0, 0)
	}
	partner := e.newBadPartner(bad)
	cfg := e.config()
	cfg.MaxPending = 64
	cfg.ParkAfterAttempts, cfg.ParkAfter = DefaultParkAfterAttempts, DefaultParkAfter
	cfg.ParkRetries = []time.Duration{time.Hour}
	stop := e.start(cfg, partner)
	e.waitLedger(60 * time.Second)
	e.waitAllCommitted(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	parked := e.parkedRecords()
	for id := range bad {
		d, ok := parked[id]
		switch {
		case !ok:
			t.Errorf("report %s not parked", id)
		case d.HTTPStatus != 500 || d.Attempt < pressureParkFails || d.Attempt >= DefaultParkAfterAttempts:
			t.Errorf("parked record of %s: %+v, want status 500 after %d–%d attempts (the pressure rule, not the budget)", id, d, pressureParkFails, DefaultParkAfterAttempts-1)
		}
	}
	e.checkExactlyOnce(false)
}

// TestPayloadFailureBacksOffSlowly: a report that failed again after other
// reports were answered (a fault of its payload) waits as if slowStepsAhead
// failures further; one failing in an outage of the whole partner keeps
// the ordinary schedule.
func TestPayloadFailureBacksOffSlowly(t *testing.T) {
	clk := newFakeClock()
	cfg := Config{BackoffInitial: 100 * time.Millisecond, BackoffMax: 10 * time.Second, Clock: clk, Logger: testLogger(t)}.withDefaults()
	r := &Reporter{cfg: cfg, log: cfg.Logger, backoff: retryPolicy(cfg)}
	rn := r.newRun(context.Background(), func() {})
	for _, c := range []struct {
		name     string
		others   uint64
		min, max time.Duration // the delay after the second failure
	}{
		{"the others answered", 5, 1600 * time.Millisecond, 3200 * time.Millisecond},
		{"outage of the whole partner", 0, 100 * time.Millisecond, 200 * time.Millisecond},
	} {
		j := &job{id: "r", rec: &kgo.Record{}, ps: &partState{}, dec: delivery.Decision{Action: delivery.ActRetry}}
		for range 2 {
			rn.successes += c.others
			j.attempt++
			rn.budgetSpent(j)
			rn.retry(j)
		}
		if d := j.readyAt.Sub(clk.Now()); d < c.min || d > c.max {
			t.Errorf("%s: retry after %v, want %v–%v", c.name, d, c.min, c.max)
		}
	}
}
