package delivery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

func TestClassify(t *testing.T) {
	opErr := func(k partnerapi.Kind, status int) *partnerapi.Error {
		return &partnerapi.Error{Kind: k, Op: "POST /partners/royalty-tracking", Status: status}
	}
	live := partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200}, Message: "ok"}
	standby := partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200, ServedBy: partnerapi.ServedStandby}}
	bypass := partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200, ServedBy: partnerapi.ServedLiveBypass}}
	rejected := opErr(partnerapi.KindRejected, 400)
	rejected.Reason, rejected.Fields = "include the required fields: country", []string{"country"}
	retryAfter := opErr(partnerapi.KindTransient, 503)
	retryAfter.RetryAfter = 3 * time.Second
	timeout := &partnerapi.Error{Kind: partnerapi.KindTransient, Op: "POST /partners/royalty-tracking", Err: fmt.Errorf("post: %w", context.DeadlineExceeded)}
	conn := &partnerapi.Error{Kind: partnerapi.KindTransient, Op: "POST /partners/royalty-tracking", Err: &net.OpError{Op: "dial", Err: os.ErrNotExist}}
	cancelled := &partnerapi.Error{Kind: partnerapi.KindTransient, Op: "POST /partners/royalty-tracking", Err: context.Canceled}
	badCreds := &partnerapi.Error{Kind: partnerapi.KindRejected, Endpoint: partnerapi.EndpointSession, Op: "POST /partners/session", Status: 400, Reason: "credentials invalid"}

	cases := []struct {
		name    string
		res     partnerapi.ReportResult
		err     error
		bypass  bool
		action  Action
		outcome string
		reason  string
	}{
		{"live 200", live, nil, true, ActDelivered, schemas.OutcomeDelivered, ""},
		{"standby 200", standby, nil, true, ActStandby, schemas.OutcomeStandby, ""},
		{"live-bypass delivered", bypass, nil, true, ActDelivered, schemas.OutcomeDelivered, ""},
		{"live-bypass replayed", bypass, nil, false, ActStandby, schemas.OutcomeStandby, ""},
		{"400", partnerapi.ReportResult{}, rejected, true, ActRejected, schemas.OutcomeRejected, ""},
		{"401", partnerapi.ReportResult{}, opErr(partnerapi.KindUnauthorized, 401), true, ActRetry, schemas.OutcomeRetry, ReasonUnauthorized},
		{"403 edge", partnerapi.ReportResult{}, opErr(partnerapi.KindEdgeBlocked, 403), true, ActStop, schemas.OutcomeBlocked, ""},
		{"404", partnerapi.ReportResult{}, opErr(partnerapi.KindNotFound, 404), true, ActStop, schemas.OutcomeBlocked, ""},
		{"500", partnerapi.ReportResult{}, opErr(partnerapi.KindTransient, 500), true, ActRetry, schemas.OutcomeRetry, ReasonHTTP500},
		{"503", partnerapi.ReportResult{}, retryAfter, true, ActRetry, schemas.OutcomeRetry, ReasonHTTP503},
		{"502", partnerapi.ReportResult{}, opErr(partnerapi.KindTransient, 502), true, ActRetry, schemas.OutcomeRetry, "http_502"},
		{"timeout", partnerapi.ReportResult{}, timeout, true, ActRetry, schemas.OutcomeRetry, ReasonTimeout},
		{"connection", partnerapi.ReportResult{}, conn, true, ActRetry, schemas.OutcomeRetry, ReasonConnection},
		{"unknown error", partnerapi.ReportResult{}, errors.New("boom"), true, ActRetry, schemas.OutcomeRetry, ReasonConnection},
		{"cancelled", partnerapi.ReportResult{}, cancelled, true, ActAbandon, "", ""},
		{"session credentials", partnerapi.ReportResult{}, badCreds, true, ActStop, schemas.OutcomeBlocked, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := Classify(c.res, c.err, c.bypass)
			if d.Action != c.action || d.Outcome != c.outcome || d.Reason != c.reason {
				t.Fatalf("Classify = %v/%q/%q, want %v/%q/%q", d.Action, d.Outcome, d.Reason, c.action, c.outcome, c.reason)
			}
		})
	}
	d := Classify(partnerapi.ReportResult{}, rejected, true)
	if d.Message != rejected.Reason || len(d.Fields) != 1 || d.Fields[0] != "country" || d.Status != 400 {
		t.Fatalf("400 decision lost message/fields: %+v", d)
	}
	if d := Classify(partnerapi.ReportResult{}, retryAfter, true); d.RetryAfter != 3*time.Second {
		t.Fatalf("Retry-After not carried: %v", d.RetryAfter)
	}
	if d := Classify(partnerapi.ReportResult{}, opErr(partnerapi.KindUnauthorized, 401), true); !d.Renew {
		t.Fatal("401 must ask for a renewal")
	}
	for _, a := range []Action{ActDelivered, ActRejected} {
		if !a.Final() {
			t.Fatalf("%v must be final", a)
		}
	}
	for _, a := range []Action{ActStandby, ActRetry, ActStop, ActAbandon} {
		if a.Final() {
			t.Fatalf("%v must not be final", a)
		}
	}
}
