package analytics

import (
	"encoding/json"

	"github.com/playpipe/playpipe/internal/jsonscan"
	"github.com/playpipe/playpipe/schemas"
)

// Targeted decoders of the four record types: one pass over the record's
// bytes, no reflection, strings sliced out of the record's string (which the
// row keeps anyway as raw/record) instead of copied. The scanning is
// internal/jsonscan's; the record shapes are here.
//
// The contract, checked by TestFastDecodeMatchesEncodingJSON and
// FuzzFastDecode: a fast decoder either returns true and leaves exactly the
// value json.Unmarshal would (with no error), or returns false and the caller
// decodes the record with encoding/json as before. It returns false for
// anything outside the plain case: bytes that are not one valid JSON object,
// a value of the wrong type (a number that is not an integer of the field's
// size, a string for a number…), a duplicated known key, a key with escapes
// or non-ASCII bytes, an unknown key equal to a known one but for case
// (encoding/json matches keys case-insensitively), nesting deeper than
// jsonscan.MaxDepth. Strings with escapes or invalid UTF-8 are decoded by
// encoding/json (token by token), so their bytes are exactly its own.

// parser is the shared scanner over a record's string, with the decoders of
// this package's record shapes.
type parser struct {
	jsonscan.Scanner[string]
}

// str decodes a string value into dst (null leaves it): a plain string is
// sliced out of the record, one with escapes or invalid UTF-8 is unquoted by
// encoding/json, exactly.
func (p *parser) str(dst *string) {
	if p.Null() || p.Bad() {
		return
	}
	tok, plain := p.StrToken()
	if p.Bad() {
		return
	}
	if plain {
		*dst = tok[1 : len(tok)-1]
		return
	}
	if err := json.Unmarshal([]byte(tok), dst); err != nil {
		p.Fail()
	}
}

// strList decodes an array of strings (null: nil; [] an empty slice, as
// encoding/json does); a null element falls back.
func (p *parser) strList(dst *[]string) {
	if p.Bad() {
		return
	}
	if p.Null() {
		*dst = nil
		return
	}
	out := []string{}
	if !p.Open('[') {
		return
	}
	for first := true; p.More(']', &first); {
		if p.Peek() == 'n' {
			p.Fail()
			return
		}
		var s string
		p.str(&s)
		out = append(out, s)
	}
	*dst = out
}

var eventKeys = []string{"event_id", "mix_id", "started_at", "offset_ms", "duration_ms", "user_id", "country"}

// fastEvent decodes the ledger's fields of a player event.
func fastEvent(s string, f *eventFields) bool {
	p := parser{jsonscan.New(s)}
	var seen uint32
	if !p.Open('{') {
		return false
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); k {
		case "event_id":
			if p.Once(&seen, 1) {
				p.str(&f.EventID)
			}
		case "mix_id":
			if p.Once(&seen, 2) {
				p.Int64(&f.MixID)
			}
		case "started_at":
			if p.Once(&seen, 4) {
				p.Int64(&f.StartedAt)
			}
		case "offset_ms":
			if p.Once(&seen, 8) {
				p.Int64(&f.OffsetMS)
			}
		case "duration_ms":
			if p.Once(&seen, 16) {
				p.Int64(&f.DurationMS)
			}
		case "user_id":
			if p.Once(&seen, 32) {
				p.str(&f.UserID)
			}
		case "country":
			if p.Once(&seen, 64) {
				p.str(&f.Country)
			}
		default:
			p.Unknown(k, eventKeys...)
		}
	}
	return p.End()
}

var (
	playKeys   = []string{"v", "report_id", "event_id", "mix_id", "position", "overlap_ms", "below_minimum", "no_user_id", "standby_listing", "derived_at", "report"}
	reportKeys = []string{"trackid", "playedat", "playlength", "country", "userid", "isrc"}
)

