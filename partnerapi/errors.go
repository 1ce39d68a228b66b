package partnerapi

import (
	"errors"
	"strconv"
	"time"
)

// Kind classifies an API failure by what the caller can do about it.
type Kind int

const (
	// KindTransient: 500, 503, timeout, connection error. Retry with backoff.
	KindTransient Kind = iota + 1
	// KindRejected: 400 (or another 4xx) in the API's own JSON envelope. The
	// request will never pass as it is; Reason holds the API's reason or
	// message and, for play reports, Fields the offending fields. A 4xx that
	// is not the API's envelope (an edge's page) is KindTransient instead.
	KindRejected
	// KindUnauthorized: 401. The token was missing, expired or standby-minted;
	// the client has dropped it, so the next call takes a new session.
	KindUnauthorized
	// KindEdgeBlocked: 403 with edge error 1010. The User-Agent is blocked: a
	// configuration error that no retry fixes.
	KindEdgeBlocked
	// KindNotFound: 404 (mix not found).
	KindNotFound
)

// kindNames are the names String gives the kinds.
var kindNames = [...]string{
	KindTransient:    "transient",
	KindRejected:     "rejected",
	KindUnauthorized: "unauthorized",
	KindEdgeBlocked:  "edge-blocked",
	KindNotFound:     "not-found",
}

func (k Kind) String() string {
	if k >= KindTransient && int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Endpoint is the endpoint of the partner API a call went to. Callers
// decide on it (Error.Endpoint), never on Error.Op, which is the call's
// name for people (with a GET's id) and may be reworded.
type Endpoint int

const (
	// EndpointSession: POST /partners/session.
	EndpointSession Endpoint = iota + 1
	// EndpointSessionWithUser: POST /partners/session/with-user.
	EndpointSessionWithUser
	// EndpointReport: POST /partners/royalty-tracking, the play reports.
	EndpointReport
	// EndpointCatalog: GET /partners/catalog.
	EndpointCatalog
	// EndpointRestrictedCatalog: GET /partners/catalog/restricted.
	EndpointRestrictedCatalog
	// EndpointPage: GET /partners/page/{id}.
	EndpointPage
	// EndpointList: GET /partners/list/{id}.
	EndpointList
	// EndpointGenres: GET /partners/genres/{id}.
	EndpointGenres
	// EndpointMix: GET /partners/mix/{id}.
	EndpointMix
)

// endpointNames are the names String gives the endpoints: the method and
// the path, a GET's id as {id} (low cardinality, for metrics).
var endpointNames = [...]string{
	EndpointSession:           "POST " + PathSession,
	EndpointSessionWithUser:   "POST " + PathSessionWithUser,
	EndpointReport:            "POST " + PathRoyaltyTracking,
	EndpointCatalog:           "GET " + PathCatalog,
	EndpointRestrictedCatalog: "GET " + PathRestrictedCatalog,
	EndpointPage:              "GET " + PathPage + "{id}",
	EndpointList:              "GET " + PathList + "{id}",
	EndpointGenres:            "GET " + PathGenres + "{id}",
	EndpointMix:               "GET " + PathMix + "{id}",
}

func (e Endpoint) String() string {
	if e >= EndpointSession && int(e) < len(endpointNames) {
		return endpointNames[e]
	}
	return "endpoint(" + strconv.Itoa(int(e)) + ")"
}

// Session reports whether e is one of the session endpoints, where a 400
// or 401 means the credentials were refused.
func (e Endpoint) Session() bool {
	return e == EndpointSession || e == EndpointSessionWithUser
}

// Sentinels for errors.Is: errors.Is(err, ErrTransient) is true for every
// *Error of KindTransient, and so on.
var (
	ErrTransient    = &Error{Kind: KindTransient}
	ErrRejected     = &Error{Kind: KindRejected}
	ErrUnauthorized = &Error{Kind: KindUnauthorized}
	ErrEdgeBlocked  = &Error{Kind: KindEdgeBlocked}
	ErrNotFound     = &Error{Kind: KindNotFound}
)

// Error is a failed call to the partner API. It never holds a token or the
// client signature.
type Error struct {
	Kind Kind
	// Endpoint is the endpoint called: decide on it, not on Op.
	Endpoint Endpoint
	// Op names the call for people, e.g. "GET /partners/mix/42" or "POST
	// /partners/royalty-tracking".
	Op string
	// Status is the HTTP status, 0 when no answer came (timeout, connection error).
	Status int
	// ServedBy is the x-service-served-by header of the answer, if any.
	ServedBy ServedBy
	// Reason is the API's reason or message, bounded in length.
	Reason string
	// Fields are the offending fields of a rejected play report, parsed from
	// "include the required fields: a,b" (and from the clause "wrongly typed
	// optional fields: c" that the sandbox adds for optional fields).
	Fields []string
	// RetryAfter is the server's Retry-After, zero when absent.
	RetryAfter time.Duration
	// Doubt, on a failed play report post, says why the report's fate at
	// the partner is unknown: its request may have left the process and no
	// complete, well-formed answer of the API came back (one of the
	// schemas.Doubt* causes: timeout, connection_lost, malformed_answer,
	// edge_answer, cancelled). Empty when the API's own answer says it did
	// not take the report, or when nothing was sent.
	Doubt string
	// Foreign marks a non-2xx answer that is not the API's own (its JSON
	// envelope, or the plain-text 401 of its authentication layer): an
	// edge's or proxy's error page. Such an answer is never a final
	// rejection; it is KindTransient.
	Foreign bool
	// Err is the underlying transport error, if any.
	Err error
}

func (e *Error) Error() string {
	s := "partnerapi: " + e.Op + ": " + e.Kind.String()
	if e.Status != 0 {
		s += " (HTTP " + strconv.Itoa(e.Status) + ")"
	}
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// Is matches the Kind sentinels.
func (e *Error) Is(target error) bool {
	var t *Error
	if errors.As(target, &t) && t.Op == "" && t.Endpoint == 0 && t.Status == 0 && t.Err == nil {
		return t.Kind == e.Kind
	}
	return false
}

// KindOf returns the Kind of err, or 0 when err is not an *Error.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return 0
}
