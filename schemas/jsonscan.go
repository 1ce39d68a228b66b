package schemas

import "unicode/utf8"

// jsonScanner is the validating, allocation-free JSON reader under every
// hand-written decoder of this package (the player event's fast path, the
// record decoders of decode.go): one pass over the bytes of a record, no
// reflection.
//
// What it promises: a scanner reads only what it is sure of, and gives up —
// Bad reports true, and every later call is a no-op — on anything else:
// invalid JSON, a value of another type than asked, a number that is not an
// integer of the asked size, a key with escapes or non-ASCII bytes, nesting
// deeper than maxJSONDepth, bytes after the top-level value. A caller whose
// scanner went bad decodes the record with encoding/json instead, so the fast
// path never has to be right about an edge case, only to notice it.
//
// The scanner is generic over its input (string or []byte): tokens and keys
// are slices of the input, never copies, and it allocates nothing. Whether a
// string value with escapes or invalid UTF-8 is decoded (with encoding/json)
// or makes the record fall back is the caller's choice: StrToken reports it.

// maxJSONDepth bounds the nesting a scanner follows (encoding/json's own limit
// is 10 000; deeper input makes the scanner bad).
const maxJSONDepth = 64

// jsonScanner is a validating JSON reader over s. The first failure makes it
// bad, after which every method is a no-op (and returns zero values).
type jsonScanner[S string | []byte] struct {
	s     S
	i     int
	depth int
	bad   bool
}

// newJSONScanner returns a scanner at the start of s.
func newJSONScanner[S string | []byte](s S) jsonScanner[S] {
	return jsonScanner[S]{s: s}
}

// Bad reports whether the scanner gave up.
func (p *jsonScanner[S]) Bad() bool { return p.bad }

// Fail makes the scanner give up (for a caller's own checks).
func (p *jsonScanner[S]) Fail() { p.bad = true }

// Pos is the offset in the input of the next unread byte.
func (p *jsonScanner[S]) Pos() int { return p.i }

func (p *jsonScanner[S]) ws() {
	s, i := p.s, p.i
	// One comparison for the usual case: no white space before the token.
	for i < len(s) && s[i] <= ' ' && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	p.i = i
}

