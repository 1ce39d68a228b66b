package sandbox

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Report is a play report as the sandbox decoded it: the fields of the spec's
// Play report table, unknown fields stripped. Optional fields are nil when
// absent or null.
type Report struct {
	TrackID      int64   `json:"trackid"`
	PlayedAt     int64   `json:"playedat"`
	PlayLength   int64   `json:"playlength"`
	SourceStream string  `json:"sourcestream"`
	SourceDetail string  `json:"sourcedetail"`
	OS           string  `json:"os"`
	Device       string  `json:"device"`
	Country      string  `json:"country"`
	Vendor       int64   `json:"vendor"`
	UserID       *string `json:"userid,omitempty"`
	ISRC         *string `json:"isrc,omitempty"`
	EndReason    *int64  `json:"endreason,omitempty"`
	CachedPlay   *bool   `json:"cachedplay,omitempty"`
	JumpForward  *bool   `json:"jumpforward,omitempty"`
	// LegacyPlayLength is true when the length came as "playLength".
	LegacyPlayLength bool `json:"legacy_playlength,omitempty"`
}

// ReportError is a play report that failed validation: the 400 answer.
type ReportError struct {
	// Fields are the offending fields, in the order of the spec's table:
	// required fields that are missing or invalid, and optional fields sent
	// with the wrong type.
	Fields []string
}

// ErrReportInvalid matches every *ReportError with errors.Is.
var ErrReportInvalid = errors.New("sandbox: play report invalid")

func (e *ReportError) Error() string { return "sandbox: play report invalid: " + e.Message() }

// Is matches ErrReportInvalid.
func (e *ReportError) Is(target error) bool { return target == ErrReportInvalid }

// Message is the API's 400 message. Required fields missing or invalid are
// listed in the spec's form, "include the required fields: a,b"; optional
// fields sent with the wrong type (the spec's 400 names only required ones)
// are listed apart, so the message never calls an optional field required:
// "wrongly typed optional fields: cachedplay". Both clauses, when both
// apply, are joined by "; ".
func (e *ReportError) Message() string {
	var req, opt []string
	for _, f := range e.Fields {
		if i := fieldIndex(f); i >= 0 && requiredFields&(1<<i) == 0 {
			opt = append(opt, f)
		} else {
			req = append(req, f)
		}
	}
	var parts []string
	if len(req) > 0 {
		parts = append(parts, MessageRequiredPrefix+" "+strings.Join(req, ","))
	}
	if len(opt) > 0 {
		parts = append(parts, MessageOptionalPrefix+" "+strings.Join(opt, ","))
	}
	return strings.Join(parts, "; ")
}

// The two clauses of a 400 play report message.
const (
	MessageRequiredPrefix = "include the required fields:"
	MessageOptionalPrefix = "wrongly typed optional fields:"
)

// Report fields in the order of the spec's table (the order of the 400 message).
const (
	fTrackID = iota
	fPlayedAt
	fPlayLength
	fSourceStream
	fSourceDetail
	fOS
	fDevice
	fCountry
	fVendor
	fUserID
	fISRC
	fEndReason
	fCachedPlay
	fJumpForward
	numReportFields
)

var reportFieldNames = [numReportFields]string{"trackid", "playedat", "playlength", "sourcestream", "sourcedetail", "os", "device", "country", "vendor", "userid", "isrc", "endreason", "cachedplay", "jumpforward"}

const requiredFields = 1<<fTrackID | 1<<fPlayedAt | 1<<fPlayLength | 1<<fSourceStream | 1<<fSourceDetail | 1<<fOS | 1<<fDevice | 1<<fCountry | 1<<fVendor

// ValidateReport decodes and validates a play report body exactly as the
// live service does. The rules (the spec's table, made precise):
//
//   - The body must be one JSON object; otherwise every required field is offending.
//   - Unknown fields are ignored; of a repeated key the last one counts; a
//     key is matched exactly (case-sensitive) after JSON unescaping.
//   - Integers (trackid, playedat, playlength, vendor, endreason) must be JSON
//     integers written without fraction or exponent (1.0 and 1e3 are
//     invalid, so are strings such as "42") that fit in 64 bits; trackid and
//     playedat must be ≥ 1, playlength and vendor ≥ 0. endreason may be any integer.
//   - playlength may be sent as the legacy "playLength"; when both are
//     present, "playlength" counts and "playLength" is ignored.
//   - Required strings (sourcestream, sourcedetail, os, device) must be JSON
//     strings and not empty; country must be exactly two ASCII letters (a
//     lowercase one is accepted and flagged in the ledger).
//   - Optional fields that are present must have their type: userid and isrc
//     strings (any value, empty included), endreason an integer, cachedplay
//     and jumpforward booleans; null counts as absent for an optional field
//     and as missing for a required one. A wrongly typed optional field
//     rejects the report (400), named in the message's own clause
//     "wrongly typed optional fields: …" (see ReportError.Message): it is
//     neither dropped silently (the play would be reported without it) nor
//     called a required field.
//
// A failure is a *ReportError listing every offending field.
//
// The server validates with validateReport; ValidateReport is the entry
// point for tests and benchmarks of the rules (docs/sandbox.md).
func ValidateReport(body []byte) (Report, error) {
	return validateReport(body, string(body))
}

