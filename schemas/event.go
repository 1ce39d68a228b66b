package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// EventVersion is the version of the player event schema this package reads.
const EventVersion = 1

// PlayerEvent is a player event v1: playback that ran from OffsetMS in the mix
// for DurationMS without a seek or pause. Optional fields are pointers so that
// a present false or 0 is told apart from an absent field: a present one is
// passed on to the report, an absent one is omitted.
type PlayerEvent struct {
	EventID      string `json:"event_id"`
	MixID        int64  `json:"mix_id"`
	StartedAt    int64  `json:"started_at"` // epoch ms
	OffsetMS     int64  `json:"offset_ms"`
	DurationMS   int64  `json:"duration_ms"`
	UserID       string `json:"user_id,omitempty"`
	Country      string `json:"country"`
	OS           string `json:"os"`
	Device       string `json:"device"`
	Vendor       *int64 `json:"vendor,omitempty"`
	SourceStream string `json:"source_stream,omitempty"`
	Cached       *bool  `json:"cached,omitempty"`
	JumpForward  *bool  `json:"jump_forward,omitempty"`
	EndReason    *int64 `json:"end_reason,omitempty"`
}

// Machine-readable reasons of a Violation (and of a Rejection).
const (
	ReasonMalformedJSON  = "malformed_json"  // the bytes are not one JSON object
	ReasonMissingField   = "missing_field"   // a required field is absent or null
	ReasonWrongType      = "wrong_type"      // a field has the wrong JSON type (e.g. "12" or 1.5 for an integer)
	ReasonBadEventID     = "bad_event_id"    // event_id empty or longer than 128 bytes
	ReasonBadCountry     = "bad_country"     // country is not two ASCII letters
	ReasonNegativeOffset = "negative_offset" // offset_ms < 0
	ReasonBadDuration    = "bad_duration"    // duration_ms ≤ 0
	ReasonBadStartedAt   = "bad_started_at"  // started_at ≤ 0 (not an epoch-ms instant)
	ReasonEmptyField     = "empty_field"     // a required string is empty
	ReasonMissingUserID  = "missing_user_id" // user_id absent or empty (quarantined by default)
	ReasonUnknownMix     = "unknown_mix"     // the partner API answered 404 for mix_id
	// ReasonOffsetBeyondMix is no longer a rejection: by the split rule (docs/design.md)
	// such a segment is a valid event with zero plays (docs/consumer.md).
	// Kept so that ledgers holding older rejections can name it.
	ReasonOffsetBeyondMix = "offset_beyond_mix"
	ReasonTooLarge        = "too_large"         // the event is longer than the deployment's maximum event size
	ReasonDuplicateKey    = "duplicate_key"     // a key appears more than once in the event object
	ReasonKeyCase         = "key_case_mismatch" // a key equals a field name but for case (e.g. "EVENT_ID"): keys are case-sensitive
	ReasonMixUnavailable  = "mix_unavailable"   // the partner API kept answering 400 or an undecodable body for mix_id
	ReasonProduceFailed   = "produce_failed"    // Kafka kept refusing what the event yields (e.g. MESSAGE_TOO_LARGE)
)

// Violation is one broken rule of an event.
type Violation struct {
	Field  string `json:"field,omitempty"`
	Reason string `json:"reason"`
	Detail string `json:"detail,omitempty"`
}

func (v Violation) String() string {
	if v.Field == "" {
		return v.Reason + ": " + v.Detail
	}
	return v.Reason + " (" + v.Field + "): " + v.Detail
}

// ValidateOptions are the deployment's event policies.
type ValidateOptions struct {
	// AllowMissingUserID lets events without user_id through (they are flagged
	// in the ledger); by default they are quarantined as missing_user_id.
	AllowMissingUserID bool
	// DefaultVendor, when set, is used for events without vendor; when nil a
	// missing vendor is a missing_field violation.
	DefaultVendor *int64
	// Window is the plausible-time window around ArrivalMS (zero fields:
	// 30 days back, 1 day ahead); see TimeWindow.
	Window TimeWindow
	// ArrivalMS is when the event arrived, epoch ms: the consumer sets its
	// record's timestamp, the Publisher (and so the ingest gateway) the
	// time of the Publish call. When > 0, an event whose started_at or
	// segment end lies outside Window around it is rejected
	// implausible_time; when 0 only the overflow of the derived times is
	// (a library caller that knows no arrival).
	ArrivalMS int64
}

