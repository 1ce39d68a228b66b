package schemas

import (
	"bytes"
	"encoding/json"
)

// The record decoders: one per record type, used by every stage that reads
// the records (the reporter, the ClickHouse sink, replay, the tools).
//
// The contract, checked by TestDecodersMatchEncodingJSON and
// FuzzDecodeRecords: a decoder gives exactly what json.Unmarshal gives into
// a zero value — the same value, and an error exactly when json.Unmarshal
// fails, that error being encoding/json's own (so a lenient reader may
// tolerate a *json.UnmarshalTypeError, whose fields are decoded as
// json.Unmarshal leaves them). The destination is zeroed first.
//
// The plain case, which is every record playpipe writes, is decoded in one
// pass by the package's JSON scanner (jsonscan.go), without reflection.
// Anything else goes to encoding/json: bytes that are not one valid JSON
// object, a value of the wrong type (a number that is not an integer of the
// field's size, a string for a number…), a duplicated known key, a key with
// escapes or non-ASCII bytes, a key equal to a known one but for case
// (encoding/json matches keys case-insensitively), nesting deeper than
// maxJSONDepth, a null in a list of strings or of violations.
//
// Zero-copy form: over a string input, the decoded string fields are
// substrings of the input (no copies) whenever the fast path takes the
// record (a string with escapes is decoded into memory of its own). A
// caller that builds its string from a buffer without copying it (the sink's
// unsafe.String over a fetched record) must leave the buffer unmodified for
// as long as it uses the decoded value. Over a []byte input, the decoded
// strings are copies.

var (
	trackPlayKeys = []string{"v", "report_id", "event_id", "mix_id", "position", "overlap_ms", "below_minimum",
		"no_user_id", "standby_listing", "derived_at", "event_at", "report"}
	reportKeys = []string{"trackid", "playedat", "playlength", "sourcestream", "sourcedetail", "os", "device",
		"country", "vendor", "userid", "isrc", "endreason", "cachedplay", "jumpforward"}
	deliveryKeys = []string{"v", "report_id", "event_id", "outcome", "attempt", "http_status", "served_by", "partner",
		"message", "fields", "retry_reason", "latency_us", "trace_id", "replay", "in_doubt", "doubt_cause", "replay_id", "replay_reason", "at"}
	rejectionKeys = []string{"v", "event_id", "reason", "violations", "raw", "raw_base64", "raw_len", "raw_sha256",
		"raw_truncated", "source", "at"}
	violationKeys = []string{"field", "reason", "detail"}
	sourceKeys    = []string{"topic", "partition", "offset"}
	eventKeys     = []string{"event_id", "mix_id", "started_at", "offset_ms", "duration_ms", "user_id", "country", "os",
		"device", "vendor", "source_stream", "cached", "jump_forward", "end_reason"}
	headKeys = []string{"report_id", "event_id", "below_minimum", "report"}
)

// unmarshal is the fallback of every decoder: encoding/json into v.
func unmarshal[S string | []byte](s S, v any) error {
	return json.Unmarshal([]byte(s), v)
}

// DecodeTrackPlay decodes the TrackPlay record s into tp (see the contract
// above: exactly json.Unmarshal, one pass in the plain case, zero-copy over
// a string).
func DecodeTrackPlay[S string | []byte](s S, tp *TrackPlay) error {
	if fastTrackPlay(s, tp) {
		return nil
	}
	*tp = TrackPlay{}
	return unmarshal(s, tp)
}

// fastTrackPlay is the one-pass decoder of DecodeTrackPlay: true when it took
// s, false (with *tp in any state) when encoding/json must decide.
func fastTrackPlay[S string | []byte](s S, tp *TrackPlay) bool {
	*tp = TrackPlay{}
	p, seen := newJSONScanner(s), uint32(0)
	for first := p.Open('{'); p.More('}', &first); {
		trackPlayMember(&p, p.Key(), tp, &seen)
	}
	return p.End()
}

func trackPlayMember[S string | []byte](p *jsonScanner[S], k S, tp *TrackPlay, seen *uint32) {
	switch string(k) {
	case "v":
		if p.Once(seen, 1<<0) {
			p.Int(&tp.V)
		}
	case "report_id":
		if p.Once(seen, 1<<1) {
			p.Str(&tp.ReportID)
		}
	case "event_id":
		if p.Once(seen, 1<<2) {
			p.Str(&tp.EventID)
		}
	case "mix_id":
		if p.Once(seen, 1<<3) {
			p.Int64(&tp.MixID)
		}
	case "position":
		if p.Once(seen, 1<<4) {
			p.Int(&tp.Position)
		}
	case "overlap_ms":
		if p.Once(seen, 1<<5) {
			p.Int64(&tp.OverlapMS)
		}
	case "below_minimum":
		if p.Once(seen, 1<<6) {
			p.Bool(&tp.BelowMinimum)
		}
	case "no_user_id":
		if p.Once(seen, 1<<7) {
			p.Bool(&tp.NoUserID)
		}
	case "standby_listing":
		if p.Once(seen, 1<<8) {
			p.Bool(&tp.StandbyListing)
		}
	case "derived_at":
		if p.Once(seen, 1<<9) {
			p.Int64(&tp.DerivedAt)
		}
	case "event_at":
		if p.Once(seen, 1<<11) {
			p.Int64(&tp.EventAt)
		}
	case "report":
		if p.Once(seen, 1<<10) && !p.Null() {
			playReport(p, &tp.Report)
		}
	default:
		p.Unknown(k, trackPlayKeys...)
	}
}

