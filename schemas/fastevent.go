package schemas

import (
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The fast path of ParseEvent: a single pass over the bytes of a flat player
// event object that fills a rawEvent exactly as json.Unmarshal would, without
// reflection. It only ever answers for input it fully understands; on
// anything else (duplicate keys, keys that may equal a field name but for
// case, wrong JSON types, numbers that are not plain int64
// literals, deep nesting, any syntax error, …) it gives up and ParseEvent
// takes the encoding/json path, which then decides. Callers check utf8.Valid
// on the whole input first, so strings need no UTF-8 validation here.
// FuzzParseEventFastVsSlow holds both paths to the same results.

// Indexes of the known fields in fastValues (schema order within each kind).
const (
	fsEventID = iota
	fsUserID
	fsCountry
	fsOS
	fsDevice
	fsSourceStream
	numFastStrings
)

const (
	fiMixID = iota
	fiStartedAt
	fiOffsetMS
	fiDurationMS
	fiVendor
	fiEndReason
	numFastInts
)

const (
	fbCached = iota
	fbJumpForward
	numFastBools
)

// fastValues backs the pointers of a rawEvent filled by the fast path, so
// that one allocation holds every scalar.
type fastValues struct {
	strs  [numFastStrings]string
	ints  [numFastInts]int64
	bools [numFastBools]bool
}

// maxFastUnknown is the most unknown keys the fast path checks for
// duplicates (pairwise); an event with more goes to the slow path.
const maxFastUnknown = 8

// maxFastDepth is the deepest nesting of unknown values the fast path skips;
// deeper input goes to encoding/json (which has its own, larger limit).
const maxFastDepth = 64

// fastKey maps an exactly spelled known key to its kind and index.
func fastKey(key []byte) (kind byte, idx int, ok bool) {
	switch string(key) {
	case "event_id":
		return 's', fsEventID, true
	case "mix_id":
		return 'i', fiMixID, true
	case "started_at":
		return 'i', fiStartedAt, true
	case "offset_ms":
		return 'i', fiOffsetMS, true
	case "duration_ms":
		return 'i', fiDurationMS, true
	case "user_id":
		return 's', fsUserID, true
	case "country":
		return 's', fsCountry, true
	case "os":
		return 's', fsOS, true
	case "device":
		return 's', fsDevice, true
	case "vendor":
		return 'i', fiVendor, true
	case "source_stream":
		return 's', fsSourceStream, true
	case "cached":
		return 'b', fbCached, true
	case "jump_forward":
		return 'b', fbJumpForward, true
	case "end_reason":
		return 'i', fiEndReason, true
	}
	return 0, 0, false
}

// seenBit is the presence bit of a known field, for duplicate detection.
func seenBit(kind byte, idx int) uint32 {
	switch kind {
	case 's':
		return 1 << idx
	case 'i':
		return 1 << (numFastStrings + idx)
	default:
		return 1 << (numFastStrings + numFastInts + idx)
	}
}

// mayFoldToKnown reports whether encoding/json could match key to a field
// case-insensitively: only keys with an upper-case ASCII letter or a
// non-ASCII byte can (a lower-case ASCII key matches only by its exact
// spelling, which fastKey already tried).
func mayFoldToKnown(key []byte) bool {
	for _, c := range key {
		if c >= utf8.RuneSelf || ('A' <= c && c <= 'Z') {
			return true
		}
	}
	return false
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// fastDecodeEvent fills r from raw and reports true when raw is one JSON
// object whose known fields all have their JSON type (or null) and appear at
// most once; it reports false, with r in an unspecified state, whenever
// encoding/json has to decide.
func fastDecodeEvent(raw []byte, r *rawEvent) bool {
	var (
		seen  uint32 // known fields with a value
		nulls uint32 // known fields given as null
		// Strings without escapes are kept as spans of raw and copied out
		// with one conversion at the end; decoded ones are kept as is.
		spans   [numFastStrings][2]int
		decoded [numFastStrings]bool
		vals    fastValues
		lo, hi  = len(raw), 0
		// Unknown keys seen so far (plain, so their bytes are the key):
		// a duplicate is a violation the slow path reports.
		unknown  [maxFastUnknown][2]int
		nUnknown int
	)
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return false
	}
	i = skipSpace(raw, i+1)
	if i >= len(raw) {
		return false
	}
	if raw[i] == '}' {
		i++
	} else {
		for {
			// Key.
			if raw[i] != '"' {
				return false
			}
			ks := i + 1
			ke, plain := scanString(raw, ks)
			if ke < 0 || !plain {
				return false // an escaped key may spell a known one
			}
			key := raw[ks:ke]
			i = skipSpace(raw, ke+1)
			if i >= len(raw) || raw[i] != ':' {
				return false
			}
			i = skipSpace(raw, i+1)
			if i >= len(raw) {
				return false
			}
			kind, idx, known := fastKey(key)
			if !known {
				if mayFoldToKnown(key) || nUnknown == maxFastUnknown {
					return false
				}
				for _, u := range unknown[:nUnknown] {
					if string(raw[u[0]:u[1]]) == string(key) {
						return false // duplicate key: the slow path reports it
					}
				}
				unknown[nUnknown] = [2]int{ks, ke}
				nUnknown++
				if i = skipValue(raw, i, 0); i < 0 {
					return false
				}
			} else {
				bit := seenBit(kind, idx)
				if (seen|nulls)&bit != 0 {
					return false // duplicate key: the slow path reports it
				}
				seen |= bit
				c := raw[i]
				switch {
				case c == 'n':
					if !hasLiteral(raw, i, "null") {
						return false
					}
					i += 4
					seen &^= bit // null leaves the pointer nil
					nulls |= bit
				case kind == 's':
					if c != '"' {
						return false
					}
					end, plain := scanString(raw, i+1)
					if end < 0 {
						return false
					}
					if plain {
						spans[idx] = [2]int{i + 1, end}
						lo, hi = min(lo, i+1), max(hi, end)
					} else {
						s, ok := unquoteJSON(raw[i+1 : end])
						if !ok {
							return false
						}
						vals.strs[idx], decoded[idx] = s, true
					}
					i = end + 1
				case kind == 'i':
					n, next, ok := parseInt64(raw, i)
					if !ok {
						return false
					}
					vals.ints[idx] = n
					i = next
				default: // 'b'
					switch {
					case hasLiteral(raw, i, "true"):
						vals.bools[idx] = true
						i += 4
					case hasLiteral(raw, i, "false"):
						i += 5
					default:
						return false
					}
				}
			}
			i = skipSpace(raw, i)
			if i >= len(raw) {
				return false
			}
			if raw[i] == '}' {
				i++
				break
			}
			if raw[i] != ',' {
				return false
			}
			i = skipSpace(raw, i+1)
			if i >= len(raw) {
				return false
			}
		}
	}
	if skipSpace(raw, i) != len(raw) {
		return false // trailing bytes after the object
	}

	// Success: copy the plain strings out with one conversion.
	var src string
	if lo < hi {
		src = string(raw[lo:hi])
	}
	vp := new(fastValues) // one allocation backs every pointer below
	*vp = vals
	for k := 0; k < numFastStrings; k++ {
		if seen&seenBit('s', k) != 0 && !decoded[k] {
			vp.strs[k] = src[spans[k][0]-lo : spans[k][1]-lo]
		}
	}
	str := func(k int) *string {
		if seen&seenBit('s', k) == 0 {
			return nil
		}
		return &vp.strs[k]
	}
	num := func(k int) *int64 {
		if seen&seenBit('i', k) == 0 {
			return nil
		}
		return &vp.ints[k]
	}
	boolean := func(k int) *bool {
		if seen&seenBit('b', k) == 0 {
			return nil
		}
		return &vp.bools[k]
	}
	*r = rawEvent{
		EventID: str(fsEventID), MixID: num(fiMixID), StartedAt: num(fiStartedAt),
		OffsetMS: num(fiOffsetMS), DurationMS: num(fiDurationMS), UserID: str(fsUserID),
		Country: str(fsCountry), OS: str(fsOS), Device: str(fsDevice), Vendor: num(fiVendor),
		SourceStream: str(fsSourceStream), Cached: boolean(fbCached), JumpForward: boolean(fbJumpForward),
		EndReason: num(fiEndReason),
	}
	return true
}

func hasLiteral(b []byte, i int, lit string) bool {
	return len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit
}

// scanString scans a JSON string whose contents start at b[i] (just after the
// opening quote). It returns the index of the closing quote and whether the
// contents are plain (no escape), or -1 when the string is invalid JSON
// (control character, bad escape, unterminated).
func scanString(b []byte, i int) (end int, plain bool) {
	plain = true
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return i, plain
		case c < 0x20:
			return -1, false
		case c == '\\':
			plain = false
			if i+1 >= len(b) {
				return -1, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || hex4(b[i+2:i+6]) < 0 {
					return -1, false
				}
				i += 6
			default:
				return -1, false
			}
		default:
			i++
		}
	}
	return -1, false
}

