package analytics

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
	r3, p3 := playJSON(t, "d1", 3, false) // a retry in doubt, then delivered twice on record
	r4, p4 := playJSON(t, "d1", 4, false) // two posts timed out (doubt_cause), then delivered once
	r5, p5 := playJSON(t, "d1", 5, false) // one post timed out, still pending: one copy at most, none extra
	r6, p6 := playJSON(t, "d1", 6, false) // two posts timed out, parked; redrive: one post timed out, then delivered
	r7, p7 := playJSON(t, "d1", 7, false) // delivered once; replayed once (the partner lost it): deliberate, none extra
	doubtCause := func(id string, outcome string, attempt int, inDoubt bool, cause string, at int64) []byte {
		return mustJSON(t, schemas.Delivery{V: schemas.DeliveryVersion, ReportID: id, EventID: "d1", Outcome: outcome,
			Attempt: attempt, HTTPStatus: 200, InDoubt: inDoubt, DoubtCause: cause, At: at})
	}
	doubt := func(id string, outcome string, attempt int, inDoubt bool, at int64) []byte {
		return doubtCause(id, outcome, attempt, inDoubt, "", at)
	}
	replayed := func(id string, outcome string, attempt int, cause string, at int64) []byte {
		return mustJSON(t, schemas.Delivery{V: schemas.DeliveryVersion, ReportID: id, EventID: "d1", Outcome: outcome,
			Attempt: attempt, HTTPStatus: 200, InDoubt: cause != "", DoubtCause: cause, At: at, ReplayID: "rd-1"})
	}
	var recs []*kgo.Record
	add := func(topic, key string, v []byte, h ...kgo.RecordHeader) {
		recs = append(recs, &kgo.Record{Topic: topic, Key: []byte(key), Value: v, Timestamp: t0, Headers: h})
	}
	add(e.topics.Events, "d1", eventJSON(t, "d1", "u1"))
	add(e.topics.Reports, r1, p1)
	add(e.topics.Reports, r2, p2)
	add(e.topics.Reports, r3, p3)
	add(e.topics.Reports, r4, p4)
	add(e.topics.Reports, r5, p5)
	add(e.topics.Reports, r6, p6)
	add(e.topics.Reports, r7, p7)
	add(e.topics.Deliveries, "", []byte(`{"v":1,"partition":0,"offsets":[[0,2]]}`), kgo.RecordHeader{Key: schemas.HeaderLease, Value: []byte("g")})
	add(e.topics.Deliveries, r1, doubt(r1, schemas.OutcomeDelivered, 1, true, ms+100))
	add(e.topics.Deliveries, r2, doubt(r2, schemas.OutcomeDelivered, 1, false, ms+100))
	add(e.topics.Deliveries, r3, doubt(r3, schemas.OutcomeRetry, 1, true, ms+100))
	add(e.topics.Deliveries, r3, doubt(r3, schemas.OutcomeDelivered, 2, true, ms+200))
	add(e.topics.Deliveries, r3, doubt(r3, schemas.OutcomeDelivered, 3, true, ms+300))
	add(e.topics.Deliveries, r4, doubtCause(r4, schemas.OutcomeRetry, 1, true, schemas.DoubtTimeout, ms+100))
	add(e.topics.Deliveries, r4, doubtCause(r4, schemas.OutcomeRetry, 2, true, schemas.DoubtTimeout, ms+200))
	add(e.topics.Deliveries, r4, doubt(r4, schemas.OutcomeDelivered, 3, true, ms+300))
	add(e.topics.Deliveries, r5, doubtCause(r5, schemas.OutcomeRetry, 1, true, schemas.DoubtTimeout, ms+100))
	add(e.topics.Deliveries, r6, doubtCause(r6, schemas.OutcomeRetry, 1, true, schemas.DoubtTimeout, ms+100))
	add(e.topics.Deliveries, r6, doubtCause(r6, schemas.OutcomeRetry, 2, true, schemas.DoubtTimeout, ms+200))
	add(e.topics.Deliveries, r6, doubtCause(r6, schemas.OutcomeParked, 3, true, "", ms+300))
	add(e.topics.Deliveries, r6, replayed(r6, schemas.OutcomeRetry, 1, schemas.DoubtTimeout, ms+400))
	add(e.topics.Deliveries, r6, replayed(r6, schemas.OutcomeDelivered, 2, "", ms+500))
	add(e.topics.Deliveries, r7, doubt(r7, schemas.OutcomeDelivered, 1, false, ms+100))
	add(e.topics.Deliveries, r7, replayed(r7, schemas.OutcomeDelivered, 1, "", ms+500))
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
		return got.Delivered == 6 && got.DeliveredTwice == 1 && got.Pending == 1, fmt.Sprintf("%+v", numbers(got))
	})
	if err := s.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got.PossiblyTwice != 2 {
		t.Errorf("possibly delivered twice = %d, want 2 (r1, r4; r3 is already counted as delivered twice)", got.PossiblyTwice)
	}
	// Copies: r1 1 + 1 legacy in doubt − 1 = 1; r3 2 delivered + 1 legacy − 1
	// = 2; r4 1 + 2 timeouts − 1 = 2; r5 0 + 1 − 1 = 0; r6 (never delivered
	// by the reporter) 2 timeouts + the redrive's 1 delivered + 1 timeout − 1
	// = 3; r7 1 − 1 = 0 (its replay is deliberate).
	if got.PossibleExtraCopies != 8 || got.PlaysWithExtraCopies != 4 {
		t.Errorf("possible extra copies = %d of %d plays, want 8 of 4", got.PossibleExtraCopies, got.PlaysWithExtraCopies)
	}
	// r4 2, r5 1, r6 2 and its redrive's 1.
	if fmt.Sprint(got.DoubtfulPostsByCause) != fmt.Sprint([]Count{{Key: schemas.DoubtTimeout, N: 6}}) {
		t.Errorf("doubtful posts by cause = %+v, want timeout 6", got.DoubtfulPostsByCause)
	}
	if len(got.Malformed) != 0 {
		t.Errorf("malformed %v: the lease marker must be skipped", got.Malformed)
	}
	if len(got.Problems()) != 3 || !strings.Contains(got.Problems()[2], "up to 8 extra copies of 4 plays") || !strings.Contains(got.Problems()[2], "timeout 6") {
		t.Errorf("problems %q, want the double, the possible doubles and the copies with their cause", got.Problems())
	}
	rows, err := a.List(context.Background(), opts, "possibly-twice", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || !slices.ContainsFunc(rows, func(r ListRow) bool { return r.ReportID == r1 }) || !slices.ContainsFunc(rows, func(r ListRow) bool { return r.ReportID == r4 }) {
		t.Errorf("--list possibly-twice = %+v, want %s and %s", rows, r1, r4)
	}
	rows, err = a.List(context.Background(), opts, "extra-copies", 10)
	if err != nil {
		t.Fatal(err)
	}
	details := map[string]string{}
	for _, r := range rows {
		details[r.ReportID] = r.Detail
	}
	if len(rows) != 4 || details[r1] != "1: " || details[r3] != "2: " || details[r4] != "2: timeout" || details[r6] != "3: timeout" {
		t.Errorf("--list extra-copies = %+v", rows)
	}
}