// fastPlay decodes the ledger's fields of a track play.
func fastPlay(s string, r *playRecord) bool {
	p := parser{jsonscan.New(s)}
	var seen uint32
	if !p.Open('{') {
		return false
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); k {
		case "v":
			if p.Once(&seen, 1<<0) {
				p.Int(&r.V)
			}
		case "report_id":
			if p.Once(&seen, 1<<1) {
				p.str(&r.ReportID)
			}
		case "event_id":
			if p.Once(&seen, 1<<2) {
				p.str(&r.EventID)
			}
		case "mix_id":
			if p.Once(&seen, 1<<3) {
				p.Int64(&r.MixID)
			}
		case "position":
			if p.Once(&seen, 1<<4) {
				p.Int(&r.Position)
			}
		case "overlap_ms":
			if p.Once(&seen, 1<<5) {
				p.Int64(&r.OverlapMS)
			}
		case "below_minimum":
			if p.Once(&seen, 1<<6) {
				p.Bool(&r.BelowMinimum)
			}
		case "no_user_id":
			if p.Once(&seen, 1<<7) {
				p.Bool(&r.NoUserID)
			}
		case "standby_listing":
			if p.Once(&seen, 1<<8) {
				p.Bool(&r.StandbyListing)
			}
		case "derived_at":
			if p.Once(&seen, 1<<9) {
				p.Int64(&r.DerivedAt)
			}
		case "report":
			if p.Once(&seen, 1<<10) && !p.Null() {
				p.playReport(r)
			}
		default:
			p.Unknown(k, playKeys...)
		}
	}
	return p.End()
}

func (p *parser) playReport(r *playRecord) {
	var seen uint32
	if !p.Open('{') {
		return
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); k {
		case "trackid":
			if p.Once(&seen, 1<<0) {
				p.Int64(&r.Report.TrackID)
			}
		case "playedat":
			if p.Once(&seen, 1<<1) {
				p.Int64(&r.Report.PlayedAt)
			}
		case "playlength":
			if p.Once(&seen, 1<<2) {
				p.Int64(&r.Report.PlayLength)
			}
		case "country":
			if p.Once(&seen, 1<<3) {
				p.str(&r.Report.Country)
			}
		case "userid":
			if p.Once(&seen, 1<<4) {
				p.str(&r.Report.UserID)
			}
		case "isrc":
			if p.Once(&seen, 1<<5) {
				p.str(&r.Report.ISRC)
			}
		default:
			p.Unknown(k, reportKeys...)
		}
	}
}

var deliveryKeys = []string{"v", "report_id", "event_id", "outcome", "attempt", "http_status", "served_by", "partner", "message", "fields", "retry_reason", "latency_us", "trace_id", "replay", "in_doubt", "replay_id", "replay_reason", "at"}

// fastDelivery decodes a delivery record.
func fastDelivery(s string, d *schemas.Delivery) bool {
	p := parser{jsonscan.New(s)}
	var seen uint32
	if !p.Open('{') {
		return false
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); k {
		case "v":
			if p.Once(&seen, 1<<0) {
				p.Int(&d.V)
			}
		case "report_id":
			if p.Once(&seen, 1<<1) {
				p.str(&d.ReportID)
			}
		case "event_id":
			if p.Once(&seen, 1<<2) {
				p.str(&d.EventID)
			}
		case "outcome":
			if p.Once(&seen, 1<<3) {
				p.str(&d.Outcome)
			}
		case "attempt":
			if p.Once(&seen, 1<<4) {
				p.Int(&d.Attempt)
			}
		case "http_status":
			if p.Once(&seen, 1<<5) {
				p.Int(&d.HTTPStatus)
			}
		case "served_by":
			if p.Once(&seen, 1<<6) {
				p.str(&d.ServedBy)
			}
		case "message":
			if p.Once(&seen, 1<<7) {
				p.str(&d.Message)
			}
		case "fields":
			if p.Once(&seen, 1<<8) {
				p.strList(&d.Fields)
			}
		case "retry_reason":
			if p.Once(&seen, 1<<9) {
				p.str(&d.Reason)
			}
		case "latency_us":
			if p.Once(&seen, 1<<10) {
				p.Int64(&d.LatencyUS)
			}
		case "trace_id":
			if p.Once(&seen, 1<<11) {
				p.str(&d.TraceID)
			}
		case "replay":
			if p.Once(&seen, 1<<12) {
				p.Bool(&d.Replay)
			}
		case "at":
			if p.Once(&seen, 1<<13) {
				p.Int64(&d.At)
			}
		case "partner":
			if p.Once(&seen, 1<<14) {
				p.str(&d.Partner)
			}
		case "in_doubt":
			if p.Once(&seen, 1<<15) {
				p.Bool(&d.InDoubt)
			}
		case "replay_id":
			if p.Once(&seen, 1<<16) {
				p.str(&d.ReplayID)
			}
		case "replay_reason":
			if p.Once(&seen, 1<<17) {
				p.str(&d.ReplayReason)
			}
		default:
			p.Unknown(k, deliveryKeys...)
		}
	}
	return p.End()
}

