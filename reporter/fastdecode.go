package reporter

import (
	"bytes"
	"encoding/json"

	"github.com/playpipe/playpipe/internal/jsonscan"
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
// deeper than jsonscan.MaxDepth.
func fastTrackPlay(b []byte, tp *wireTrackPlay) bool {
	p := jsonscan.New(b)
	if !p.Open('{') {
		return false
	}
	const (
		seenID = 1 << iota
		seenEvent
		seenBelow
		seenReport
	)
	var seen uint8
	for first := true; p.More('}', &first); {
		k := p.Key()
		if p.Bad() {
			return false
		}
		var bit uint8
		switch string(k) {
		case "report_id":
			bit = seenID
			str(&p, &tp.ReportID)
		case "event_id":
			bit = seenEvent
			str(&p, &tp.EventID)
		case "below_minimum":
			bit = seenBelow
			p.Bool(&tp.BelowMinimum)
		case "report":
			bit = seenReport
			if p.Peek() != '{' {
				return false
			}
			start := p.Pos()
			p.Skip()
			end := p.Pos()
			tp.Report = b[start:end:end]
		default:
			p.Unknown(k, "report_id", "event_id", "below_minimum", "report")
		}
		if seen&bit != 0 {
			return false
		}
		seen |= bit
	}
	return p.End()
}

// str decodes a plain string value into dst, copied out of the record (null
// leaves it); a string with escapes or invalid UTF-8 (which encoding/json
// rewrites) or any other value makes the record fall back.
func str(p *jsonscan.Scanner[[]byte], dst *string) {
	if p.Null() || p.Bad() {
		return
	}
	tok, plain := p.StrToken()
	if p.Bad() || !plain {
		p.Fail()
		return
	}
	*dst = string(tok[1 : len(tok)-1])
}
