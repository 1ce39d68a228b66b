package schemas

// The JSON string encoder shared by the hand-written record encoders (track
// plays, play reports, deliveries): the hot paths append JSON without
// reflection, and every string goes through appendJSONString so the bytes
// are exactly encoding/json's.

import "unicode/utf8"

const hexDigitsLower = "0123456789abcdef"

// plainJSONASCII[b] is true for the ASCII bytes encoding/json writes unescaped
// with HTML escaping on: printable, not '"', '\\', '<', '>' or '&'.
var plainJSONASCII = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' // DEL (0x7f) is written as is
	}
	return t
}()

// appendJSONString appends s as a JSON string exactly as encoding/json does:
// '"' and '\\' backslash-escaped; \b \f \n \r \t short-escaped; other
// control bytes, '<', '>' and '&' as \u00XX; invalid UTF-8 as \ufffd;
// U+2028 and U+2029 as \u2028 and \u2029; everything else verbatim.
func appendJSONString[S []byte | string](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if plainJSONASCII[b] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigitsLower[b>>4], hexDigitsLower[b&0xF])
			}
			i++
			start = i
			continue
		}
		var c rune
		var size int
		switch v := any(s).(type) {
		case string:
			c, size = utf8.DecodeRuneInString(v[i:])
		case []byte:
			c, size = utf8.DecodeRune(v[i:])
		}
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigitsLower[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