// validateReport validates body; s is the same bytes as a string, so that the
// decoded strings share its memory (no copy per field).
func validateReport(body []byte, s string) (Report, error) {
	var r Report
	var seen, bad uint16
	var raws [numReportFields]string
	var legacy string
	var legacySeen bool
	if !json.Valid(body) || !scanObject(s, func(key string, val string) {
		i := fieldIndex(key)
		switch {
		case i >= 0:
			raws[i] = val
			seen |= 1 << i
		case key == "playLength":
			legacy, legacySeen = val, true
		}
	}) {
		return r, &ReportError{Fields: fieldList(requiredFields)}
	}
	if seen&(1<<fPlayLength) == 0 && legacySeen {
		raws[fPlayLength] = legacy
		seen |= 1 << fPlayLength
		r.LegacyPlayLength = true
	}
	for i := range raws {
		v := raws[i]
		if seen&(1<<i) == 0 || v == "null" {
			if requiredFields&(1<<i) != 0 {
				bad |= 1 << i
			}
			continue
		}
		if !r.decodeField(i, v) {
			bad |= 1 << i
		}
	}
	if bad != 0 {
		return Report{}, &ReportError{Fields: fieldList(bad)}
	}
	return r, nil
}

// decodeField decodes the raw JSON value v of field i into r: false when
// it is wrongly typed or out of range.
func (r *Report) decodeField(i int, v string) bool {
	switch i {
	case fTrackID:
		return intAtLeast(v, 1, &r.TrackID)
	case fPlayedAt:
		return intAtLeast(v, 1, &r.PlayedAt)
	case fPlayLength:
		return intAtLeast(v, 0, &r.PlayLength)
	case fVendor:
		return intAtLeast(v, 0, &r.Vendor)
	case fEndReason:
		n, ok := jsonInt(v)
		r.EndReason = &n
		return ok
	case fSourceStream:
		return nonEmptyString(v, &r.SourceStream)
	case fSourceDetail:
		return nonEmptyString(v, &r.SourceDetail)
	case fOS:
		return nonEmptyString(v, &r.OS)
	case fDevice:
		return nonEmptyString(v, &r.Device)
	case fCountry:
		var ok bool
		r.Country, ok = jsonString(v)
		return ok && len(r.Country) == 2 && isLetter(r.Country[0]) && isLetter(r.Country[1])
	case fUserID:
		str, ok := jsonString(v)
		r.UserID = &str
		return ok
	case fISRC:
		str, ok := jsonString(v)
		r.ISRC = &str
		return ok
	case fCachedPlay, fJumpForward:
		b := v == "true"
		if i == fCachedPlay {
			r.CachedPlay = &b
		} else {
			r.JumpForward = &b
		}
		return b || v == "false"
	}
	return false
}

// intAtLeast decodes the JSON integer v into *dst: false when v is not one
// or is below lo.
func intAtLeast(v string, lo int64, dst *int64) bool {
	n, ok := jsonInt(v)
	*dst = n
	return ok && n >= lo
}

// nonEmptyString decodes the JSON string v into *dst: false when v is not
// one or is empty.
func nonEmptyString(v string, dst *string) bool {
	str, ok := jsonString(v)
	*dst = str
	return ok && str != ""
}

func fieldIndex(key string) int {
	switch key {
	case "trackid":
		return fTrackID
	case "playedat":
		return fPlayedAt
	case "playlength":
		return fPlayLength
	case "sourcestream":
		return fSourceStream
	case "sourcedetail":
		return fSourceDetail
	case "os":
		return fOS
	case "device":
		return fDevice
	case "country":
		return fCountry
	case "vendor":
		return fVendor
	case "userid":
		return fUserID
	case "isrc":
		return fISRC
	case "endreason":
		return fEndReason
	case "cachedplay":
		return fCachedPlay
	case "jumpforward":
		return fJumpForward
	}
	return -1
}

func fieldList(set uint16) []string {
	var out []string
	for i, n := range reportFieldNames {
		if set&(1<<i) != 0 {
			out = append(out, n)
		}
	}
	return out
}

func isLetter(c byte) bool { return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' }

// jsonInt parses a JSON number written as an integer: -?digits, no fraction,
// no exponent, within int64.
func jsonInt(v string) (int64, bool) {
	d := v
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 {
		return 0, false
	}
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// jsonString decodes a JSON string value.
func jsonString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	if inner := v[1 : len(v)-1]; strings.IndexByte(inner, '\\') < 0 && utf8.ValidString(inner) {
		return inner, true // no escapes: share the body's memory
	}
	// Escapes or invalid UTF-8 (replaced by U+FFFD, as encoding/json does).
	var s string
	if json.Unmarshal([]byte(v), &s) != nil {
		return "", false
	}
	return s, true
}

// scanObject calls fn for each member of the JSON object b, which must
// already be known valid JSON. It returns false when b is not an object.
func scanObject(b string, fn func(key string, val string)) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) {
			return false
		}
		switch b[i] {
		case '}':
			return true
		case ',':
			i = skipWS(b, i+1)
		}
		if i >= len(b) || b[i] != '"' {
			return false
		}
		kEnd := endString(b, i)
		if kEnd < 0 {
			return false
		}
		key, ok := jsonString(b[i:kEnd])
		if !ok {
			return false
		}
		i = skipWS(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipWS(b, i+1)
		vEnd := endValue(b, i)
		if vEnd < 0 {
			return false
		}
		fn(key, b[i:vEnd])
		i = vEnd
	}
}

func skipWS(b string, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// endString returns the index after the string starting at b[i] ('"'), or -1.
func endString(b string, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// endValue returns the index after the value starting at b[i], or -1.
func endValue(b string, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return endString(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				e := endString(b, j)
				if e < 0 {
					return -1
				}
				j = e - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	if j == i {
		return -1
	}
	return j
}
