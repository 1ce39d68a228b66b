package analytics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// TestAuditReplays: deliveries with a replay id count a play as delivered,
// are listed per replay (--list replay:<id>), and are never counted as
// "delivered more than once" — unless the same replay delivered a play twice.
func TestAuditReplays(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	t0 := now.Add(-time.Minute).Truncate(time.Millisecond)
	ms := t0.UnixMilli()
	r1, p1 := playJSON(t, "rp1", 0, false) // live delivered, replayed once
	r2, p2 := playJSON(t, "rp1", 1, false) // live delivered, replayed once
	r3, p3 := playJSON(t, "rp1", 2, false) // rejected live, redriven: delivered
	r4, p4 := playJSON(t, "rp1", 3, false) // live delivered twice: a real double
	del := func(id, outcome, replayID, reason string, status int, at int64) []byte {
		return mustJSON(t, schemas.Delivery{V: schemas.DeliveryVersion, ReportID: id, EventID: "rp1", Outcome: outcome,
			Attempt: 1, HTTPStatus: status, ReplayID: replayID, ReplayReason: reason, At: at})
	}
	var recs []*kgo.Record
	add := func(topic, key string, v []byte) {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: v, Timestamp: t0})
	}
	add(e.topics.Events, "rp1", eventJSON(t, "rp1", "u1"))
	for _, p := range [][2]string{{r1, string(p1)}, {r2, string(p2)}, {r3, string(p3)}, {r4, string(p4)}} {
		add(e.topics.Reports, p[0], []byte(p[1]))
	}
	add(e.topics.Deliveries, r1, del(r1, schemas.OutcomeDelivered, "", "", 200, ms+100))
	add(e.topics.Deliveries, r2, del(r2, schemas.OutcomeDelivered, "", "", 200, ms+100))
	add(e.topics.Deliveries, r3, del(r3, schemas.OutcomeRejected, "", "", 400, ms+100))
	add(e.topics.Deliveries, r4, del(r4, schemas.OutcomeDelivered, "", "", 200, ms+100))
	add(e.topics.Deliveries, r4, del(r4, schemas.OutcomeDelivered, "", "", 200, ms+150))
	add(e.topics.Deliveries, r1, del(r1, schemas.OutcomeDelivered, "rp-a", "partner lost a window", 200, ms+200))
	add(e.topics.Deliveries, r2, del(r2, schemas.OutcomeDelivered, "rp-a", "partner lost a window", 200, ms+210))
	add(e.topics.Deliveries, r3, del(r3, schemas.OutcomeDelivered, "rd-b", "isrc fix", 200, ms+300))
	e.produce(t, recs...)

	s := e.startSink(t, e.cfg)
	a := e.auditor(t)
	opts := AuditOptions{From: now.Add(-time.Hour), To: now.Add(time.Minute), PendingThreshold: 10 * time.Minute, Now: now}
	var got *Audit
	waitFor(t, 30*time.Second, "the audit to see every delivery", func() (bool, string) {
		var err error
		if got, err = a.Audit(context.Background(), opts); err != nil {
			return false, err.Error()
		}
		return len(got.Replays) == 2 && got.Delivered == 4, fmt.Sprintf("%+v", numbers(got))
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got.DeliveredTwice != 1 || got.RejectedByAPI != 0 || got.Pending != 0 {
		t.Errorf("delivered twice %d (want 1: only r4's live double), rejected by API %d (want 0: redriven), pending %d", got.DeliveredTwice, got.RejectedByAPI, got.Pending)
	}
	a0, b0 := got.Replays[0], got.Replays[1]
	if a0.ID != "rp-a" || a0.Reason != "partner lost a window" || a0.Plays != 2 || a0.Delivered != 2 || a0.DeliveredTwice != 0 ||
		b0.ID != "rd-b" || b0.Delivered != 1 || b0.Plays != 1 {
		t.Errorf("replays %+v", got.Replays)
	}
	if len(got.Problems()) != 1 {
		t.Errorf("problems %q, want only r4's double", got.Problems())
	}
	rows, err := a.List(context.Background(), opts, ReplayListPrefix+"rp-a", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0].Delivered != 1 || rows[0].Detail != schemas.OutcomeDelivered {
		t.Errorf("--list replay:rp-a = %+v, want r1 and r2 delivered once", rows)
	}
	rows, err = a.List(context.Background(), opts, "delivered-twice", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ReportID != r4 {
		t.Errorf("--list delivered-twice = %+v, want only %s", rows, r4)
	}
}
