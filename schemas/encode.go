package schemas

import "strconv"

// The hand-written encoders of the records the hot paths write (the play
// report's own is AppendReportJSON, report.go).

// AppendTrackPlay appends the JSON encoding of p to dst and returns it. The
// bytes are identical to encoding/json's json.Marshal(p) (same field order,
// omitempty rules and string escaping, HTML characters included); the tests
// hold it to that. It allocates only when dst must grow. The enricher
// writes report ids in place with AppendTrackPlayWithID, so the binary
// never calls this one (deadcode lists it): it is the contract's encoder for
// other producers of track plays and the tests and benchmarks.
func AppendTrackPlay(dst []byte, p *TrackPlay) []byte {
	return AppendTrackPlayWithID(dst, p, p.ReportID)
}

// AppendTrackPlayWithID is AppendTrackPlay with reportID in place of
// p.ReportID (the consumer's hot path keeps the id in its byte arena
// instead of a string per play).
func AppendTrackPlayWithID[ID []byte | string](dst []byte, p *TrackPlay, reportID ID) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(p.V), 10)
	dst = append(dst, `,"report_id":`...)
	dst = appendJSONString(dst, reportID)
	dst = append(dst, `,"event_id":`...)
	dst = appendJSONString(dst, p.EventID)
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
	if p.EventAt != 0 {
		dst = append(dst, `,"event_at":`...)
		dst = strconv.AppendInt(dst, p.EventAt, 10)
	}
	dst = append(dst, `,"report":`...)
	dst = AppendReportJSON(dst, &p.Report)
	return append(dst, '}')
}

// AppendDelivery appends the JSON of d to dst, byte for byte what
// encoding/json.Marshal(d) produces (same field order, omitempty rules and
// string escaping, HTML characters escaped), without reflection: one
// Delivery record per post is on the reporter's hot path. It allocates only
// when dst must grow.
func AppendDelivery(dst []byte, d *Delivery) []byte {
	dst = append(dst, `{"v":`...)
	dst = strconv.AppendInt(dst, int64(d.V), 10)
	dst = append(dst, `,"report_id":`...)
	dst = appendJSONString(dst, d.ReportID)
	dst = append(dst, `,"event_id":`...)
	dst = appendJSONString(dst, d.EventID)
	dst = append(dst, `,"outcome":`...)
	dst = appendJSONString(dst, d.Outcome)
	dst = append(dst, `,"attempt":`...)
	dst = strconv.AppendInt(dst, int64(d.Attempt), 10)
	dst = append(dst, `,"http_status":`...)
	dst = strconv.AppendInt(dst, int64(d.HTTPStatus), 10)
	if d.ServedBy != "" {
		dst = append(dst, `,"served_by":`...)
		dst = appendJSONString(dst, d.ServedBy)
	}
	if d.Partner != "" {
		dst = append(dst, `,"partner":`...)
		dst = appendJSONString(dst, d.Partner)
	}
	if d.Message != "" {
		dst = append(dst, `,"message":`...)
		dst = appendJSONString(dst, d.Message)
	}
	if len(d.Fields) > 0 {
		dst = append(dst, `,"fields":[`...)
		for i, f := range d.Fields {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, f)
		}
		dst = append(dst, ']')
	}
	if d.Reason != "" {
		dst = append(dst, `,"retry_reason":`...)
		dst = appendJSONString(dst, d.Reason)
	}
	dst = append(dst, `,"latency_us":`...)
	dst = strconv.AppendInt(dst, d.LatencyUS, 10)
	if d.TraceID != "" {
		dst = append(dst, `,"trace_id":`...)
		dst = appendJSONString(dst, d.TraceID)
	}
	if d.Replay {
		dst = append(dst, `,"replay":true`...)
	}
	if d.InDoubt {
		dst = append(dst, `,"in_doubt":true`...)
	}
	if d.DoubtCause != "" {
		dst = append(dst, `,"doubt_cause":`...)
		dst = appendJSONString(dst, d.DoubtCause)
	}
	if d.ReplayID != "" {
		dst = append(dst, `,"replay_id":`...)
		dst = appendJSONString(dst, d.ReplayID)
	}
	if d.ReplayReason != "" {
		dst = append(dst, `,"replay_reason":`...)
		dst = appendJSONString(dst, d.ReplayReason)
	}
	dst = append(dst, `,"at":`...)
	dst = strconv.AppendInt(dst, d.At, 10)
	return append(dst, '}')
}
