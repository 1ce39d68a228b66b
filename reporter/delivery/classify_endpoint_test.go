package delivery

import (
	"fmt"
	"testing"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// TestClassifyByEndpoint: a session endpoint refusing the credentials (400
// or 401) stops the reporter, decided by Error.Endpoint whatever Op says; a
// report endpoint's 400 or 401 is about the report or the token, whatever
// Op says.
func TestClassifyByEndpoint(t *testing.T) {
	for _, tc := range []struct {
		ep     partnerapi.Endpoint
		op     string
		kind   partnerapi.Kind
		action Action
	}{
		{partnerapi.EndpointSession, "create session", partnerapi.KindRejected, ActStop},
		{partnerapi.EndpointSessionWithUser, "", partnerapi.KindUnauthorized, ActStop},
		{partnerapi.EndpointReport, "POST /partners/session (a misleading name)", partnerapi.KindRejected, ActRejected},
		{partnerapi.EndpointReport, "POST /partners/session (a misleading name)", partnerapi.KindUnauthorized, ActRetry},
	} {
		err := fmt.Errorf("post: %w", &partnerapi.Error{Kind: tc.kind, Endpoint: tc.ep, Op: tc.op, Status: 400})
		d := Classify(partnerapi.ReportResult{}, err, true)
		if d.Action != tc.action || (tc.action == ActStop && d.Outcome != schemas.OutcomeBlocked) {
			t.Errorf("%v %q %v: %v (%s), want %v", tc.ep, tc.op, tc.kind, d.Action, d.Outcome, tc.action)
		}
	}
}
