package schemas

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"unicode/utf8"
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
	DerivedAt int64 `json:"derived_at"`
	// EventAt is the Kafka timestamp (epoch ms) of the event record the
	// play was derived from: the audit's delay starts there without
	// looking the event up. 0 (absent) in records written before the
	// field existed.
	EventAt int64      `json:"event_at,omitempty"`
	Report  PlayReport `json:"report"`
}

// ReportID is the deterministic id of the play of the track at position
// (index in the listing) in event eventID: the first 16 bytes of
// SHA-256(eventID, 0x00, position), in hex. The same event always yields the
// same ids, so re-published events and replays are recognised.
func ReportID(eventID string, position int) string {
	var buf [2 * reportIDBytes]byte
	return string(AppendReportID(buf[:0], eventID, position))
}

// reportIDBytes is how many bytes of the SHA-256 sum a report id keeps.
const reportIDBytes = 16

// AppendReportID appends ReportID(eventID, position) to dst as hex: the one
// rule, without allocating for an event id of at most MaxEventIDLen bytes
// (the consumer's path, one call per play).
func AppendReportID(dst []byte, eventID string, position int) []byte {
	var sum [sha256.Size]byte
	if len(eventID) <= MaxEventIDLen {
		var buf [MaxEventIDLen + 24]byte
		b := append(buf[:0], eventID...)
		b = append(b, 0)
		b = strconv.AppendInt(b, int64(position), 10)
		sum = sha256.Sum256(b)
	} else {
		h := sha256.New()
		h.Write([]byte(eventID))
		var buf [24]byte
		b := append(buf[:0], 0)
		b = strconv.AppendInt(b, int64(position), 10)
		h.Write(b)
		h.Sum(sum[:0])
	}
	return hex.AppendEncode(dst, sum[:reportIDBytes])
}

// Source locates a record in Kafka.
type Source struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
}

// MaxRejectionRaw bounds the raw field of a Rejection: the JSON-encoded
// string (quotes and escapes included, as encoding/json writes it) is at most
// this many bytes. JSON escaping can grow an event sixfold ('<' is written
// \u003c), so the bound is on the encoded form, not on the event's length:
// a rejection record stays under MaxRejectionRaw plus its violations (a few
// KiB) whatever the event, well inside Kafka's default 1 MiB record limit.
const MaxRejectionRaw = 64 << 10

// Rejection is an event that broke a rule (topic <prefix>.rejected, key = the
// event's key). Raw holds the event bytes verbatim when they are valid UTF-8;
// otherwise RawBase64 is set and Raw holds them in standard base64. Raw is
// bounded (MaxRejectionRaw): a longer event keeps its first bytes and is
// marked RawTruncated; RawLen and RawSHA256 always describe the whole event,
// so a re-driven or recovered copy can be checked against it.
type Rejection struct {
	V            int         `json:"v"`
	EventID      string      `json:"event_id,omitempty"`
	Reason       string      `json:"reason"` // the first violation's reason
	Violations   []Violation `json:"violations"`
	Raw          string      `json:"raw"`
	RawBase64    bool        `json:"raw_base64,omitempty"`
	RawLen       int         `json:"raw_len"`                 // length of the whole event in bytes
	RawSHA256    string      `json:"raw_sha256"`              // hex SHA-256 of the whole event
	RawTruncated bool        `json:"raw_truncated,omitempty"` // Raw holds only the first bytes of the event
	Source       Source      `json:"source"`
	At           int64       `json:"at"` // epoch ms
}

// NewRejection builds the rejection record of raw event bytes, keeping at
// most MaxRejectionRaw encoded bytes of them (see Rejection).
func NewRejection(raw []byte, eventID string, vs []Violation, src Source, atMS int64) Rejection {
	return newRejection(raw, eventID, vs, src, atMS, MaxRejectionRaw)
}

// NewRejectionBounded is NewRejection with another bound on the encoded raw
// field; maxRaw ≤ 0 keeps no raw bytes at all (only their length and hash).
func NewRejectionBounded(raw []byte, eventID string, vs []Violation, src Source, atMS int64, maxRaw int) Rejection {
	return newRejection(raw, eventID, vs, src, atMS, maxRaw)
}

func newRejection(raw []byte, eventID string, vs []Violation, src Source, atMS int64, maxRaw int) Rejection {
	sum := sha256.Sum256(raw)
	r := Rejection{V: RejectionVersion, EventID: eventID, Violations: vs, Source: src, At: atMS,
		RawLen: len(raw), RawSHA256: hex.EncodeToString(sum[:])}
	if len(vs) > 0 {
		r.Reason = vs[0].Reason
	}
	if utf8.Valid(raw) {
		n := rawPrefixLen(raw, maxRaw)
		r.Raw, r.RawTruncated = string(raw[:n]), n < len(raw)
	} else {
		// Base64 needs no escaping: 4 bytes for every 3, plus the quotes.
		n := min(len(raw), max(0, (maxRaw-2)/4*3))
		r.Raw, r.RawBase64, r.RawTruncated = base64.StdEncoding.EncodeToString(raw[:n]), true, n < len(raw)
	}
	return r
}

