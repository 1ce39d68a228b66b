package analytics

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/playpipe/playpipe/schemas"
)

// Targeted decoders of the four record types: one pass over the record's
// bytes, no reflection, strings sliced out of the record's string (which the
// row keeps anyway as raw/record) instead of copied.
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
// maxFastDepth. Strings with escapes or invalid UTF-8 are decoded by
// encoding/json (token by token), so their bytes are exactly its own.

const maxFastDepth = 64

// parser is a validating JSON reader over s; bad records the first failure,
// after which every method is a no-op.
type parser struct {
	s     string
	i     int
	depth int
	bad   bool
}

func (p *parser) ws() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// peek returns the next non-space byte, or 0 at the end.
func (p *parser) peek() byte {
	p.ws()
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

// open consumes c ('{' or '[') and enters a nesting level.
func (p *parser) open(c byte) bool {
	if p.bad || p.peek() != c {
		p.bad = true
		return false
	}
	p.i++
	p.depth++
	if p.depth > maxFastDepth {
		p.bad = true
		return false
	}
	return true
}

// more reports whether the container opened with open has another member,
// consuming the separator or the closing byte.
func (p *parser) more(closing byte, first *bool) bool {
	if p.bad {
		return false
	}
	c := p.peek()
	if c == closing {
		p.i++
		p.depth--
		return false
	}
	if *first {
		*first = false
		return true
	}
	if c != ',' {
		p.bad = true
		return false
	}
	p.i++
	return true
}

// key reads a member's key and its colon. Keys with escapes or non-ASCII
// bytes make the record fall back.
func (p *parser) key() string {
	if p.bad || p.peek() != '"' {
		p.bad = true
		return ""
	}
	start := p.i + 1
	for j := start; j < len(p.s); j++ {
		c := p.s[j]
		if c == '"' {
			k := p.s[start:j]
			p.i = j + 1
			if p.peek() != ':' {
				p.bad = true
				return ""
			}
			p.i++
			return k
		}
		if c < 0x20 || c == '\\' || c >= utf8.RuneSelf {
			break
		}
	}
	p.bad = true
	return ""
}

// once marks a known key as seen; a second occurrence falls back.
func (p *parser) once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		p.bad = true
	}
	*seen |= bit
	return !p.bad
}

// unknown skips the value of a key no field takes; a key that equals a
// field's name but for case falls back (encoding/json would take it).
func (p *parser) unknown(k string, names ...string) {
	for _, n := range names {
		if strings.EqualFold(k, n) {
			p.bad = true
			return
		}
	}
	p.skip()
}

// null consumes a null literal if one comes next (a null leaves a scalar
// field as it is).
func (p *parser) null() bool {
	if p.bad || p.peek() != 'n' {
		return false
	}
	if !strings.HasPrefix(p.s[p.i:], "null") {
		p.bad = true
		return false
	}
	p.i += 4
	return true
}

