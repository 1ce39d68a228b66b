package analytics

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// TestAuditParked: a play the reporter parked (its transient failures
// outlasted the retry budget) is pending and parked, never delivered, listed
// with its last answer and attempts, and fails the audit; a parked play a
// slow retry delivered later, and one a redrive delivered, count as
// delivered only; a parked play whose slow retry failed again stays parked
// with that answer.
func TestAuditParked(t *testing.T) {
	e := newEnv(t)
	now := time.Now()
	t0 := now.Add(-time.Minute).Truncate(time.Millisecond)
	ms := t0.UnixMilli()
	r1, p1 := playJSON(t, "k1", 0, false) // parked
	r2, p2 := playJSON(t, "k1", 1, false) // parked, then delivered by a slow retry
	r3, p3 := playJSON(t, "k1", 3, false) // parked, then delivered by redrive --parked
	r4, p4 := playJSON(t, "k1", 4, false) // parked, a slow retry failed again: still parked
	answer := func(id, outcome string, attempt, status int, reason, msg, replay string, at int64) []byte {
		return mustJSON(t, schemas.Delivery{V: schemas.DeliveryVersion, ReportID: id, EventID: "k1", Outcome: outcome,
			Attempt: attempt, HTTPStatus: status, Reason: reason, Message: msg, ReplayID: replay, At: at})
	}
	var recs []*kgo.Record
	add := func(topic, key string, v []byte) {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: v, Timestamp: t0})
	}
	add(e.topics.Events, "k1", eventJSON(t, "k1", "u1"))
	for _, p := range [][2]any{{r1, p1}, {r2, p2}, {r3, p3}, {r4, p4}} {
		add(e.topics.Reports, p[0].(string), p[1].([]byte))
	}
	for _, id := range []string{r1, r2, r3, r4} {
		add(e.topics.Deliveries, id, answer(id, schemas.OutcomeRetry, 1, 500, "http_500", "internal service error", "", ms+100))
		add(e.topics.Deliveries, id, answer(id, schemas.OutcomeParked, 20, 500, "http_500", "internal service error", "", ms+200))
	}
	add(e.topics.Deliveries, r2, answer(r2, schemas.OutcomeDelivered, 21, 200, "", "", "", ms+300))
	add(e.topics.Deliveries, r3, answer(r3, schemas.OutcomeDelivered, 1, 200, "", "", "rp-parked", ms+300))
	add(e.topics.Deliveries, r4, answer(r4, schemas.OutcomeParked, 21, 503, "http_503", "service unavailable", "", ms+300))
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
		return got.Delivered == 2 && got.Pending == 2, fmt.Sprintf("%+v", numbers(got))
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got.Parked != 2 || got.DeliveredTwice != 0 {
		t.Errorf("parked %d, delivered twice %d: want 2 (r1, r4), 0", got.Parked, got.DeliveredTwice)
	}
	if !strings.Contains(strings.Join(got.Problems(), "; "), "2 plays parked") {
		t.Errorf("problems %q: want the parked plays", got.Problems())
	}
	rows, err := a.List(context.Background(), opts, "parked", 10)
	if err != nil {
		t.Fatal(err)
	}
	details := map[string]string{}
	for _, r := range rows {
		details[r.ReportID] = r.Detail
	}
	want := map[string]string{
		r1: "parked (HTTP 500 http_500: internal service error; attempt 20)",
		r4: "parked (HTTP 503 http_503: service unavailable; attempt 21)",
	}
	if fmt.Sprint(details) != fmt.Sprint(want) {
		t.Errorf("--list parked = %v, want %v", details, want)
	}
	rows, err = a.List(context.Background(), opts, "pending", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Errorf("--list pending = %+v, want the two parked plays", rows)
	}
	rows, err = a.List(context.Background(), opts, "delivered", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 {
		t.Errorf("--list delivered = %+v, want r2 and r3", rows)
	}
}
