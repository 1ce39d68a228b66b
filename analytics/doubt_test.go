package analytics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// TestAuditPossiblyTwice: a play delivered once on record, but re-posted
// after a crash (its delivered record says in_doubt), is counted as
// possibly delivered twice, listed, and fails the audit; the reporter's
// lease markers on the deliveries topic are skipped, not malformed.
func TestAuditPossiblyTwice(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	t0 := now.Add(-time.Minute).Truncate(time.Millisecond)
	ms := t0.UnixMilli()
	r1, p1 := playJSON(t, "d1", 0, false) // delivered once, in doubt
	r2, p2 := playJSON(t, "d1", 1, false) // delivered once, not in doubt
	r3, p3 := playJSON(t, "d1", 2, false) // a retry in doubt, then delivered twice on record
	doubt := func(id string, outcome string, attempt int, inDoubt bool, at int64) []byte {
		return mustJSON(t, schemas.Delivery{V: schemas.DeliveryVersion, ReportID: id, EventID: "d1", Outcome: outcome,
			Attempt: attempt, HTTPStatus: 200, InDoubt: inDoubt, At: at})
	}
	var recs []*kgo.Record
	add := func(topic, key string, v []byte, h ...kgo.RecordHeader) {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: v, Timestamp: t0, Headers: h})
	}
	add(e.topics.Events, "d1", eventJSON(t, "d1", "u1"))
	add(e.topics.Reports, r1, p1)
	add(e.topics.Reports, r2, p2)
	add(e.topics.Reports, r3, p3)
	add(e.topics.Deliveries, "", []byte(`{"v":1,"partition":0,"offsets":[[0,2]]}`), kgo.RecordHeader{Key: schemas.HeaderLease, Value: []byte("g")})
	add(e.topics.Deliveries, r1, doubt(r1, schemas.OutcomeDelivered, 1, true, ms+100))
	add(e.topics.Deliveries, r2, doubt(r2, schemas.OutcomeDelivered, 1, false, ms+100))
	add(e.topics.Deliveries, r3, doubt(r3, schemas.OutcomeRetry, 1, true, ms+100))
	add(e.topics.Deliveries, r3, doubt(r3, schemas.OutcomeDelivered, 2, true, ms+200))
	add(e.topics.Deliveries, r3, doubt(r3, schemas.OutcomeDelivered, 3, true, ms+300))
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
		return got.Delivered == 3 && got.DeliveredTwice == 1, fmt.Sprintf("%+v", numbers(got))
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got.PossiblyTwice != 1 {
		t.Errorf("possibly delivered twice = %d, want 1 (r3 is already counted as delivered twice)", got.PossiblyTwice)
	}
	if len(got.Malformed) != 0 {
		t.Errorf("malformed %v: the lease marker must be skipped", got.Malformed)
	}
	if len(got.Problems()) != 2 {
		t.Errorf("problems %q, want the double and the possible double", got.Problems())
	}
	rows, err := a.List(context.Background(), opts, "possibly-twice", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 || rows[0].ReportID != r1 {
		t.Errorf("--list possibly-twice = %+v, want only %s", rows, r1)
	}
}
