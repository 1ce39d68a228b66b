package schemas

import "strconv"

// PlayReport is the body of POST /partners/royalty-tracking: one track play,
// with exactly the fields of the spec's Play report table. Integers are JSON
// integers (never strings, never 1.0); optional fields are omitted when unset
// (nil pointer or empty string), and a set false or 0 is sent as such.
type PlayReport struct {
	TrackID      int64  `json:"trackid"`
	PlayedAt     int64  `json:"playedat"`   // epoch milliseconds, 13 digits
	PlayLength   int64  `json:"playlength"` // whole seconds played
	SourceStream string `json:"sourcestream"`
	SourceDetail string `json:"sourcedetail"`
	OS           string `json:"os"`
	Device       string `json:"device"`
	Country      string `json:"country"`
	Vendor       int64  `json:"vendor"`
	UserID       string `json:"userid,omitempty"`
	// ISRC is echoed byte for byte from the mix's track listing; empty omits it.
	ISRC        string `json:"isrc,omitempty"`
	EndReason   *int64 `json:"endreason,omitempty"`
	CachedPlay  *bool  `json:"cachedplay,omitempty"`
	JumpForward *bool  `json:"jumpforward,omitempty"`
}

// AppendReportJSON appends the JSON body of r to dst, byte for byte what
// encoding/json.Marshal(r) produces (same field order, same string
// escaping), without reflection: trackid, playedat, playlength and vendor as
// JSON integers; userid and isrc omitted when empty; endreason, cachedplay
// and jumpforward omitted when nil and sent when set, even to 0 or false.
// Strings are written unchanged apart from JSON escaping, so the isrc
// arrives byte for byte (invalid UTF-8, which a JSON listing cannot carry,
// becomes U+FFFD as with encoding/json).
func AppendReportJSON(dst []byte, r *PlayReport) []byte {
	dst = append(dst, `{"trackid":`...)
	dst = strconv.AppendInt(dst, r.TrackID, 10)
	dst = append(dst, `,"playedat":`...)
	dst = strconv.AppendInt(dst, r.PlayedAt, 10)
	dst = append(dst, `,"playlength":`...)
	dst = strconv.AppendInt(dst, r.PlayLength, 10)
	dst = append(dst, `,"sourcestream":`...)
	dst = appendJSONString(dst, r.SourceStream)
	dst = append(dst, `,"sourcedetail":`...)
	dst = appendJSONString(dst, r.SourceDetail)
	dst = append(dst, `,"os":`...)
	dst = appendJSONString(dst, r.OS)
	dst = append(dst, `,"device":`...)
	dst = appendJSONString(dst, r.Device)
	dst = append(dst, `,"country":`...)
	dst = appendJSONString(dst, r.Country)
	dst = append(dst, `,"vendor":`...)
	dst = strconv.AppendInt(dst, r.Vendor, 10)
	if r.UserID != "" {
		dst = append(dst, `,"userid":`...)
		dst = appendJSONString(dst, r.UserID)
	}
	if r.ISRC != "" {
		dst = append(dst, `,"isrc":`...)
		dst = appendJSONString(dst, r.ISRC)
	}
	if r.EndReason != nil {
		dst = append(dst, `,"endreason":`...)
		dst = strconv.AppendInt(dst, *r.EndReason, 10)
	}
	if r.CachedPlay != nil {
		dst = append(dst, `,"cachedplay":`...)
		dst = strconv.AppendBool(dst, *r.CachedPlay)
	}
	if r.JumpForward != nil {
		dst = append(dst, `,"jumpforward":`...)
		dst = strconv.AppendBool(dst, *r.JumpForward)
	}
	return append(dst, '}')
}
