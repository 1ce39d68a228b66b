package schemas

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"unicode/utf8"

	"github.com/playpipe/playpipe/partnerapi"
)

// Record versions written by this build.
const (
	TrackPlayVersion = 1
	RejectionVersion = 1
	DeliveryVersion  = 1
)

// TrackPlay is one track play derived from a player event (topic
// <prefix>.reports, key = report id). Report is the exact body to POST.
type TrackPlay struct {
	V        int    `json:"v"`
	ReportID string `json:"report_id"`
	EventID  string `json:"event_id"`
	MixID    int64  `json:"mix_id"`
	// Position is the index of the track in the mix listing as the API served it.
	Position int `json:"position"`
	// OverlapMS is the exact overlap of the segment with the track.
	OverlapMS int64 `json:"overlap_ms"`
	// BelowMinimum plays are shorter than the configured minimum play length:
	// counted in the ledger, never posted.
	BelowMinimum bool `json:"below_minimum,omitempty"`
	// NoUserID marks a play of an event without user_id let through by policy.
	NoUserID bool `json:"no_user_id,omitempty"`
	// StandbyListing marks a play split with a track listing served by standby.
	StandbyListing bool `json:"standby_listing,omitempty"`
	// DerivedAt is when the consumer derived the play (epoch ms).
	DerivedAt int64                 `json:"derived_at"`
	Report    partnerapi.PlayReport `json:"report"`
}

// ReportID is the deterministic id of the play of the track at position
// (index in the listing) in event eventID: the first 16 bytes of
// SHA-256(eventID, 0x00, position), in hex. The same event always yields the
// same ids, so re-published events and replays are recognised.
func ReportID(eventID string, position int) string {
	h := sha256.New()
	h.Write([]byte(eventID))
	var buf [24]byte
	b := append(buf[:0], 0)
	b = strconv.AppendInt(b, int64(position), 10)
	h.Write(b)
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// Source locates a record in Kafka.
type Source struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// Rejection is an event that broke a rule (topic <prefix>.rejected, key = the
// event's key). Raw holds the event bytes verbatim when they are valid UTF-8;
// otherwise RawBase64 is set and Raw holds them in standard base64.
type Rejection struct {
	V          int         `json:"v"`
	EventID    string      `json:"event_id,omitempty"`
	Reason     string      `json:"reason"` // the first violation's reason
	Violations []Violation `json:"violations"`
	Raw        string      `json:"raw"`
	RawBase64  bool        `json:"raw_base64,omitempty"`
	Source     Source      `json:"source"`
	At         int64       `json:"at"` // epoch ms
}

// NewRejection builds the rejection record of raw event bytes.
func NewRejection(raw []byte, eventID string, vs []Violation, src Source, atMS int64) Rejection {
	r := Rejection{V: RejectionVersion, EventID: eventID, Violations: vs, Source: src, At: atMS}
	if len(vs) > 0 {
		r.Reason = vs[0].Reason
	}
	if utf8.Valid(raw) {
		r.Raw = string(raw)
	} else {
		r.Raw, r.RawBase64 = base64.StdEncoding.EncodeToString(raw), true
	}
	return r
}

// Delivery outcomes.
const (
	OutcomeDelivered = "delivered" // 200 from live service (or live-bypass when counted as delivered): final
	OutcomeRejected  = "rejected"  // 400: the API will never accept it: final
	OutcomeStandby   = "standby"   // 200 from standby: accepted but not forwarded; will be replayed
	OutcomeRetry     = "retry"     // transient failure or 401: will be retried
	OutcomeBlocked   = "blocked"   // 403 edge 1010: configuration error, the reporter stopped
)

// Delivery is one answer of the partner API to a report, or a final outcome
// (topic <prefix>.deliveries, key = report id).
type Delivery struct {
	V          int    `json:"v"`
	ReportID   string `json:"report_id"`
	EventID    string `json:"event_id"`
	Outcome    string `json:"outcome"`
	Attempt    int    `json:"attempt"`     // 1 for the first post of the report by this reporter
	HTTPStatus int    `json:"http_status"` // 0 when no answer (timeout, connection error)
	ServedBy   string `json:"served_by,omitempty"`
	// Partner is the base URL of the partner API that answered (the
	// reporter's configured --api-url, or the built-in sandbox's loopback
	// URL), so that the ledger can tell real deliveries from sandbox answers.
	// Empty in records written before it existed.
	Partner   string   `json:"partner,omitempty"`
	Message   string   `json:"message,omitempty"`
	Fields    []string `json:"fields,omitempty"`       // offending fields of a 400
	Reason    string   `json:"retry_reason,omitempty"` // why a retry: http_500, http_503, timeout, connection, unauthorized
	LatencyUS int64    `json:"latency_us"`
	TraceID   string   `json:"trace_id,omitempty"`
	Replay    bool     `json:"replay,omitempty"` // sent while replaying after a standby episode
	At        int64    `json:"at"`               // epoch ms of the answer
}
