package delivery

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// Action is what the reporter does with a report after one answer.
type Action int

const (
	// ActDelivered: final. The report reached live service.
	ActDelivered Action = iota + 1
	// ActRejected: final. The API will never accept this report as it is.
	ActRejected
	// ActStandby: not final. Standby answered 200 without forwarding the
	// report; the standby controller replays it once live service is back.
	ActStandby
	// ActRetry: not final. Post again after the backoff delay.
	ActRetry
	// ActStop: a configuration error that no retry fixes. The whole reporter
	// stops and commits nothing more.
	ActStop
	// ActAbandon: not final, no retry. The post was cancelled by our own
	// shutdown or a partition revocation; the report stays uncommitted and is
	// posted again by whoever consumes the partition next.
	ActAbandon
)

func (a Action) String() string {
	switch a {
	case ActDelivered:
		return "delivered"
	case ActRejected:
		return "rejected"
	case ActStandby:
		return "standby"
	case ActRetry:
		return "retry"
	case ActStop:
		return "stop"
	case ActAbandon:
		return "abandon"
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Final reports whether the action ends the report's delivery (its offset
// may be committed past).
func (a Action) Final() bool { return a == ActDelivered || a == ActRejected }

// Retry reasons written to Delivery.Reason and the playpipe.delivery.retries metric.
const (
	ReasonHTTP500      = "http_500"
	ReasonHTTP503      = "http_503"
	ReasonTimeout      = "timeout"
	ReasonConnection   = "connection"
	ReasonUnauthorized = "unauthorized"
)

// Decision is the classifier's verdict on one answer of the partner API.
type Decision struct {
	Action Action
	// Outcome is the schemas.Outcome* written to the Delivery record
	// (empty for ActAbandon: nothing is published for a cancelled post).
	Outcome  string
	Reason   string // retry reason, for ActRetry
	Status   int    // HTTP status, 0 when no answer came
	ServedBy partnerapi.ServedBy
	Message  string
	Fields   []string
	// RetryAfter is the server's Retry-After, honoured as the minimum delay.
	RetryAfter time.Duration
	// Renew marks a 401: the client has dropped its token and the next post
	// takes a new session (one at a time for all workers).
	Renew bool
	// Doubt is why this post's fate at the partner is unknown (a
	// schemas.Doubt* cause), empty when the API's own answer settled it or
	// nothing was sent: the request may have left the process (net/http
	// wrote it) and no complete, well-formed answer of the API came back —
	// a timeout, a lost connection, a cut or malformed answer, an edge's
	// page, a cancel after the first write. The report is labelled in doubt
	// from then on, and the attempt's Delivery record carries the cause.
	Doubt string
	// Err is the error of the answer, if any (never holds a secret).
	Err error
	// Signal is what the answer tells the in-flight limit (reporter/limit.go):
	// back-pressure, or an error about this post or path, or (zero) a
	// normal answer.
	Signal Signal
}

// Classify is the one place that decides what an answer of the partner API
// means for a report: the outcome table of docs/design.md ("Delivering a report"),
// with the reason for each case next to it. liveBypassDelivered says whether a
// 200 served by live-bypass counts as delivered (default) or is replayed like
// a standby answer.
func Classify(res partnerapi.ReportResult, err error, liveBypassDelivered bool) Decision {
	if err == nil {
		return classifyAnswer(res, liveBypassDelivered)
	}

	// Our own cancellation (graceful shutdown past its deadline, partition
	// revoked): the post's fate is unknown, the offset stays uncommitted, so
	// the report is posted again later. Checked first: the client may wrap
	// the context error in a transient *Error.
	var e *partnerapi.Error
	isAPI := errors.As(err, &e)
	if errors.Is(err, context.Canceled) {
		d := Decision{Action: ActAbandon, Err: err}
		if isAPI {
			d.Doubt = e.Doubt // written before the cancel: it may have arrived
		}
		return d
	}
	if !isAPI {
		// Not an API answer at all (the client failed before or around the
		// request): treat as a connection problem, retry with backoff. Never
		// drop a report on an error we do not understand.
		return Decision{Action: ActRetry, Outcome: schemas.OutcomeRetry, Reason: transportReason(err), Err: err, Signal: transportSignal(err)}
	}
	return classifyError(e, err)
}

// classifyAnswer decides what a 200 means, by the layer that served it.
func classifyAnswer(res partnerapi.ReportResult, liveBypassDelivered bool) Decision {
	d := Decision{Status: res.Meta.Status, ServedBy: res.Meta.ServedBy, Message: res.Message}
	if d.Status == 0 {
		d.Status = 200
	}
	switch res.Meta.ServedBy {
	case partnerapi.ServedStandby:
		// 200 from standby: accepted without validation and NOT forwarded
		// (spec, Standby mode 5). Not final: replay after standby ends.
		d.Action, d.Outcome = ActStandby, schemas.OutcomeStandby
	case partnerapi.ServedLiveBypass:
		// live-bypass: the primary took the report past the failover layer.
		// Counts as delivered unless the operator asked otherwise.
		if liveBypassDelivered {
			d.Action, d.Outcome = ActDelivered, schemas.OutcomeDelivered
		} else {
			d.Action, d.Outcome = ActStandby, schemas.OutcomeStandby
		}
	default:
		// 200 without x-service-served-by: live service validated the
		// report and handed it off. Final.
		d.Action, d.Outcome = ActDelivered, schemas.OutcomeDelivered
	}
	return d
}

// classifyError decides what an error answer of the partner API means, by
// its kind; err is the error that wraps e.
func classifyError(e *partnerapi.Error, err error) Decision {
	d := Decision{Status: e.Status, ServedBy: e.ServedBy, Message: e.Reason, Fields: e.Fields, RetryAfter: e.RetryAfter, Err: err, Doubt: e.Doubt}
	session := e.Endpoint.Session()

	switch e.Kind {
	case partnerapi.KindRejected:
		if session {
			// 400 on the session the client opened for this post: the
			// credentials are wrong. A configuration error; rejecting the
			// report would lose it, retrying cannot help.
			d.Action, d.Outcome = ActStop, schemas.OutcomeBlocked
			return d
		}
		// 400: the report is invalid and will never pass (message lists the
		// fields). Final, no retry. About this post, not the partner's
		// load: it counts toward the error rate only.
		d.Action, d.Outcome, d.Signal = ActRejected, schemas.OutcomeRejected, SignalPayload
	case partnerapi.KindUnauthorized:
		if session {
			// 401 from a session endpoint means credentials missing from the
			// body: a configuration error.
			d.Action, d.Outcome = ActStop, schemas.OutcomeBlocked
			return d
		}
		// 401: token missing, expired or standby-minted. The client dropped
		// it; the next post takes one new session shared by all workers.
		d.Action, d.Outcome, d.Reason, d.Renew = ActRetry, schemas.OutcomeRetry, ReasonUnauthorized, true
	case partnerapi.KindEdgeBlocked:
		// 403, edge error 1010: our User-Agent is blocked before the API.
		// Configuration error: stop everything, commit nothing more.
		d.Action, d.Outcome = ActStop, schemas.OutcomeBlocked
	case partnerapi.KindNotFound:
		// 404 on the report endpoint: the base URL points at something that
		// is not the partner API. Configuration error, like 1010.
		d.Action, d.Outcome = ActStop, schemas.OutcomeBlocked
	default:
		// KindTransient and anything unknown: 500, 503, timeout, connection
		// error, and every answer that is not the API's own (an edge's 400,
		// 413 or 502 page, a malformed 200: e.Foreign) — the API may never
		// have seen the report, so it is never a final rejection. The report
		// is fine; the service or the path is not. Retry with exponential
		// backoff and jitter, honouring Retry-After. e.Doubt says whether
		// this post may have reached the partner all the same.
		d.Action, d.Outcome = ActRetry, schemas.OutcomeRetry
		switch {
		case e.Status == 500:
			d.Reason = ReasonHTTP500
		case e.Status == 503:
			d.Reason = ReasonHTTP503
		case e.Status != 0:
			d.Reason = "http_" + strconv.Itoa(e.Status)
		default:
			d.Reason = transportReason(err)
		}
		// What it tells the in-flight limit: 429, 503, 408 and a
		// Retry-After ask for less, whoever sent them; other edge pages
		// and a 500 (one payload's failure) count toward the error rate.
		switch {
		case e.Status == 429, e.Status == 503, e.Status == 408, e.RetryAfter > 0:
			d.Signal = SignalBackPressure
		case e.Foreign:
			d.Signal = SignalEdge
		case e.Status >= 500:
			d.Signal = SignalPayload
		default: // no answer, or a cut or malformed one
			d.Signal = transportSignal(err)
		}
	}
	return d
}

// transportSignal is what a post without a usable answer tells the
// in-flight limit: a timeout, or a lost connection.
func transportSignal(err error) Signal {
	if transportReason(err) == ReasonTimeout {
		return SignalTimeout
	}
	return SignalConnection
}

// transportReason tells a timeout from another connection failure.
func transportReason(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return ReasonTimeout
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return ReasonTimeout
	}
	return ReasonConnection
}
