package delivery

import (
	"context"
	"fmt"
	"testing"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// TestClassifyDoubt: the classifier carries the client's doubt cause (the
// request may have left, no complete answer of the API) into the decision,
// an edge's page is retried (never final), and a well-formed answer of the
// API is never in doubt.
func TestClassifyDoubt(t *testing.T) {
	const op = "POST /partners/royalty-tracking"
	cases := []struct {
		name   string
		err    error
		action Action
		doubt  string
	}{
		{"timeout after sending", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Doubt: schemas.DoubtTimeout, Err: context.DeadlineExceeded}, ActRetry, schemas.DoubtTimeout},
		{"reset after sending", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Doubt: schemas.DoubtConnectionLost}, ActRetry, schemas.DoubtConnectionLost},
		{"edge 413 page", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Status: 413, Foreign: true, Doubt: schemas.DoubtEdgeAnswer}, ActRetry, schemas.DoubtEdgeAnswer},
		{"edge 400 page", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Status: 400, Foreign: true, Doubt: schemas.DoubtEdgeAnswer}, ActRetry, schemas.DoubtEdgeAnswer},
		{"malformed 200", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Status: 200, Foreign: true, Doubt: schemas.DoubtMalformedAnswer}, ActRetry, schemas.DoubtMalformedAnswer},
		{"API's 500", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Status: 500}, ActRetry, ""},
		{"API's 400", &partnerapi.Error{Kind: partnerapi.KindRejected, Op: op, Status: 400}, ActRejected, ""},
		{"cancelled after sending", fmt.Errorf("post: %w", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Doubt: schemas.DoubtCancelled, Err: context.Canceled}), ActAbandon, schemas.DoubtCancelled},
		{"cancelled before sending", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Err: context.Canceled}, ActAbandon, ""},
		{"refused", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op}, ActRetry, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Classify(partnerapi.ReportResult{}, c.err, true)
			if d.Action != c.action || d.Doubt != c.doubt {
				t.Fatalf("Classify = %v doubt %q, want %v doubt %q", d.Action, d.Doubt, c.action, c.doubt)
			}
		})
	}
}
