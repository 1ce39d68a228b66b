package partnerapi

import "time"

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

// ReportResult is the answer to one POST /partners/royalty-tracking that the
// API accepted with 200. Meta.ServedBy tells whether live service took it
// (delivered) or standby answered without forwarding it.
type ReportResult struct {
	Meta    Meta
	Message string        // the API's success word
	Latency time.Duration // from sending the request to reading the answer
}