// reportOptionals backs the optional fields of a decoded PlayReport: one
// allocation for the three pointers.
type reportOptionals struct {
	endReason           int64
	cached, jumpForward bool
}

// playReport decodes a play report object into r.
func playReport[S string | []byte](p *jsonScanner[S], r *PlayReport) {
	var (
		seen uint32
		opt  *reportOptionals
	)
	optional := func() *reportOptionals {
		if opt == nil {
			opt = new(reportOptionals)
		}
		return opt
	}
	if !p.Open('{') {
		return
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); string(k) {
		case "trackid", "playedat", "playlength", "vendor":
			if dst, bit := reportInt(r, k); p.Once(&seen, bit) {
				p.Int64(dst)
			}
		case "sourcestream", "sourcedetail", "os", "device", "country", "userid", "isrc":
			if dst, bit := reportStr(r, k); p.Once(&seen, bit) {
				p.Str(dst)
			}
		case "endreason":
			if p.Once(&seen, 1<<11) {
				r.EndReason = optInt(p, &optional().endReason)
			}
		case "cachedplay":
			if p.Once(&seen, 1<<12) {
				r.CachedPlay = optBool(p, &optional().cached)
			}
		case "jumpforward":
			if p.Once(&seen, 1<<13) {
				r.JumpForward = optBool(p, &optional().jumpForward)
			}
		default:
			p.Unknown(k, reportKeys...)
		}
	}
}

// reportInt returns the integer field of r named k (one of the four cases
// of playReport) and its duplicate-detection bit.
func reportInt[S string | []byte](r *PlayReport, k S) (*int64, uint32) {
	switch string(k) {
	case "trackid":
		return &r.TrackID, 1 << 0
	case "playedat":
		return &r.PlayedAt, 1 << 1
	case "playlength":
		return &r.PlayLength, 1 << 2
	}
	return &r.Vendor, 1 << 8
}

// reportStr returns the string field of r named k (one of the seven cases
// of playReport) and its duplicate-detection bit.
func reportStr[S string | []byte](r *PlayReport, k S) (*string, uint32) {
	switch string(k) {
	case "sourcestream":
		return &r.SourceStream, 1 << 3
	case "sourcedetail":
		return &r.SourceDetail, 1 << 4
	case "os":
		return &r.OS, 1 << 5
	case "device":
		return &r.Device, 1 << 6
	case "country":
		return &r.Country, 1 << 7
	case "userid":
		return &r.UserID, 1 << 9
	}
	return &r.ISRC, 1 << 10
}

// optInt decodes an optional integer: nil for null, else dst holding it.
func optInt[S string | []byte](p *jsonScanner[S], dst *int64) *int64 {
	if p.Null() {
		return nil
	}
	p.Int64(dst)
	return dst
}

// optBool decodes an optional boolean: nil for null, else dst holding it.
func optBool[S string | []byte](p *jsonScanner[S], dst *bool) *bool {
	if p.Null() {
		return nil
	}
	p.Bool(dst)
	return dst
}

// TrackPlayHead is the part of a TrackPlay record a forwarder reads: its
// identity, and the report body still encoded, byte for byte as the record
// carries it, so that exactly those bytes are posted (the reporter, replay).
type TrackPlayHead struct {
	ReportID     string `json:"report_id"`
	EventID      string `json:"event_id"`
	BelowMinimum bool   `json:"below_minimum"`
	// Report is the report object's JSON as it is in the record (nil when
	// absent, "null" when null), in memory of its own: a held report does
	// not pin the fetched batch the record belongs to.
	Report json.RawMessage `json:"report"`
}

// DecodeTrackPlayHead decodes the head of the TrackPlay record b into h:
// exactly json.Unmarshal(b, h) (the fields of TrackPlay other than these
// four are only checked to be valid JSON), in one pass in the plain case
// (a report that is not an object falls back). Nothing in h shares b's
// memory.
func DecodeTrackPlayHead(b []byte, h *TrackPlayHead) error {
	if fastTrackPlayHead(b, h) {
		h.Report = bytes.Clone(h.Report)
		return nil
	}
	*h = TrackPlayHead{}
	return json.Unmarshal(b, h)
}

// fastTrackPlayHead is the one-pass decoder of DecodeTrackPlayHead: true when it took
// b, false (with *h in any state) when encoding/json must decide.
func fastTrackPlayHead(b []byte, h *TrackPlayHead) bool {
	*h = TrackPlayHead{}
	p, seen := newJSONScanner(b), uint32(0)
	for first := p.Open('{'); p.More('}', &first); {
		headMember(&p, p.Key(), h, &seen)
	}
	return p.End()
}

func headMember(p *jsonScanner[[]byte], k []byte, h *TrackPlayHead, seen *uint32) {
	switch string(k) {
	case "report_id":
		if p.Once(seen, 1<<0) {
			p.Str(&h.ReportID)
		}
	case "event_id":
		if p.Once(seen, 1<<1) {
			p.Str(&h.EventID)
		}
	case "below_minimum":
		if p.Once(seen, 1<<2) {
			p.Bool(&h.BelowMinimum)
		}
	case "report":
		if !p.Once(seen, 1<<3) {
			return
		}
		if p.Peek() != '{' {
			p.Fail() // null (kept as "null" by encoding/json) or not an object
			return
		}
		start := p.Pos()
		p.Skip()
		end := p.Pos()
		h.Report = p.s[start:end:end]
	default:
		p.Unknown(k, headKeys...)
	}
}
