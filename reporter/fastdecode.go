package reporter

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// decodeTrackPlay decodes the part of a schemas.TrackPlay record the
// reporter reads into tp (which must be zero). It gives exactly what
// json.Unmarshal(b, tp) gives — the same fields and an error exactly when
// json.Unmarshal fails — and Report is the report object's own bytes, as
// they are in b, in memory of its own (a held report must not pin the
// fetched batch b belongs to).
//
// The plain case, which is every record the consumer writes, is decoded in
// one pass by fastTrackPlay; anything else goes to encoding/json.
func decodeTrackPlay(b []byte, tp *wireTrackPlay) error {
	if fastTrackPlay(b, tp) {
		tp.Report = bytes.Clone(tp.Report)
		return nil
	}
	*tp = wireTrackPlay{}
	return json.Unmarshal(b, tp)
}

// fastTrackPlay is the one-pass decoder: it validates the syntax of the
// whole of b, reads report_id, event_id and below_minimum, and slices the
// report object out of b (no copy). It either returns true with exactly the
// fields json.Unmarshal would set (and no error), or false, leaving tp in
// any state, for the caller to decode with encoding/json.
//
// It returns false for anything outside the plain case (checked by
// TestFastDecodeMatchesEncodingJSON and FuzzDecodeTrackPlay): b not one
// valid JSON object; a known key twice; a known key with a value of another
// type (report must be an object: null, which encoding/json keeps as the
// bytes "null", falls back too); a key with escapes or non-ASCII bytes, or
// equal to a known one but for case (encoding/json unescapes keys and
// matches them case-insensitively, with Unicode folding); a known string
// with escapes or invalid UTF-8 (encoding/json rewrites those); nesting
// deeper than maxFastDepth.
func fastTrackPlay(b []byte, tp *wireTrackPlay) bool {
	p := scanner{s: b}
	if !p.open('{') {
		return false
	}
	const (
		seenID = 1 << iota
		seenEvent
		seenBelow
		seenReport
	)
	var seen uint8
	for first := true; p.more('}', &first); {
		k := p.key()
		if p.bad {
			return false
		}
		var bit uint8
		switch string(k) {
		case "report_id":
			bit = seenID
			p.str(&tp.ReportID)
		case "event_id":
			bit = seenEvent
			p.str(&tp.EventID)
		case "below_minimum":
			bit = seenBelow
			p.boolean(&tp.BelowMinimum)
		case "report":
			bit = seenReport
			if p.peek() != '{' {
				return false
			}
			start := p.i
			p.skip()
			tp.Report = b[start:p.i:p.i]
		default:
			if bytes.EqualFold(k, []byte("report_id")) || bytes.EqualFold(k, []byte("event_id")) ||
				bytes.EqualFold(k, []byte("below_minimum")) || bytes.EqualFold(k, []byte("report")) {
				return false
			}
			p.skip()
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
	}
	return p.end()
}

// maxFastDepth bounds the nesting the fast path follows (encoding/json's
// own limit is 10 000; deeper records fall back).
const maxFastDepth = 64

// scanner is a validating JSON reader over s; bad records the first
// failure, after which every method is a no-op. (The same approach as
// analytics/fastjson.go, whose parser is not exported, over bytes.)
type scanner struct {
	s     []byte
	i     int
	depth int
	bad   bool
}

func (p *scanner) ws() {
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
func (p *scanner) peek() byte {
	p.ws()
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

// open consumes c ('{' or '[') and enters a nesting level.
func (p *scanner) open(c byte) bool {
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
func (p *scanner) more(closing byte, first *bool) bool {
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
// bytes fail (the record falls back).
func (p *scanner) key() []byte {
	if p.bad || p.peek() != '"' {
		p.bad = true
		return nil
	}
	start := p.i + 1
	for j := start; j < len(p.s); j++ {
		c := p.s[j]
		if c == '"' {
			k := p.s[start:j]
			p.i = j + 1
			if p.peek() != ':' {
				p.bad = true
				return nil
			}
			p.i++
			return k
		}
		if c < 0x20 || c == '\\' || c >= utf8.RuneSelf {
			break
		}
	}
	p.bad = true
	return nil
}

// strToken scans a string (validating its escapes) and returns its token,
// quotes included, and whether it is plain: no escapes and valid UTF-8, so
// that its content is its value.
func (p *scanner) strToken() (tok []byte, plain bool) {
	if p.bad || p.peek() != '"' {
		p.bad = true
		return nil, false
	}
	start := p.i
	ascii, esc := true, false
	for j := start + 1; j < len(p.s); j++ {
		c := p.s[j]
		switch {
		case c == '"':
			p.i = j + 1
			tok = p.s[start:p.i]
			return tok, !esc && (ascii || utf8.Valid(tok))
		case c < 0x20:
			p.bad = true
			return nil, false
		case c == '\\':
			esc = true
			j++
			if j >= len(p.s) {
				p.bad = true
				return nil, false
			}
			switch p.s[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(p.s) || !isHex(p.s[j+1]) || !isHex(p.s[j+2]) || !isHex(p.s[j+3]) || !isHex(p.s[j+4]) {
					p.bad = true
					return nil, false
				}
				j += 4
			default:
				p.bad = true
				return nil, false
			}
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	p.bad = true
	return nil, false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// null consumes a null literal if one comes next (a null leaves a string or
// bool field as it is).
func (p *scanner) null() bool {
	if p.bad || p.peek() != 'n' {
		return false
	}
	p.literal("null")
	return !p.bad
}

// str decodes a plain string value into dst (null leaves it); any other
// value fails.
func (p *scanner) str(dst *string) {
	if p.null() || p.bad {
		return
	}
	tok, plain := p.strToken()
	if p.bad || !plain {
		p.bad = true
		return
	}
	*dst = string(tok[1 : len(tok)-1])
}

// boolean decodes true or false into dst (null leaves it); any other value
// fails.
func (p *scanner) boolean(dst *bool) {
	if p.null() || p.bad {
		return
	}
	switch {
	case bytes.HasPrefix(p.s[p.i:], []byte("true")):
		*dst = true
		p.i += 4
	case bytes.HasPrefix(p.s[p.i:], []byte("false")):
		*dst = false
		p.i += 5
	default:
		p.bad = true
	}
}

// number validates and skips a JSON number.
func (p *scanner) number() {
	j := p.i
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
	if n := digits(); n == 0 || n > 1 && p.s[j-n] == '0' {
		p.bad = true
		return
	}
	if j < len(p.s) && p.s[j] == '.' {
		j++
		if digits() == 0 {
			p.bad = true
			return
		}
	}
	if j < len(p.s) && (p.s[j] == 'e' || p.s[j] == 'E') {
		j++
		if j < len(p.s) && (p.s[j] == '+' || p.s[j] == '-') {
			j++
		}
		if digits() == 0 {
			p.bad = true
			return
		}
	}
	p.i = j
}

// skip validates and skips one value of any type.
func (p *scanner) skip() {
	if p.bad {
		return
	}
	switch c := p.peek(); {
	case c == '{':
		p.open('{')
		for first := true; p.more('}', &first); {
			p.strToken() // keys of skipped objects may be any string
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
		p.number()
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

func (p *scanner) literal(l string) {
	if !bytes.HasPrefix(p.s[p.i:], []byte(l)) {
		p.bad = true
		return
	}
	p.i += len(l)
}

// end checks that only white space follows the top-level value.
func (p *scanner) end() bool {
	if p.bad {
		return false
	}
	p.ws()
	return p.i == len(p.s)
}
