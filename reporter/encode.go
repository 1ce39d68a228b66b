package reporter

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"

	"github.com/playpipe/playpipe/schemas"
)

// appendDelivery appends the JSON of d to dst, byte for byte what
// encoding/json.Marshal(d) produces (same field order, omitempty rules and
// string escaping, HTML characters escaped), without reflection: one
// Delivery record per post is on the reporter's hot path.
func appendDelivery(dst []byte, d *schemas.Delivery) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(d.V), 10)
	dst = append(dst, `,"report_id":`...)
	dst = appendString(dst, d.ReportID)
	dst = append(dst, `,"event_id":`...)
	dst = appendString(dst, d.EventID)
	dst = append(dst, `,"outcome":`...)
	dst = appendString(dst, d.Outcome)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(d.Attempt), 10)
	dst = append(dst, `,"http_status":`...)
	dst = strconv.AppendInt(dst, int64(d.HTTPStatus), 10)
	if d.ServedBy != "" {
		dst = append(dst, `,"served_by":`...)
		dst = appendString(dst, d.ServedBy)
	}
	if d.Message != "" {
		dst = append(dst, `,"message":`...)
		dst = appendString(dst, d.Message)
	}
	if len(d.Fields) > 0 {
		dst = append(dst, `,"fields":[`...)
		for i, f := range d.Fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, f)
		}
		dst = append(dst, ']')
	}
	if d.Reason != "" {
		dst = append(dst, `,"retry_reason":`...)
		dst = appendString(dst, d.Reason)
	}
	dst = append(dst, `,"latency_us":`...)
	dst = strconv.AppendInt(dst, d.LatencyUS, 10)
	if d.TraceID != "" {
		dst = append(dst, `,"trace_id":`...)
		dst = appendString(dst, d.TraceID)
	}
	if d.Replay {
		dst = append(dst, `,"replay":true`...)
	}
	dst = append(dst, `,"at":`...)
	dst = strconv.AppendInt(dst, d.At, 10)
	return append(dst, '}')
}

// appendString appends s as a JSON string. Plain printable ASCII (the
// common case: ids, outcomes, reasons) is copied as is; anything else goes
// through encoding/json so the escaping is exactly its own.
func appendString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= utf8.RuneSelf || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			b, _ := json.Marshal(s) // a string always encodes
			return append(dst, b...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