// MaxEventIDLen is the longest accepted event_id, in bytes.
const MaxEventIDLen = 128

// rawEvent decodes with presence tracking: every field is a pointer.
type rawEvent struct {
	EventID      *string `json:"event_id"`
	MixID        *int64  `json:"mix_id"`
	StartedAt    *int64  `json:"started_at"`
	OffsetMS     *int64  `json:"offset_ms"`
	DurationMS   *int64  `json:"duration_ms"`
	UserID       *string `json:"user_id"`
	Country      *string `json:"country"`
	OS           *string `json:"os"`
	Device       *string `json:"device"`
	Vendor       *int64  `json:"vendor"`
	SourceStream *string `json:"source_stream"`
	Cached       *bool   `json:"cached"`
	JumpForward  *bool   `json:"jump_forward"`
	EndReason    *int64  `json:"end_reason"`
}

// fieldKinds lists the known fields with their JSON kind, in schema order.
var fieldKinds = []struct {
	name     string
	kind     byte // 's' string, 'i' integer, 'b' boolean
	required bool
}{
	{"event_id", 's', true}, {"mix_id", 'i', true}, {"started_at", 'i', true},
	{"offset_ms", 'i', true}, {"duration_ms", 'i', true}, {"user_id", 's', false},
	{"country", 's', true}, {"os", 's', true}, {"device", 's', true},
	{"vendor", 'i', false}, {"source_stream", 's', false}, {"cached", 'b', false},
	{"jump_forward", 'b', false}, {"end_reason", 'i', false},
}

// ParseEvent decodes and validates raw event bytes. It returns the event and
// nil when every rule holds, or every broken rule: duplicate keys and keys
// that equal a field name but for case first (in document order), then the
// fields' rules in schema field order. Keys are case-sensitive and unique
// (the JSON Schema's reading: "EVENT_ID" is not event_id); unknown fields
// are otherwise ignored. A missing source_stream becomes "mix", and a
// missing vendor the configured default.
func ParseEvent(raw []byte, opts ValidateOptions) (PlayerEvent, []Violation) {
	// JSON must be UTF-8 (encoding/json would silently replace bad bytes,
	// mangling the event_id), and an event is one object (json.Unmarshal
	// accepts a bare null as an empty struct).
	if !utf8.Valid(raw) || !looksLikeObject(raw) {
		return PlayerEvent{}, []Violation{{Reason: ReasonMalformedJSON, Detail: malformedDetail(raw, nil)}}
	}
	// The common case, a well-formed event object, takes a reflection-free
	// single pass (fastevent.go); anything it is not sure about is decided by
	// encoding/json, with the same results either way.
	var r rawEvent
	if fastDecodeEvent(raw, &r) {
		return validate(&r, opts, nil)
	}
	return parseEventJSON(raw, opts)
}

// parseEventJSON decodes and validates raw, known to be UTF-8 and to start
// like an object, with encoding/json, strictly: keys are matched exactly
// (encoding/json alone would match "EVENT_ID" to event_id) and each key may
// appear once (encoding/json alone keeps the last of duplicates). A
// duplicate key and a key that equals a field name but for case are
// violations of their own (listed first, in document order); the rest of
// the event is then validated with the first value of each key and the
// case variants treated as unknown fields, as the JSON Schema reads them.
func parseEventJSON(raw []byte, opts ValidateOptions) (PlayerEvent, []Violation) {
	members, err := topLevelMembers(raw)
	if err != nil {
		return PlayerEvent{}, []Violation{{Reason: ReasonMalformedJSON, Detail: malformedDetail(raw, err)}}
	}
	var vs []Violation
	known := make(map[string]json.RawMessage, len(fieldKinds))
	seen := make(map[string]int, len(members))
	for _, m := range members {
		seen[m.key]++
		switch n := seen[m.key]; {
		case n == 2:
			vs = append(vs, Violation{Field: truncate(m.key, 40), Reason: ReasonDuplicateKey,
				Detail: fmt.Sprintf("key %q appears more than once; each key may appear once (the first value is validated)", truncate(m.key, 40))})
			continue
		case n > 2:
			continue
		}
		if _, ok := knownField(m.key); ok {
			known[m.key] = m.val
		} else if f := foldedField(m.key); f != "" {
			vs = append(vs, Violation{Field: truncate(m.key, 40), Reason: ReasonKeyCase,
				Detail: fmt.Sprintf("key %q differs from the field %q only in case; keys are case-sensitive", truncate(m.key, 40), f)})
		}
	}
	// Wrong JSON types, in schema order; those fields then count as absent.
	for _, f := range fieldKinds {
		v, ok := known[f.name]
		if !ok || isNull(v) {
			continue
		}
		if !kindMatches(v, f.kind) {
			vs = append(vs, Violation{Field: f.name, Reason: ReasonWrongType, Detail: f.name + " must be " + kindName(f.kind) + ", got " + truncate(string(v), 24)})
			delete(known, f.name)
		}
	}
	var r rawEvent
	for name, v := range known {
		if err := json.Unmarshal(v, r.field(name)); err != nil { // cannot happen: kinds checked above
			return PlayerEvent{}, append(vs, Violation{Field: name, Reason: ReasonWrongType, Detail: err.Error()})
		}
	}
	return validate(&r, opts, vs)
}

