package partnerapi

import "time"

// ReportResult is the answer to one POST /partners/royalty-tracking that the
// API accepted with 200. Meta.ServedBy tells whether live service took it
// (delivered) or standby answered without forwarding it.
type ReportResult struct {
	Meta    Meta
	Message string        // the API's success word
	Latency time.Duration // from sending the request to reading the answer
}