// strToken scans a string and returns its token (quotes included) and
// whether it is plain (no escapes, valid UTF-8: its content is the value).
func (p *parser) strToken() (tok string, plain bool) {
	if p.bad || p.peek() != '"' {
		p.bad = true
		return "", false
	}
	start := p.i
	ascii, esc := true, false
	for j := start + 1; j < len(p.s); j++ {
		c := p.s[j]
		switch {
		case c == '"':
			p.i = j + 1
			tok = p.s[start:p.i]
			plain = !esc && (ascii || utf8.ValidString(tok))
			return tok, plain
		case c < 0x20:
			p.bad = true
			return "", false
		case c == '\\':
			esc = true
			j++
			if j >= len(p.s) {
				p.bad = true
				return "", false
			}
			switch p.s[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(p.s) || !isHex(p.s[j+1]) || !isHex(p.s[j+2]) || !isHex(p.s[j+3]) || !isHex(p.s[j+4]) {
					p.bad = true
					return "", false
				}
				j += 4
			default:
				p.bad = true
				return "", false
			}
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	p.bad = true
	return "", false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// str decodes a string value into dst (null leaves it).
func (p *parser) str(dst *string) {
	if p.null() || p.bad {
		return
	}
	tok, plain := p.strToken()
	if p.bad {
		return
	}
	if plain {
		*dst = tok[1 : len(tok)-1]
		return
	}
	// Escapes or invalid UTF-8: encoding/json's own unquoting, exactly.
	if err := json.Unmarshal([]byte(tok), dst); err != nil {
		p.bad = true
	}
}

// numToken scans a JSON number and returns it and whether it is an integer
// (no fraction, no exponent).
func (p *parser) numToken() (tok string, integer bool) {
	if p.bad {
		return "", false
	}
	p.ws()
	start, j := p.i, p.i
	digits := func() int {
		k := j
		for j < len(p.s) && '0' <= p.s[j] && p.s[j] <= '9' {
			j++
		}
		return j - k
	}
	if j < len(p.s) && p.s[j] == '-' {
		j++
	}
	n := digits()
	if n == 0 || n > 1 && p.s[j-n] == '0' {
		p.bad = true
		return "", false
	}
	integer = true
	if j < len(p.s) && p.s[j] == '.' {
		j++
		integer = false
		if digits() == 0 {
			p.bad = true
			return "", false
		}
	}
	if j < len(p.s) && (p.s[j] == 'e' || p.s[j] == 'E') {
		j++
		integer = false
		if j < len(p.s) && (p.s[j] == '+' || p.s[j] == '-') {
			j++
		}
		if digits() == 0 {
			p.bad = true
			return "", false
		}
	}
	p.i = j
	return p.s[start:j], integer
}

// integer decodes an integer of at most bits bits (null leaves dst); any
// other number falls back (encoding/json: a type error).
func (p *parser) integer(bits uint) (v int64, set bool) {
	if p.null() || p.bad {
		return 0, false
	}
	tok, isInt := p.numToken()
	if p.bad || !isInt {
		p.bad = true
		return 0, false
	}
	neg := tok[0] == '-'
	if neg {
		tok = tok[1:]
	}
	if len(tok) > 19 {
		p.bad = true
		return 0, false
	}
	var u uint64
	for i := 0; i < len(tok); i++ {
		u = u*10 + uint64(tok[i]-'0')
	}
	lim := uint64(1) << (bits - 1) // |min| of a signed integer of that size
	if neg && u > lim || !neg && u >= lim {
		p.bad = true
		return 0, false
	}
	if neg {
		return -int64(u), true
	}
	return int64(u), true
}

func (p *parser) i64(dst *int64) {
	if v, ok := p.integer(64); ok {
		*dst = v
	}
}

func (p *parser) i32(dst *int32) {
	if v, ok := p.integer(32); ok {
		*dst = int32(v)
	}
}

func (p *parser) intv(dst *int) {
	if v, ok := p.integer(strconvIntSize); ok {
		*dst = int(v)
	}
}

const strconvIntSize = 32 << (^uint(0) >> 63)

func (p *parser) boolean(dst *bool) {
	if p.null() || p.bad {
		return
	}
	switch {
	case strings.HasPrefix(p.s[p.i:], "true"):
		*dst = true
		p.i += 4
	case strings.HasPrefix(p.s[p.i:], "false"):
		*dst = false
		p.i += 5
	default:
		p.bad = true
	}
}

// skip validates and skips one value of any type.
func (p *parser) skip() {
	if p.bad {
		return
	}
	switch c := p.peek(); {
	case c == '{':
		p.open('{')
		for first := true; p.more('}', &first); {
			p.strToken() // keys of skipped objects may be anything
			if p.bad || p.peek() != ':' {
				p.bad = true
				return
			}
			p.i++
			p.skip()
		}
	case c == '[':
		p.open('[')
		for first := true; p.more(']', &first); {
			p.skip()
		}
	case c == '"':
		p.strToken()
	case c == '-' || '0' <= c && c <= '9':
		p.numToken()
	case c == 't':
		p.literal("true")
	case c == 'f':
		p.literal("false")
	case c == 'n':
		p.literal("null")
	default:
		p.bad = true
	}
}

func (p *parser) literal(l string) {
	if !strings.HasPrefix(p.s[p.i:], l) {
		p.bad = true
		return
	}
	p.i += len(l)
}

// end checks that only white space follows the top-level value.
func (p *parser) end() bool {
	if p.bad {
		return false
	}
	p.ws()
	return p.i == len(p.s)
}

// strList decodes an array of strings (null: nil; [] an empty slice, as
// encoding/json does); a null element falls back.
func (p *parser) strList(dst *[]string) {
	if p.bad {
		return
	}
	if p.null() {
		*dst = nil
		return
	}
	out := []string{}
	if !p.open('[') {
		return
	}
	for first := true; p.more(']', &first); {
		if p.peek() == 'n' {
			p.bad = true
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
	p := parser{s: s}
	var seen uint32
	if !p.open('{') {
		return false
	}
	for first := true; p.more('}', &first); {
		switch k := p.key(); k {
		case "event_id":
			if p.once(&seen, 1) {
				p.str(&f.EventID)
			}
		case "mix_id":
			if p.once(&seen, 2) {
				p.i64(&f.MixID)
			}
		case "started_at":
			if p.once(&seen, 4) {
				p.i64(&f.StartedAt)
			}
		case "offset_ms":
			if p.once(&seen, 8) {
				p.i64(&f.OffsetMS)
			}
		case "duration_ms":
			if p.once(&seen, 16) {
				p.i64(&f.DurationMS)
			}
		case "user_id":
			if p.once(&seen, 32) {
				p.str(&f.UserID)
			}
		case "country":
			if p.once(&seen, 64) {
				p.str(&f.Country)
			}
		default:
			p.unknown(k, eventKeys...)
		}
	}
	return p.end()
}

var (
	playKeys   = []string{"v", "report_id", "event_id", "mix_id", "position", "overlap_ms", "below_minimum", "no_user_id", "standby_listing", "derived_at", "report"}
	reportKeys = []string{"trackid", "playedat", "playlength", "country", "userid", "isrc"}
)

// fastPlay decodes the ledger's fields of a track play.
func fastPlay(s string, r *playRecord) bool {
	p := parser{s: s}
	var seen uint32
	if !p.open('{') {
		return false
	}
	for first := true; p.more('}', &first); {
		switch k := p.key(); k {
		case "v":
			if p.once(&seen, 1<<0) {
				p.intv(&r.V)
			}
		case "report_id":
			if p.once(&seen, 1<<1) {
				p.str(&r.ReportID)
			}
		case "event_id":
			if p.once(&seen, 1<<2) {
				p.str(&r.EventID)
			}
		case "mix_id":
			if p.once(&seen, 1<<3) {
				p.i64(&r.MixID)
			}
		case "position":
			if p.once(&seen, 1<<4) {
				p.intv(&r.Position)
			}
		case "overlap_ms":
			if p.once(&seen, 1<<5) {
				p.i64(&r.OverlapMS)
			}
		case "below_minimum":
			if p.once(&seen, 1<<6) {
				p.boolean(&r.BelowMinimum)
			}
		case "no_user_id":
			if p.once(&seen, 1<<7) {
				p.boolean(&r.NoUserID)
			}
		case "standby_listing":
			if p.once(&seen, 1<<8) {
				p.boolean(&r.StandbyListing)
			}
		case "derived_at":
			if p.once(&seen, 1<<9) {
				p.i64(&r.DerivedAt)
			}
		case "report":
			if p.once(&seen, 1<<10) && !p.null() {
				p.playReport(r)
			}
		default:
			p.unknown(k, playKeys...)
		}
	}
	return p.end()
}

func (p *parser) playReport(r *playRecord) {
	var seen uint32
	if !p.open('{') {
		return
	}
	for first := true; p.more('}', &first); {
		switch k := p.key(); k {
		case "trackid":
			if p.once(&seen, 1<<0) {
				p.i64(&r.Report.TrackID)
			}
		case "playedat":
			if p.once(&seen, 1<<1) {
				p.i64(&r.Report.PlayedAt)
			}
		case "playlength":
			if p.once(&seen, 1<<2) {
				p.i64(&r.Report.PlayLength)
			}
		case "country":
			if p.once(&seen, 1<<3) {
				p.str(&r.Report.Country)
			}
		case "userid":
			if p.once(&seen, 1<<4) {
				p.str(&r.Report.UserID)
			}
		case "isrc":
			if p.once(&seen, 1<<5) {
				p.str(&r.Report.ISRC)
			}
		default:
			p.unknown(k, reportKeys...)
		}
	}
}

var deliveryKeys = []string{"v", "report_id", "event_id", "outcome", "attempt", "http_status", "served_by", "message", "fields", "retry_reason", "latency_us", "trace_id", "replay", "at"}

// fastDelivery decodes a delivery record.
func fastDelivery(s string, d *schemas.Delivery) bool {
	p := parser{s: s}
	var seen uint32
	if !p.open('{') {
		return false
	}
	for first := true; p.more('}', &first); {
		switch k := p.key(); k {
		case "v":
			if p.once(&seen, 1<<0) {
				p.intv(&d.V)
			}
		case "report_id":
			if p.once(&seen, 1<<1) {
				p.str(&d.ReportID)
			}
		case "event_id":
			if p.once(&seen, 1<<2) {
				p.str(&d.EventID)
			}
		case "outcome":
			if p.once(&seen, 1<<3) {
				p.str(&d.Outcome)
			}
		case "attempt":
			if p.once(&seen, 1<<4) {
				p.intv(&d.Attempt)
			}
		case "http_status":
			if p.once(&seen, 1<<5) {
				p.intv(&d.HTTPStatus)
			}
		case "served_by":
			if p.once(&seen, 1<<6) {
				p.str(&d.ServedBy)
			}
		case "message":
			if p.once(&seen, 1<<7) {
				p.str(&d.Message)
			}
		case "fields":
			if p.once(&seen, 1<<8) {
				p.strList(&d.Fields)
			}
		case "retry_reason":
			if p.once(&seen, 1<<9) {
				p.str(&d.Reason)
			}
		case "latency_us":
			if p.once(&seen, 1<<10) {
				p.i64(&d.LatencyUS)
			}
		case "trace_id":
			if p.once(&seen, 1<<11) {
				p.str(&d.TraceID)
			}
		case "replay":
			if p.once(&seen, 1<<12) {
				p.boolean(&d.Replay)
			}
		case "at":
			if p.once(&seen, 1<<13) {
				p.i64(&d.At)
			}
		default:
			p.unknown(k, deliveryKeys...)
		}
	}
	return p.end()
}

var (
	rejectionKeys = []string{"v", "event_id", "reason", "violations", "raw", "raw_base64", "source", "at"}
	violationKeys = []string{"field", "reason", "detail"}
	sourceKeys    = []string{"topic", "partition", "offset"}
)

// fastRejection decodes a rejection record.
func fastRejection(s string, j *schemas.Rejection) bool {
	p := parser{s: s}
	var seen uint32
	if !p.open('{') {
		return false
	}
	for first := true; p.more('}', &first); {
		switch k := p.key(); k {
		case "v":
			if p.once(&seen, 1<<0) {
				p.intv(&j.V)
			}
		case "event_id":
			if p.once(&seen, 1<<1) {
				p.str(&j.EventID)
			}
		case "reason":
			if p.once(&seen, 1<<2) {
				p.str(&j.Reason)
			}
		case "violations":
			if p.once(&seen, 1<<3) {
				p.violations(&j.Violations)
			}
		case "raw":
			if p.once(&seen, 1<<4) {
				p.str(&j.Raw)
			}
		case "raw_base64":
			if p.once(&seen, 1<<5) {
				p.boolean(&j.RawBase64)
			}
		case "source":
			if p.once(&seen, 1<<6) && !p.null() {
				p.source(&j.Source)
			}
		case "at":
			if p.once(&seen, 1<<7) {
				p.i64(&j.At)
			}
		default:
			p.unknown(k, rejectionKeys...)
		}
	}
	return p.end()
}

func (p *parser) violations(dst *[]schemas.Violation) {
	if p.bad {
		return
	}
	if p.null() {
		*dst = nil
		return
	}
	out := []schemas.Violation{}
	if !p.open('[') {
		return
	}
	for first := true; p.more(']', &first); {
		var v schemas.Violation
		var seen uint32
		if !p.open('{') { // a null element (or anything else) falls back
			return
		}
		for first := true; p.more('}', &first); {
			switch k := p.key(); k {
			case "field":
				if p.once(&seen, 1) {
					p.str(&v.Field)
				}
			case "reason":
				if p.once(&seen, 2) {
					p.str(&v.Reason)
				}
			case "detail":
				if p.once(&seen, 4) {
					p.str(&v.Detail)
				}
			default:
				p.unknown(k, violationKeys...)
			}
		}
		out = append(out, v)
	}
	*dst = out
}

func (p *parser) source(dst *schemas.Source) {
	var seen uint32
	if !p.open('{') {
		return
	}
	for first := true; p.more('}', &first); {
		switch k := p.key(); k {
		case "topic":
			if p.once(&seen, 1) {
				p.str(&dst.Topic)
			}
		case "partition":
			if p.once(&seen, 2) {
				p.i32(&dst.Partition)
			}
		case "offset":
			if p.once(&seen, 4) {
				p.i64(&dst.Offset)
			}
		default:
			p.unknown(k, sourceKeys...)
		}
	}
}