// hex4 decodes four hex digits, or returns -1.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r*16 + rune(c)
	}
	return r
}

// unquoteJSON decodes the contents of a JSON string already checked by
// scanString, exactly as encoding/json does (an unpaired surrogate escape
// becomes U+FFFD).
func unquoteJSON(s []byte) (string, bool) {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' {
			b = append(b, c)
			i++
			continue
		}
		if i+1 >= len(s) {
			return "", false
		}
		switch s[i+1] {
		case '"', '\\', '/':
			b = append(b, s[i+1])
			i += 2
		case 'b':
			b = append(b, '\b')
			i += 2
		case 'f':
			b = append(b, '\f')
			i += 2
		case 'n':
			b = append(b, '\n')
			i += 2
		case 'r':
			b = append(b, '\r')
			i += 2
		case 't':
			b = append(b, '\t')
			i += 2
		case 'u':
			if i+6 > len(s) {
				return "", false
			}
			rr := hex4(s[i+2 : i+6])
			if rr < 0 {
				return "", false
			}
			i += 6
			if utf16.IsSurrogate(rr) {
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if rr1 := hex4(s[i+2 : i+6]); rr1 >= 0 {
						if dec := utf16.DecodeRune(rr, rr1); dec != unicode.ReplacementChar {
							b = utf8.AppendRune(b, dec)
							i += 6
							continue
						}
					}
				}
				rr = unicode.ReplacementChar
			}
			b = utf8.AppendRune(b, rr)
		default:
			return "", false
		}
	}
	return string(b), true
}

