package consumer

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"unicode/utf8"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// AppendTrackPlay appends the JSON encoding of p to dst and returns it. The
// bytes are identical to encoding/json's json.Marshal(p) (same field order,
// omitempty rules and string escaping, HTML characters included); the tests
// hold it to that. It allocates only when dst must grow.
func AppendTrackPlay(dst []byte, p *schemas.TrackPlay) []byte {
	return appendTrackPlay(dst, p, p.ReportID)
}

// appendTrackPlay encodes p with reportID in place of p.ReportID (the hot
// path keeps the id in its byte arena instead of a string per play).
func appendTrackPlay[ID []byte | string](dst []byte, p *schemas.TrackPlay, reportID ID) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(p.V), 10)
	dst = append(dst, `,"report_id":`...)
	dst = appendString(dst, reportID)
	dst = append(dst, `,"event_id":`...)
	dst = appendString(dst, p.EventID)
	dst = append(dst, `,"mix_id":`...)
	dst = strconv.AppendInt(dst, p.MixID, 10)
	dst = append(dst, `,"position":`...)
	dst = strconv.AppendInt(dst, int64(p.Position), 10)
	dst = append(dst, `,"overlap_ms":`...)
	dst = strconv.AppendInt(dst, p.OverlapMS, 10)
	if p.BelowMinimum {
		dst = append(dst, `,"below_minimum":true`...)
	}
	if p.NoUserID {
		dst = append(dst, `,"no_user_id":true`...)
	}
	if p.StandbyListing {
		dst = append(dst, `,"standby_listing":true`...)
	}
	dst = append(dst, `,"derived_at":`...)
	dst = strconv.AppendInt(dst, p.DerivedAt, 10)
	dst = append(dst, `,"report":`...)
	dst = AppendPlayReport(dst, &p.Report)
	return append(dst, '}')
}

// AppendPlayReport appends the JSON encoding of r, identical to
// json.Marshal(r).
func AppendPlayReport(dst []byte, r *partnerapi.PlayReport) []byte {
	dst = append(dst, `{"trackid":`...)
	dst = strconv.AppendInt(dst, r.TrackID, 10)
	dst = append(dst, `,"playedat":`...)
	dst = strconv.AppendInt(dst, r.PlayedAt, 10)
	dst = append(dst, `,"playlength":`...)
	dst = strconv.AppendInt(dst, r.PlayLength, 10)
	dst = append(dst, `,"sourcestream":`...)
	dst = appendString(dst, r.SourceStream)
	dst = append(dst, `,"sourcedetail":`...)
	dst = appendString(dst, r.SourceDetail)
	dst = append(dst, `,"os":`...)
	dst = appendString(dst, r.OS)
	dst = append(dst, `,"device":`...)
	dst = appendString(dst, r.Device)
	dst = append(dst, `,"country":`...)
	dst = appendString(dst, r.Country)
	dst = append(dst, `,"vendor":`...)
	dst = strconv.AppendInt(dst, r.Vendor, 10)
	if r.UserID != "" {
		dst = append(dst, `,"userid":`...)
		dst = appendString(dst, r.UserID)
	}
	if r.ISRC != "" {
		dst = append(dst, `,"isrc":`...)
		dst = appendString(dst, r.ISRC)
	}
	if r.EndReason != nil {
		dst = append(dst, `,"endreason":`...)
		dst = strconv.AppendInt(dst, *r.EndReason, 10)
	}
	if r.CachedPlay != nil {
		dst = appendBool(dst, `,"cachedplay":`, *r.CachedPlay)
	}
	if r.JumpForward != nil {
		dst = appendBool(dst, `,"jumpforward":`, *r.JumpForward)
	}
	return append(dst, '}')
}

func appendBool(dst []byte, key string, v bool) []byte {
	dst = append(dst, key...)
	if v {
		return append(dst, "true"...)
	}
	return append(dst, "false"...)
}

const hexDigits = "0123456789abcdef"

// plainASCII[b] is true for the ASCII bytes encoding/json writes unescaped
// with HTML escaping on: printable, not '"', '\\', '<', '>' or '&'.
var plainASCII = func() (t [utf8.RuneSelf]bool) {
	for b := 0x20; b < utf8.RuneSelf; b++ {
		t[b] = b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' // DEL (0x7f) is written as is
	}
	return t
}()

// appendString appends s as a JSON string exactly as encoding/json does:
// '"' and '\\' backslash-escaped; \b \f \n \r \t short-escaped; other
// control bytes, '<', '>' and '&' as \u00XX; invalid UTF-8 as \ufffd;
// U+2028 and U+2029 as \u2028 and \u2029; everything else verbatim.
func appendString[S []byte | string](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if plainASCII[b] {
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
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
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
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// appendReportID appends schemas.ReportID(eventID, position) as hex bytes,
// without allocating; the tests hold the two equal.
func appendReportID(dst []byte, eventID string, position int) []byte {
	var buf [schemas.MaxEventIDLen + 24]byte
	var sum [sha256.Size]byte
	if len(eventID) > schemas.MaxEventIDLen {
		return append(dst, schemas.ReportID(eventID, position)...)
	}
	b := append(buf[:0], eventID...)
	b = append(b, 0)
	b = strconv.AppendInt(b, int64(position), 10)
	sum = sha256.Sum256(b)
	return hex.AppendEncode(dst, sum[:16])
}
