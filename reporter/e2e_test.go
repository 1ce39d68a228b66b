package reporter

import (
	"errors"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// TestDeliverAll: every report delivered once, 400s rejected with the
// message and fields, below-minimum plays final without a post, a
// re-published event not posted twice, every offset committed.
func TestDeliverAll(t *testing.T) {
	e := newE2EApache(t, 3)
	recs := e.publish("basic", 600, 50, 40)
	stop := e.start(e.config(), e.client(testUA))
	e.waitLedger(30 * time.Second)
	// Re-publish the first 50 records: same report ids, new offsets.
	e.produce(cloneRecords(recs[:50]))
	e.waitAllCommitted(30 * time.Second) // the re-published records were consumed and finished
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
	by := e.checkDeliveries(true)
	if len(by[schemas.OutcomeRejected]) != len(e.rejected) {
		t.Errorf("%d rejected deliveries, want %d", len(by[schemas.OutcomeRejected]), len(e.rejected))
	}
	for _, d := range by[schemas.OutcomeRejected] {
		if d.HTTPStatus != 400 || d.Message == "" || len(d.Fields) == 0 || d.Fields[0] != "country" {
			t.Errorf("rejected delivery without status/message/fields: %+v", d)
		}
	}
	for _, d := range by[schemas.OutcomeDelivered] {
		if d.HTTPStatus != 200 || d.LatencyUS <= 0 {
			t.Errorf("delivered record without status/latency: %+v", d)
		}
	}
	if l := e.sb.Ledger(); l.Duplicates != 0 {
		t.Errorf("sandbox counted %d duplicates", l.Duplicates)
	}
}

// TestStorm500: 30% of posts answered 500 for a while, then 503s; every
// report delivered exactly once and the retries visible in deliveries.
func TestStorm500And503(t *testing.T) {
	e := newE2EApache(t, 3)
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 0.3}})
	e.publish("storm", 800, 0, 0)
	stop := e.start(e.config(), e.client(testUA))
	waitFor(t, 20*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= 300 })
	e.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate503: 0.3}})
	e.publish("storm503", 400, 0, 0)
	waitFor(t, 20*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= 900 })
	e.sb.SetFaults(sandbox.Faults{})
	e.waitLedger(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
	by := e.checkDeliveries(true)
	reasons := map[string]int{}
	for _, d := range by[schemas.OutcomeRetry] {
		reasons[d.Reason]++
	}
	if reasons[delivery.ReasonHTTP500] == 0 || reasons[delivery.ReasonHTTP503] == 0 {
		t.Errorf("retry reasons %v: want http_500 and http_503", reasons)
	}
	t.Logf("retries by reason: %v", reasons)
}

// TestTokenExpiresMidRun: the sandbox's clock jumps past the live token's
// lifetime while reports flow; posts get 401, one new session is taken, and
// every report is delivered once.
func TestTokenExpiresMidRun(t *testing.T) {
	var skew atomicDuration
	e := newE2EApache(t, 3, func(o *sandbox.Config) {
		o.LiveTokenTTL = time.Hour
		o.Now = func() time.Time { return time.Now().Add(skew.Load()) }
	})
	e.publish("token", 1000, 0, 0)
	stop := e.start(e.config(), e.client(testUA))
	waitFor(t, 20*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= 200 })
	skew.Store(2 * time.Hour) // every token issued so far has expired
	e.waitLedger(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
	by := e.checkDeliveries(true)
	n401 := 0
	for _, d := range by[schemas.OutcomeRetry] {
		if d.Reason == delivery.ReasonUnauthorized && d.HTTPStatus == 401 {
			n401++
		}
	}
	if n401 == 0 {
		t.Fatal("no 401 retry published: the token did not expire mid-run")
	}
	sessions := e.sb.Ledger().Counters["session"][200]
	t.Logf("401 retries: %d, sessions created: %d", n401, sessions)
	if sessions > 3 {
		t.Errorf("%d sessions: renewal after 401 must be shared (single flight)", sessions)
	}
}

// TestStandbyWindow: standby switched on and off while reports flow. The
// reports standby answered are replayed once live service is back; nothing
// is lost, nothing delivered twice, and the episode is in the deliveries.
func TestStandbyWindow(t *testing.T) {
	e := newE2EApache(t, 3)
	e.publish("standby", 1500, 0, 0)
	cfg := e.config()
	cfg.Rate = 1500 // keep reports flowing through the whole window
	stop := e.start(cfg, e.client(testUA))
	waitFor(t, 20*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= 200 })
	e.sb.SetMode(sandbox.ModeStandby)
	waitFor(t, 10*time.Second, func() bool { return e.sb.Ledger().StandbyCount > 0 })
	// Probes see standby (and adopt standby tokens): a session served after
	// the first standby answer.
	sessions := e.sb.Ledger().Counters["session"][200]
	waitFor(t, 10*time.Second, func() bool { return e.sb.Ledger().Counters["session"][200] > sessions })
	e.sb.SetMode(sandbox.ModeLive) // standby tokens die
	waitFor(t, 20*time.Second, func() bool { return e.sb.Ledger().AcceptedCount >= 900 })
	e.sb.SetMode(sandbox.ModeStandby)  // a second window
	time.Sleep(200 * time.Millisecond) // the window's length (scenario), not synchronisation
	e.sb.SetMode(sandbox.ModeLive)
	e.waitLedger(30 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
	e.checkAllCommitted()
	by := e.checkDeliveries(true)
	l := e.sb.Ledger()
	if len(by[schemas.OutcomeStandby]) == 0 || int64(len(by[schemas.OutcomeStandby])) != l.StandbyCount {
		t.Errorf("%d standby deliveries published, sandbox answered %d from standby", len(by[schemas.OutcomeStandby]), l.StandbyCount)
	}
	replayed := 0
	for _, d := range by[schemas.OutcomeDelivered] {
		if d.Replay {
			replayed++
		}
	}
	if replayed == 0 {
		t.Error("no delivered record marked replay")
	}
	t.Logf("standby answers %d, replayed and delivered %d", l.StandbyCount, replayed)
}

// TestBlockedUserAgent: the edge blocks our User-Agent: Run stops with a
// configuration error and commits nothing.
func TestBlockedUserAgent(t *testing.T) {
	e := newE2EApache(t, 3)
	e.publish("blocked", 200, 0, 0)
	stop, ended := e.startRun(e.config(), e.client("Go-http-client/1.1"))
	waitFor(t, 20*time.Second, func() bool {
		c := e.sb.Ledger().Counters
		return c["session"][403]+c["report"][403] > 0
	})
	select { // let it stop on its own
	case <-ended:
	case <-time.After(20 * time.Second):
		t.Fatal("the reporter did not stop on its own after the edge blocked it")
	}
	err := stop()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Run = %v, want ErrInvalidConfig", err)
	}
	t.Logf("Run: %v", err)
	// The progress of each partition is committed when it is assigned, at
	// the offset it starts from; no commit may move past it.
	committed, _ := e.committed()
	for p, o := range committed {
		if o != 0 {
			t.Errorf("partition %d committed at %d after a blocked User-Agent, want nothing past 0", p, o)
		}
	}
	if l := e.sb.Ledger(); l.AcceptedCount != 0 {
		t.Errorf("%d reports accepted", l.AcceptedCount)
	}
	blocked := 0
	for _, d := range e.deliveries() {
		if d.Outcome == schemas.OutcomeBlocked && d.HTTPStatus == 403 {
			blocked++
		}
	}
	if blocked == 0 {
		t.Error("no blocked delivery published")
	}
}
