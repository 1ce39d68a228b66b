package reporter

import (
	"strconv"

	"github.com/playpipe/playpipe/internal/jsonenc"
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
	dst = jsonenc.AppendString(dst, d.ReportID)
	dst = append(dst, `,"event_id":`...)
	dst = jsonenc.AppendString(dst, d.EventID)
	dst = append(dst, `,"outcome":`...)
	dst = jsonenc.AppendString(dst, d.Outcome)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(d.Attempt), 10)
	dst = append(dst, `,"http_status":`...)
	dst = strconv.AppendInt(dst, int64(d.HTTPStatus), 10)
	if d.ServedBy != "" {
		dst = append(dst, `,"served_by":`...)
		dst = jsonenc.AppendString(dst, d.ServedBy)
	}
	if d.Partner != "" {
		dst = append(dst, `,"partner":`...)
		dst = jsonenc.AppendString(dst, d.Partner)
	}
	if d.Message != "" {
		dst = append(dst, `,"message":`...)
		dst = jsonenc.AppendString(dst, d.Message)
	}
	if len(d.Fields) > 0 {
		dst = append(dst, `,"fields":[`...)
		for i, f := range d.Fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = jsonenc.AppendString(dst, f)
		}
		dst = append(dst, ']')
	}
	if d.Reason != "" {
		dst = append(dst, `,"retry_reason":`...)
		dst = jsonenc.AppendString(dst, d.Reason)
	}
	dst = append(dst, `,"latency_us":`...)
	dst = strconv.AppendInt(dst, d.LatencyUS, 10)
	if d.TraceID != "" {
		dst = append(dst, `,"trace_id":`...)
		dst = jsonenc.AppendString(dst, d.TraceID)
	}
	if d.Replay {
		dst = append(dst, `,"replay":true`...)
	}
	if d.InDoubt {
		dst = append(dst, `,"in_doubt":true`...)
	}
	if d.ReplayID != "" {
		dst = append(dst, `,"replay_id":`...)
		dst = jsonenc.AppendString(dst, d.ReplayID)
	}
	if d.ReplayReason != "" {
		dst = append(dst, `,"replay_reason":`...)
		dst = jsonenc.AppendString(dst, d.ReplayReason)
	}
	dst = append(dst, `,"at":`...)
	dst = strconv.AppendInt(dst, d.At, 10)
	return append(dst, '}')
}
