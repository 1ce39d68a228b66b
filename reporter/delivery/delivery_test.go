package delivery

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// TestNew: the one Delivery builder labels doubt as docs/design.md
// says: a post in doubt carries its own cause and labels the report from
// then on; a post without a record of its own leaves its cause to the
// next record, which carries it once; an abandoned post given a record of
// its own (replay) is a retry with its cause.
func TestNew(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_000)
	a := func(n int, d Decision) *Attempt {
		return &Attempt{ReportID: "r1", EventID: "e1", N: n, Decision: d, Latency: 1500 * time.Microsecond,
			Partner: "http://p", ReplayID: "rp-1", ReplayReason: "why", At: at}
	}
	var s Doubt
	retry := Decision{Action: ActRetry, Outcome: schemas.OutcomeRetry, Reason: ReasonHTTP500, Status: 500}
	del := New(a(1, retry), &s)
	if del.InDoubt || del.DoubtCause != "" || del.Outcome != schemas.OutcomeRetry || del.Attempt != 1 || del.LatencyUS != 1500 ||
		del.At != at.UnixMilli() || del.ReplayID != "rp-1" || del.ReplayReason != "why" || del.Partner != "http://p" || del.V != schemas.DeliveryVersion {
		t.Fatalf("plain retry: %+v", del)
	}
	// Abandoned in flight without a record (the reporter): carried.
	abandoned := Decision{Action: ActAbandon, Doubt: schemas.DoubtCancelled, Err: context.Canceled}
	s.Posted(abandoned, false)
	if !s.InDoubt || s.Carried != schemas.DoubtCancelled {
		t.Fatalf("after an abandoned post: %+v", s)
	}
	// The next post has a cause of its own: both counted, the carried one later.
	timeout := Decision{Action: ActRetry, Outcome: schemas.OutcomeRetry, Reason: ReasonTimeout, Doubt: schemas.DoubtTimeout, Err: errors.New("deadline")}
	s.Posted(timeout, true)
	if del = New(a(3, timeout), &s); !del.InDoubt || del.DoubtCause != schemas.DoubtTimeout || del.Message != "deadline" || s.Carried != schemas.DoubtCancelled {
		t.Fatalf("own cause: %+v, left %+v", del, s)
	}
	ok := Decision{Action: ActDelivered, Outcome: schemas.OutcomeDelivered, Status: 200, Message: "success"}
	s.Posted(ok, true)
	if del = New(a(4, ok), &s); !del.InDoubt || del.DoubtCause != schemas.DoubtCancelled || s.Carried != "" {
		t.Fatalf("carried cause: %+v, left %+v", del, s)
	}
	if del = New(a(5, ok), &s); !del.InDoubt || del.DoubtCause != "" {
		t.Fatalf("carried twice: %+v", del)
	}
	// An abandoned post with a record of its own (replay).
	var r Doubt
	r.Posted(abandoned, true)
	if del = New(a(1, abandoned), &r); del.Outcome != schemas.OutcomeRetry || !del.InDoubt || del.DoubtCause != schemas.DoubtCancelled || r.Carried != "" || del.Message == "" {
		t.Fatalf("abandoned with a record: %+v, left %+v", del, r)
	}
}
