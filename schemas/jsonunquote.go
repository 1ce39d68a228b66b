package schemas

import (
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// Unquoting of JSON strings with escapes or invalid UTF-8, exactly as
// encoding/json does it: the scanner's slow path for string values
// (jsonScanner.Str).

// hex4 decodes four hex digits, or returns -1.
func hex4[S string | []byte](b S) rune {
	var r rune
	for i := 0; i < 4; i++ {
		c := b[i]
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

// unquoteJSON decodes the contents of a JSON string already validated by
// StrToken exactly as encoding/json does: an unpaired surrogate escape and
// each byte of invalid UTF-8 become U+FFFD.
func unquoteJSON[S string | []byte](s S) string {
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '\\':
			i = unescapeJSON(&b, s, i)
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, size := decodeRune(s[i:])
			if r == utf8.RuneError && size == 1 {
				b = utf8.AppendRune(b, unicode.ReplacementChar)
			} else {
				b = append(b, s[i:i+size]...)
			}
			i += size
		}
	}
	return string(b)
}

// unescapeJSON appends the escape at s[i] (a validated one) to *b and
// returns the index after it.
func unescapeJSON[S string | []byte](b *[]byte, s S, i int) int {
	switch c := s[i+1]; c {
	case 'b':
		*b = append(*b, '\b')
	case 'f':
		*b = append(*b, '\f')
	case 'n':
		*b = append(*b, '\n')
	case 'r':
		*b = append(*b, '\r')
	case 't':
		*b = append(*b, '\t')
	case 'u':
		rr := hex4(s[i+2 : i+6])
		i += 6
		if utf16.IsSurrogate(rr) {
			if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
				if rr1 := hex4(s[i+2 : i+6]); rr1 >= 0 {
					if dec := utf16.DecodeRune(rr, rr1); dec != unicode.ReplacementChar {
						*b = utf8.AppendRune(*b, dec)
						return i + 6
					}
				}
			}
			rr = unicode.ReplacementChar
		}
		*b = utf8.AppendRune(*b, rr)
		return i
	default: // '"', '\\', '/'
		*b = append(*b, c)
	}
	return i + 2
}

func decodeRune[S string | []byte](s S) (rune, int) {
	switch v := any(s).(type) {
	case string:
		return utf8.DecodeRuneInString(v)
	case []byte:
		return utf8.DecodeRune(v)
	}
	return utf8.RuneError, 1
}