// Peek skips white space and returns the next byte, or 0 at the end.
func (p *jsonScanner[S]) Peek() byte {
	p.ws()
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

// Open consumes c ('{' or '[') and enters a nesting level.
func (p *jsonScanner[S]) Open(c byte) bool {
	if p.bad || p.Peek() != c {
		p.bad = true
		return false
	}
	p.i++
	p.depth++
	if p.depth > maxJSONDepth {
		p.bad = true
		return false
	}
	return true
}

// More reports whether the container opened with Open has another member,
// consuming the separator or the closing byte; first must start true:
//
//	for first := true; p.More('}', &first); { ... }
func (p *jsonScanner[S]) More(closing byte, first *bool) bool {
	if p.bad {
		return false
	}
	c := p.Peek()
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

// Key reads a member's key and its colon and returns the key's content. A
// key with escapes or non-ASCII bytes makes the scanner bad, so a key it
// returns is plain ASCII.
func (p *jsonScanner[S]) Key() S {
	var zero S
	if p.bad || p.Peek() != '"' {
		p.bad = true
		return zero
	}
	start := p.i + 1
	for j := start; j < len(p.s); j++ {
		c := p.s[j]
		if !strStop[c] {
			continue // the common case: a plain byte of a plain key
		}
		if c == '"' {
			k := p.s[start:j]
			p.i = j + 1
			if p.Peek() != ':' {
				p.bad = true
				return zero
			}
			p.i++
			return k
		}
		if c < 0x20 || c == '\\' || c >= utf8.RuneSelf {
			break
		}
	}
	p.bad = true
	return zero
}

// Once marks a known key as seen in *seen; a second occurrence makes the
// scanner bad. It reports whether the scanner is still good.
func (p *jsonScanner[S]) Once(seen *uint32, bit uint32) bool {
	if *seen&bit != 0 {
		p.bad = true
	}
	*seen |= bit
	return !p.bad
}

// foldsTo reports whether key k (as Key returns it: ASCII) equals one of
// names (ASCII) but for case: encoding/json, which matches keys
// case-insensitively, would take it for that field.
func foldsTo[S string | []byte](k S, names ...string) bool {
	for _, n := range names {
		if len(n) != len(k) {
			continue
		}
		eq := true
		for i := 0; i < len(n); i++ {
			if lowerASCII(k[i]) != lowerASCII(n[i]) {
				eq = false
				break
			}
		}
		if eq {
			return true
		}
	}
	return false
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// Unknown skips the value of a key no field takes; a key that equals one of
// names but for case makes the scanner bad.
func (p *jsonScanner[S]) Unknown(k S, names ...string) {
	if foldsTo(k, names...) {
		p.bad = true
		return
	}
	p.Skip()
}

// Null consumes a null literal if one comes next and reports whether it did
// (a null leaves a scalar field as it is); an 'n' starting anything else
// makes the scanner bad.
func (p *jsonScanner[S]) Null() bool {
	if p.bad || p.Peek() != 'n' {
		return false
	}
	p.literal("null")
	return !p.bad
}

// StrToken scans a string (validating its escapes) and returns its token,
// quotes included, and whether it is plain: no escapes and valid UTF-8, so
// that the token's content is the string's value.
func (p *jsonScanner[S]) StrToken() (tok S, plain bool) {
	var zero S
	if p.bad || p.Peek() != '"' {
		p.bad = true
		return zero, false
	}
	start := p.i
	ascii, esc := true, false
	for j := start + 1; j < len(p.s); j++ {
		c := p.s[j]
		if !strStop[c] {
			continue // the common case: a plain ASCII byte
		}
		switch {
		case c == '"':
			p.i = j + 1
			tok = p.s[start:p.i]
			return tok, !esc && (ascii || validUTF8Of(tok))
		case c < 0x20:
			p.bad = true
			return zero, false
		case c == '\\':
			esc = true
			j++
			if j >= len(p.s) {
				p.bad = true
				return zero, false
			}
			switch p.s[j] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if j+4 >= len(p.s) || !isHexDigit(p.s[j+1]) || !isHexDigit(p.s[j+2]) || !isHexDigit(p.s[j+3]) || !isHexDigit(p.s[j+4]) {
					p.bad = true
					return zero, false
				}
				j += 4
			default:
				p.bad = true
				return zero, false
			}
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	p.bad = true
	return zero, false
}

// strStop marks the bytes a string scan must look at: the closing quote,
// a backslash, control characters and non-ASCII bytes. Every other byte is
// plain content, skipped with one table lookup.
var strStop = func() (t [256]bool) {
	for c := range t {
		t[c] = c == '"' || c == '\\' || c < 0x20 || c >= utf8.RuneSelf
	}
	return t
}()

func validUTF8Of[S string | []byte](s S) bool {
	switch v := any(s).(type) {
	case string:
		return utf8.ValidString(v)
	case []byte:
		return utf8.Valid(v)
	}
	return false
}

func isHexDigit(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// NumToken scans a JSON number and returns its token and whether it is an
// integer (no fraction, no exponent).
func (p *jsonScanner[S]) NumToken() (tok S, integer bool) {
	var zero S
	if p.bad {
		return zero, false
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
		return zero, false
	}
	integer = true
	if j < len(p.s) && p.s[j] == '.' {
		j++
		integer = false
		if digits() == 0 {
			p.bad = true
			return zero, false
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
			return zero, false
		}
	}
	p.i = j
	return p.s[start:j], integer
}

// Integer reads an integer that fits a signed integer of bits bits (1 to
// 64); set is false for null (the field stays as it is). Any other value —
// a fraction, an exponent, out of range, not a number — makes the scanner
// bad (encoding/json: a type error).
func (p *jsonScanner[S]) Integer(bits uint) (v int64, set bool) {
	if p.Null() || p.bad {
		return 0, false
	}
	tok, isInt := p.NumToken()
	if p.bad || !isInt {
		p.bad = true
		return 0, false
	}
	digits := tok
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	if len(digits) > 19 {
		p.bad = true
		return 0, false
	}
	var u uint64
	for i := 0; i < len(digits); i++ {
		u = u*10 + uint64(digits[i]-'0')
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

// Int64 decodes an int64 into dst (null leaves it).
func (p *jsonScanner[S]) Int64(dst *int64) {
	if v, ok := p.Integer(64); ok {
		*dst = v
	}
}

// Int32 decodes an int32 into dst (null leaves it).
func (p *jsonScanner[S]) Int32(dst *int32) {
	if v, ok := p.Integer(32); ok {
		*dst = int32(v)
	}
}

// Int decodes an int into dst (null leaves it).
func (p *jsonScanner[S]) Int(dst *int) {
	if v, ok := p.Integer(jsonIntSize); ok {
		*dst = int(v)
	}
}

const jsonIntSize = 32 << (^uint(0) >> 63)

// Bool decodes true or false into dst (null leaves it); any other value
// makes the scanner bad.
func (p *jsonScanner[S]) Bool(dst *bool) {
	if p.Null() || p.bad {
		return
	}
	switch {
	case p.hasPrefix("true"):
		*dst = true
		p.i += 4
	case p.hasPrefix("false"):
		*dst = false
		p.i += 5
	default:
		p.bad = true
	}
}

// Skip validates and skips one value of any type.
func (p *jsonScanner[S]) Skip() {
	if p.bad {
		return
	}
	switch c := p.Peek(); {
	case c == '{':
		p.Open('{')
		for first := true; p.More('}', &first); {
			p.StrToken() // keys of skipped objects may be any string
			if p.bad || p.Peek() != ':' {
				p.bad = true
				return
			}
			p.i++
			p.Skip()
		}
	case c == '[':
		p.Open('[')
		for first := true; p.More(']', &first); {
			p.Skip()
		}
	case c == '"':
		p.StrToken()
	case c == '-' || '0' <= c && c <= '9':
		p.NumToken()
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

func (p *jsonScanner[S]) hasPrefix(l string) bool {
	if len(p.s)-p.i < len(l) {
		return false
	}
	for k := 0; k < len(l); k++ {
		if p.s[p.i+k] != l[k] {
			return false
		}
	}
	return true
}

func (p *jsonScanner[S]) literal(l string) {
	if !p.hasPrefix(l) {
		p.bad = true
		return
	}
	p.i += len(l)
}

// End reports whether the scanner is good and only white space follows the
// top-level value.
func (p *jsonScanner[S]) End() bool {
	if p.bad {
		return false
	}
	p.ws()
	return p.i == len(p.s)
}

// Str decodes a string value into dst (null leaves it). The value of a
// plain string (no escapes, valid UTF-8) is the token's content: a slice of
// the input when it is a string, a copy when it is a []byte. A string with
// escapes or invalid UTF-8 is decoded exactly as encoding/json does.
func (p *jsonScanner[S]) Str(dst *string) {
	if p.Null() || p.bad {
		return
	}
	tok, plain := p.StrToken()
	if p.bad {
		return
	}
	if plain {
		*dst = string(tok[1 : len(tok)-1])
		return
	}
	*dst = unquoteJSON(tok[1 : len(tok)-1])
}

// StrList decodes an array of strings (null: nil; [] an empty slice, as
// encoding/json does); a null element makes the scanner bad (encoding/json
// would keep "" there, which a decoder does not need to mimic).
func (p *jsonScanner[S]) StrList(dst *[]string) {
	if p.bad {
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
			p.bad = true
			return
		}
		var s string
		p.Str(&s)
		out = append(out, s)
	}
	*dst = out
}