var (
	rejectionKeys = []string{"v", "event_id", "reason", "violations", "raw", "raw_base64", "raw_len", "raw_sha256", "raw_truncated", "source", "at"}
	violationKeys = []string{"field", "reason", "detail"}
	sourceKeys    = []string{"topic", "partition", "offset"}
)

// fastRejection decodes a rejection record.
func fastRejection(s string, j *schemas.Rejection) bool {
	p := parser{jsonscan.New(s)}
	var seen uint32
	if !p.Open('{') {
		return false
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); k {
		case "v":
			if p.Once(&seen, 1<<0) {
				p.Int(&j.V)
			}
		case "event_id":
			if p.Once(&seen, 1<<1) {
				p.str(&j.EventID)
			}
		case "reason":
			if p.Once(&seen, 1<<2) {
				p.str(&j.Reason)
			}
		case "violations":
			if p.Once(&seen, 1<<3) {
				p.violations(&j.Violations)
			}
		case "raw":
			if p.Once(&seen, 1<<4) {
				p.str(&j.Raw)
			}
		case "raw_base64":
			if p.Once(&seen, 1<<5) {
				p.Bool(&j.RawBase64)
			}
		case "source":
			if p.Once(&seen, 1<<6) && !p.Null() {
				p.source(&j.Source)
			}
		case "at":
			if p.Once(&seen, 1<<7) {
				p.Int64(&j.At)
			}
		case "raw_len":
			if p.Once(&seen, 1<<8) {
				p.Int(&j.RawLen)
			}
		case "raw_sha256":
			if p.Once(&seen, 1<<9) {
				p.str(&j.RawSHA256)
			}
		case "raw_truncated":
			if p.Once(&seen, 1<<10) {
				p.Bool(&j.RawTruncated)
			}
		default:
			p.Unknown(k, rejectionKeys...)
		}
	}
	return p.End()
}

func (p *parser) violations(dst *[]schemas.Violation) {
	if p.Bad() {
		return
	}
	if p.Null() {
		*dst = nil
		return
	}
	out := []schemas.Violation{}
	if !p.Open('[') {
		return
	}
	for first := true; p.More(']', &first); {
		var v schemas.Violation
		var seen uint32
		if !p.Open('{') { // a null element (or anything else) falls back
			return
		}
		for first := true; p.More('}', &first); {
			switch k := p.Key(); k {
			case "field":
				if p.Once(&seen, 1) {
					p.str(&v.Field)
				}
			case "reason":
				if p.Once(&seen, 2) {
					p.str(&v.Reason)
				}
			case "detail":
				if p.Once(&seen, 4) {
					p.str(&v.Detail)
				}
			default:
				p.Unknown(k, violationKeys...)
			}
		}
		out = append(out, v)
	}
	*dst = out
}

func (p *parser) source(dst *schemas.Source) {
	var seen uint32
	if !p.Open('{') {
		return
	}
	for first := true; p.More('}', &first); {
		switch k := p.Key(); k {
		case "topic":
			if p.Once(&seen, 1) {
				p.str(&dst.Topic)
			}
		case "partition":
			if p.Once(&seen, 2) {
				p.Int32(&dst.Partition)
			}
		case "offset":
			if p.Once(&seen, 4) {
				p.Int64(&dst.Offset)
			}
		default:
			p.Unknown(k, sourceKeys...)
		}
	}
}