// member is one key of an event object with its raw value.
type member struct {
	key string
	val json.RawMessage
}

// topLevelMembers splits a JSON object into its members in document order,
// keys unescaped, duplicates kept; an error when raw is not exactly one
// valid JSON object.
func topLevelMembers(raw []byte) ([]member, error) {
	if !json.Valid(raw) {
		var v any
		err := json.Unmarshal(raw, &v)
		if err == nil {
			err = errors.New("invalid JSON")
		}
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("event must be one JSON object")
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		out = append(out, member{key: key, val: v})
	}
	return out, nil
}

// knownField returns the index in fieldKinds of the field spelled exactly key.
func knownField(key string) (int, bool) {
	for i, f := range fieldKinds {
		if f.name == key {
			return i, true
		}
	}
	return 0, false
}

// foldedField returns the field name key equals under Unicode case folding
// (as encoding/json would match it), or "" when none.
func foldedField(key string) string {
	for _, f := range fieldKinds {
		if strings.EqualFold(f.name, key) {
			return f.name
		}
	}
	return ""
}

// field returns a pointer to the rawEvent field of a known name.
func (r *rawEvent) field(name string) any {
	switch name {
	case "event_id":
		return &r.EventID
	case "mix_id":
		return &r.MixID
	case "started_at":
		return &r.StartedAt
	case "offset_ms":
		return &r.OffsetMS
	case "duration_ms":
		return &r.DurationMS
	case "user_id":
		return &r.UserID
	case "country":
		return &r.Country
	case "os":
		return &r.OS
	case "device":
		return &r.Device
	case "vendor":
		return &r.Vendor
	case "source_stream":
		return &r.SourceStream
	case "cached":
		return &r.Cached
	case "jump_forward":
		return &r.JumpForward
	case "end_reason":
		return &r.EndReason
	}
	panic("schemas: no field " + name)
}

// eventCheck collects the violations of one event while validate reads its
// fields in schema order.
type eventCheck struct{ vs []Violation }

func (c *eventCheck) add(field, reason, detail string) {
	c.vs = append(c.vs, Violation{Field: field, Reason: reason, Detail: detail})
}

// missing reports a required field that is absent (or null), unless it was
// already reported as wrong_type.
func (c *eventCheck) missing(field string) {
	if !hasField(c.vs, field) {
		c.add(field, ReasonMissingField, field+" is required")
	}
}

// validate checks the decoded fields of r in schema order, after the
// violations vs found while decoding, and returns the event when none is
// broken.
func validate(r *rawEvent, opts ValidateOptions, vs []Violation) (PlayerEvent, []Violation) {
	c := eventCheck{vs: vs}
	var ev PlayerEvent
	c.ids(r, &ev)
	c.segment(r, &ev)
	c.checkTimes(r, opts)
	c.listener(r, opts, &ev)
	ev.SourceStream = "mix"
	if r.SourceStream != nil && *r.SourceStream != "" {
		ev.SourceStream = *r.SourceStream
	}
	ev.Cached, ev.JumpForward, ev.EndReason = r.Cached, r.JumpForward, r.EndReason
	if len(c.vs) > 0 {
		return PlayerEvent{}, c.vs
	}
	return ev, nil
}

// ids checks event_id and mix_id.
func (c *eventCheck) ids(r *rawEvent, ev *PlayerEvent) {
	if r.EventID == nil {
		c.missing("event_id")
	} else if n := len(*r.EventID); n == 0 || n > MaxEventIDLen {
		c.add("event_id", ReasonBadEventID, "event_id must be 1–128 bytes, got "+strconv.Itoa(n))
	} else {
		ev.EventID = *r.EventID
	}
	if r.MixID == nil {
		c.missing("mix_id")
	} else {
		ev.MixID = *r.MixID
	}
}