// rawPrefixLen returns the length of the longest prefix of raw (valid UTF-8)
// that ends on a rune boundary and whose JSON encoding, quotes included, is
// at most maxEnc bytes.
func rawPrefixLen(raw []byte, maxEnc int) int {
	if len(raw)+2 <= maxEnc && len(raw)*6+2 <= maxEnc {
		return len(raw) // fits even if every byte were escaped
	}
	enc := 2 // the quotes
	for i := 0; i < len(raw); {
		c := raw[i]
		n, w := 1, 1
		if c < utf8.RuneSelf {
			w = escapedASCIILen(c)
		} else {
			var r rune
			r, n = utf8.DecodeRune(raw[i:])
			w = n
			if r == '\u2028' || r == '\u2029' {
				w = 6
			}
		}
		if enc+w > maxEnc {
			return i
		}
		enc += w
		i += n
	}
	return len(raw)
}

// escapedASCIILen is how many bytes encoding/json writes for the ASCII byte c
// inside a string (HTML escaping on, as json.Marshal does).
func escapedASCIILen(c byte) int {
	switch {
	case c == '"' || c == '\\' || c == '\b' || c == '\f' || c == '\n' || c == '\r' || c == '\t':
		return 2
	case c < 0x20 || c == '<' || c == '>' || c == '&':
		return 6
	}
	return 1
}

// Delivery outcomes.
const (
	OutcomeDelivered = "delivered" // 200 from live service (or live-bypass when counted as delivered): final
	OutcomeRejected  = "rejected"  // 400: the API will never accept it: final
	OutcomeStandby   = "standby"   // 200 from standby: accepted but not forwarded; will be replayed
	OutcomeRetry     = "retry"     // transient failure or 401: will be retried
	OutcomeBlocked   = "blocked"   // 403 edge 1010: configuration error, the reporter stopped
	// OutcomeParked: transient failures outlasted the report's retry budget;
	// the report is set aside (topic <prefix>.parked) and retried on a slow
	// schedule of its own. Not final, not delivered: it settles the
	// partition's commit point only. The record carries the last answer
	// (http_status, retry_reason, message) and the attempts so far.
	OutcomeParked = "parked"
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
	// InDoubt: an earlier post of this report may have reached the partner
	// without its answer being recorded (the reporter crashed or abandoned
	// it while in flight); the audit counts a delivered report in doubt as
	// possibly delivered twice.
	InDoubt bool `json:"in_doubt,omitempty"`
	// DoubtCause is set on the record of an attempt whose own fate at the
	// partner is unknown — its request may have left the process and no
	// complete, well-formed answer of the API came back — and on the first
	// record after an attempt that left no record of its own (the reporter
	// crashed or abandoned it in flight). One of the Doubt* values. Each
	// record with a cause is one copy the partner may hold beyond the
	// recorded deliveries: the audit counts them (docs/audit.md). Empty in
	// records written before it existed.
	DoubtCause string `json:"doubt_cause,omitempty"`
	// ReplayID is set on the answers of an operator's re-delivery
	// (`playpipe replay` or `playpipe redrive`): the id of that run. The
	// audit lists such deliveries per replay and never counts them as a
	// report delivered more than once. Empty for the live reporter.
	ReplayID string `json:"replay_id,omitempty"`
	// ReplayReason is the operator's --reason of the replay (with ReplayID).
	ReplayReason string `json:"replay_reason,omitempty"`
	At           int64  `json:"at"` // epoch ms of the answer
}

// The causes of Delivery.DoubtCause: why a post's fate at the partner is
// unknown.
const (
	// DoubtTimeout: the request was sent and no answer came within the
	// attempt's timeout.
	DoubtTimeout = "timeout"
	// DoubtConnectionLost: the request was sent and the connection failed
	// (reset, closed) before an answer came.
	DoubtConnectionLost = "connection_lost"
	// DoubtMalformedAnswer: an answer came but was not a complete,
	// well-formed answer of the API (cut or oversized body, malformed
	// header, a 200 without the API's body).
	DoubtMalformedAnswer = "malformed_answer"
	// DoubtEdgeAnswer: a non-2xx answer that is not the API's own envelope
	// (an edge's or proxy's error page): the API may or may not have seen
	// the report.
	DoubtEdgeAnswer = "edge_answer"
	// DoubtCancelled: the post was cancelled (shutdown, partition revoked)
	// after its request may have left; it has no record of its own, so the
	// next post of the report carries the cause.
	DoubtCancelled = "cancelled"
	// DoubtCrash: a previous owner of the report's partition may have
	// posted it without recording the answer (it crashed or lost the
	// partition mid-post); carried by the first post after recovery.
	DoubtCrash = "crash"
	// DoubtUnrecorded: an answer came back but Kafka failed its Delivery
	// record (a parked report's slow retry): the partner may hold the
	// report; carried by the report's next post.
	DoubtUnrecorded = "unrecorded"
)