// parseInt64 reads a JSON number at b[i] that must be a plain integer within
// int64 (what encoding/json stores into an int64 without a type error). It
// refuses fractions, exponents, leading zeros and out-of-range values.
func parseInt64(b []byte, i int) (n int64, next int, ok bool) {
	neg := false
	if i < len(b) && b[i] == '-' {
		neg = true
		i++
	}
	start := i
	var u uint64
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		if i-start == 19 {
			return 0, 0, false // 20+ digits overflow int64
		}
		u = u*10 + uint64(b[i]-'0')
		i++
	}
	digits := i - start
	if digits == 0 || (digits > 1 && b[start] == '0') {
		return 0, 0, false
	}
	if i < len(b) && (b[i] == '.' || b[i] == 'e' || b[i] == 'E') {
		return 0, 0, false
	}
	if neg {
		if u > 1<<63 {
			return 0, 0, false
		}
		return -int64(u), i, true // -(1<<63) wraps to itself, which is right
	}
	if u > 1<<63-1 {
		return 0, 0, false
	}
	return int64(u), i, true
}

// skipValue skips one valid JSON value of any type at b[i] and returns the
// index after it, or -1 when the value is invalid or nests too deeply.
func skipValue(b []byte, i, depth int) int {
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '"':
		end, _ := scanString(b, i+1)
		if end < 0 {
			return -1
		}
		return end + 1
	case c == '{' || c == '[':
		if depth >= maxFastDepth {
			return -1
		}
		closer := byte('}')
		if c == '[' {
			closer = ']'
		}
		i = skipSpace(b, i+1)
		if i < len(b) && b[i] == closer {
			return i + 1
		}
		for {
			if c == '{' {
				if i >= len(b) || b[i] != '"' {
					return -1
				}
				end, _ := scanString(b, i+1)
				if end < 0 {
					return -1
				}
				i = skipSpace(b, end+1)
				if i >= len(b) || b[i] != ':' {
					return -1
				}
				i = skipSpace(b, i+1)
			}
			if i = skipValue(b, i, depth+1); i < 0 {
				return -1
			}
			i = skipSpace(b, i)
			if i >= len(b) {
				return -1
			}
			if b[i] == closer {
				return i + 1
			}
			if b[i] != ',' {
				return -1
			}
			i = skipSpace(b, i+1)
		}
	case c == 't':
		if hasLiteral(b, i, "true") {
			return i + 4
		}
	case c == 'f':
		if hasLiteral(b, i, "false") {
			return i + 5
		}
	case c == 'n':
		if hasLiteral(b, i, "null") {
			return i + 4
		}
	case c == '-' || ('0' <= c && c <= '9'):
		return skipNumber(b, i)
	}
	return -1
}

// skipNumber skips a JSON number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func skipNumber(b []byte, i int) int {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