// segment checks started_at, offset_ms and duration_ms.
func (c *eventCheck) segment(r *rawEvent, ev *PlayerEvent) {
	if r.StartedAt == nil {
		c.missing("started_at")
	} else if *r.StartedAt <= 0 {
		c.add("started_at", ReasonBadStartedAt, "started_at must be epoch milliseconds > 0")
	} else {
		ev.StartedAt = *r.StartedAt
	}
	if r.OffsetMS == nil {
		c.missing("offset_ms")
	} else if *r.OffsetMS < 0 {
		c.add("offset_ms", ReasonNegativeOffset, "offset_ms must be ≥ 0, got "+strconv.FormatInt(*r.OffsetMS, 10))
	} else {
		ev.OffsetMS = *r.OffsetMS
	}
	if r.DurationMS == nil {
		c.missing("duration_ms")
	} else if *r.DurationMS <= 0 {
		c.add("duration_ms", ReasonBadDuration, "duration_ms must be > 0, got "+strconv.FormatInt(*r.DurationMS, 10))
	} else {
		ev.DurationMS = *r.DurationMS
	}
}

// listener checks user_id (by the deployment's policy), country, os, device
// and vendor (or takes the deployment's default vendor).
func (c *eventCheck) listener(r *rawEvent, opts ValidateOptions, ev *PlayerEvent) {
	if r.UserID == nil || *r.UserID == "" {
		if !opts.AllowMissingUserID && !hasField(c.vs, "user_id") {
			c.add("user_id", ReasonMissingUserID, "user_id is required by the deployment's policy (reports without it corrupt royalty accounting)")
		}
	} else {
		ev.UserID = *r.UserID
	}
	if r.Country == nil {
		c.missing("country")
	} else if !isCountry(*r.Country) {
		c.add("country", ReasonBadCountry, fmt.Sprintf("country must be two ASCII letters (ISO 3166-1 alpha-2), got %q", truncate(*r.Country, 16)))
	} else {
		ev.Country = upperASCII(*r.Country)
	}
	c.requiredString("os", r.OS, &ev.OS)
	c.requiredString("device", r.Device, &ev.Device)
	switch {
	case r.Vendor != nil:
		v := *r.Vendor
		ev.Vendor = &v
	case opts.DefaultVendor != nil:
		v := *opts.DefaultVendor
		ev.Vendor = &v
	default:
		c.missing("vendor")
	}
}

// requiredString checks a required string field that must not be empty and
// stores it in dst.
func (c *eventCheck) requiredString(field string, p *string, dst *string) {
	switch {
	case p == nil:
		c.missing(field)
	case *p == "":
		c.add(field, ReasonEmptyField, field+" must not be empty")
	default:
		*dst = *p
	}
}

func kindMatches(v json.RawMessage, kind byte) bool {
	switch kind {
	case 's':
		var s string
		return json.Unmarshal(v, &s) == nil
	case 'b':
		var b bool
		return json.Unmarshal(v, &b) == nil
	default:
		var n int64
		return json.Unmarshal(v, &n) == nil
	}
}

func kindName(kind byte) string {
	switch kind {
	case 's':
		return "a string"
	case 'b':
		return "a boolean"
	default:
		return "an integer (64-bit, no fraction, not quoted)"
	}
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

func hasField(vs []Violation, field string) bool {
	for _, v := range vs {
		if v.Field == field {
			return true
		}
	}
	return false
}

func isCountry(s string) bool {
	if len(s) != 2 {
		return false
	}
	for i := 0; i < 2; i++ {
		c := s[i] | 0x20
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

func upperASCII(s string) string {
	if s[0] >= 'a' || s[1] >= 'a' {
		return string([]byte{s[0] &^ 0x20, s[1] &^ 0x20})
	}
	return s
}

func looksLikeObject(raw []byte) bool {
	t := bytes.TrimSpace(raw)
	return len(t) > 0 && t[0] == '{'
}

func malformedDetail(raw []byte, err error) string {
	if !utf8.Valid(raw) {
		return "event is not valid UTF-8 JSON"
	}
	if !looksLikeObject(raw) {
		return "event must be one JSON object"
	}
	return "event is not valid JSON: " + err.Error()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
