package demo_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// play is the identity of one posted report, as the sandbox decoded it.
type play = expect.Play

// TestPipelineEndToEnd runs the whole pipeline over real parts — the
// embedded Kafka-protocol broker, the sandbox over HTTP, a real ClickHouse
// server — while the simulator publishes through kafka-go and the sandbox
// goes through a 500 storm and a standby window, the sink is stopped and
// restarted, and ClickHouse is stopped for a while. At the end the audit's
// numbers must equal the sandbox's ledger and the independently expected plays.
func TestPipelineEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	k := testenv.StartKafka(t, 3)
	ch := testenv.StartClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	p, err := demo.Start(ctx, demo.Config{
		Kafka:      k.Config,
		Sandbox:    sandbox.Config{Seed: 11, Pages: 2, ListsPerPage: 2, MixesPerList: 5},
		ClickHouse: analytics.Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password},
		Consumer:   consumer.Config{TransactionalID: "e2e-enrich"},
		Reporter:   reporter.Config{Concurrency: 16, ProbeInterval: 100 * time.Millisecond, BackoffMax: 300 * time.Millisecond},
		Sink:       analytics.SinkConfig{BatchRows: 2000, Linger: 200 * time.Millisecond, RetryMax: 500 * time.Millisecond},
		Logger:     testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	mixes, err := simulator.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		t.Fatal(err)
	}
	sim := simulator.Config{Kafka: p.Kafka, Mixes: mixes, Events: 3000, Rate: 1500, Devices: 60, BadShare: 0.08, Seed: 5, StartMS: simulator.DefaultStart(time.Now())}
	gen, err := simulator.NewGenerator(sim)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []simulator.Message
	for m, ok := gen.Next(); ok; m, ok = gen.Next() {
		msgs = append(msgs, m)
	}
	want, wantBelow, validEvents, badEvents, err := expect.Sim(p.Sandbox.Catalog(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	wantReports := 0
	for _, n := range want {
		wantReports += n
	}
	t.Logf("simulation: %d events (%d valid, %d bad) → %d reports to post, %d below the minimum", len(msgs), validEvents, badEvents, wantReports, wantBelow)

	simDone := make(chan error, 1)
	go func() {
		st, err := simulator.Run(ctx, sim)
		if err == nil && st.Sent != len(msgs) {
			err = fmt.Errorf("simulator sent %d of %d", st.Sent, len(msgs))
		}
		simDone <- err
	}()

	// The faults, while events flow.
	step := func(d time.Duration, what string, f func()) {
		select {
		case <-time.After(d):
		case err := <-p.Errors():
			t.Fatalf("a role failed: %v", err)
		}
		t.Log(what)
		f()
	}
	step(400*time.Millisecond, "500 storm: 30% of play reports", func() {
		p.Sandbox.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 0.3}})
	})
	step(time.Second, "sink stopped", func() {
		if err := p.StopRole(demo.RoleSink); err != nil {
			t.Errorf("stop sink: %v", err)
		}
	})
	step(200*time.Millisecond, "storm over; standby window opens", func() {
		p.Sandbox.SetFaults(sandbox.Faults{})
		p.Sandbox.SetMode(sandbox.ModeStandby)
	})
	step(300*time.Millisecond, "sink restarted; ClickHouse stopped", func() {
		if err := p.StartRole(demo.RoleSink); err != nil {
			t.Fatal(err)
		}
		ch.Stop(t)
	})
	step(1200*time.Millisecond, "standby window closes", func() { p.Sandbox.SetMode(sandbox.ModeLive) })
	step(1500*time.Millisecond, "ClickHouse restarted", func() { ch.Restart(t) })
	if err := <-simDone; err != nil {
		t.Fatal(err)
	}

	// Wait for the ledger to settle: everything delivered and audited.
	conn := ch.Conn(t)
	auditor, err := analytics.NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	window := analytics.AuditOptions{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	var rep *analytics.Audit
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-p.Errors():
			t.Fatalf("a role failed: %v", err)
		default:
		}
		rep, err = auditor.Audit(ctx, window)
		if err == nil && rep.EventsReceived == uint64(len(msgs)) && rep.PlaysDerived == uint64(wantReports+wantBelow) &&
			rep.Pending == 0 && rep.Delivered == uint64(wantReports) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline did not settle: audit %+v (err %v), sandbox %+v", rep, err, p.Sandbox.Counts())
		}
		time.Sleep(300 * time.Millisecond)
	}

	// The sandbox's ledger: exactly the expected reports, each once.
	led := p.Sandbox.Ledger()
	got := map[play]int{}
	for _, e := range led.Accepted {
		r := e.Report
		got[expect.Of(r)]++
	}
	if led.Duplicates != 0 {
		t.Errorf("sandbox counted %d duplicate reports", led.Duplicates)
	}
	if missing, extra := expect.Diff(want, got); len(missing)+len(extra) > 0 {
		t.Errorf("delivered reports differ from the expected plays: %d missing (e.g. %v), %d unexpected (e.g. %v)", len(missing), expect.First(missing), len(extra), expect.First(extra))
	}
	if led.StandbyCount == 0 {
		t.Errorf("the standby window answered no report: the test did not exercise replay")
	}

	// The audit agrees with the sandbox and with the expectation.
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"events received", rep.EventsReceived, uint64(len(msgs))},
		{"events rejected", rep.EventsRejected, uint64(badEvents)},
		{"plays derived", rep.PlaysDerived, uint64(wantReports + wantBelow)},
		{"plays below minimum", rep.PlaysBelowMinimum, uint64(wantBelow)},
		{"delivered", rep.Delivered, uint64(wantReports)},
		{"delivered (sandbox ledger)", rep.Delivered, uint64(led.AcceptedCount)},
		{"delivered more than once", rep.DeliveredTwice, 0},
		{"pending", rep.Pending, 0},
		{"rejected by the API", rep.RejectedByAPI, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("audit %s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if rep.StandbyAnswered == 0 || rep.StandbyThenDelivered != rep.StandbyAnswered {
		t.Errorf("audit standby answered %d, then delivered %d: want equal and > 0", rep.StandbyAnswered, rep.StandbyThenDelivered)
	}
	if problems := rep.Problems(); len(problems) > 0 {
		t.Errorf("audit reports problems: %v", problems)
	}
	t.Logf("audit: %d events, %d rejected, %d plays, %d delivered, %d standby-then-delivered; sandbox accepted %d, standby %d",
		rep.EventsReceived, rep.EventsRejected, rep.PlaysDerived, rep.Delivered, rep.StandbyThenDelivered, led.AcceptedCount, led.StandbyCount)

	// Every play carries the Kafka timestamp of the event record it was
	// derived from (TrackPlay.EventAt, written by the sink to
	// plays.event_at_ms): the delay read from it equals the one the
	// exact path computes from the events table.
	var plays, carried, matching uint64
	if err := conn.QueryRow(ctx, `SELECT count(), countIf(event_at_ms > 0),
    countIf((event_id, event_at_ms) IN (SELECT event_id, kafka_time_ms FROM `+ch.Database+`.events WHERE event_id != ''))
FROM `+ch.Database+`.plays`).Scan(&plays, &carried, &matching); err != nil {
		t.Fatal(err)
	}
	if plays == 0 || carried != plays || matching != plays {
		t.Errorf("plays.event_at_ms: %d plays, %d carry an event record time, %d of them the time of a record of their event; want all", plays, carried, matching)
	}
	exact, err := analytics.NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	exact.SetLimits(analytics.Limits{Exact: true})
	xrep, err := exact.Audit(ctx, window)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Delay != xrep.Delay || rep.Delay.Plays != rep.Delivered {
		t.Errorf("delay from the carried times %+v, by the exact path %+v; want equal, over the %d delivered plays", rep.Delay, xrep.Delay, rep.Delivered)
	}
}
