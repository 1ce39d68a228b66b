package schemas

import (
	"fmt"
	"math"
	"time"
)

// ReasonImplausibleTime: started_at is not epoch milliseconds within the
// plausible window around the event's arrival (seconds, microseconds, the
// year 2100, 2^63−1 …), or the times derived from it (started_at +
// duration_ms, offset_ms + duration_ms) overflow or leave that window.
const ReasonImplausibleTime = "implausible_time"

// Defaults of TimeWindow: an event may have started up to 30 days before it
// arrived (a device offline for weeks) and up to 1 day after (clock skew).
const (
	DefaultTimeBack  = 30 * 24 * time.Hour
	DefaultTimeAhead = 24 * time.Hour
)

// TimeWindow is the plausible-time policy: started_at must lie in
// [arrival − Back, arrival + Ahead], and so must the segment's end
// (started_at + duration_ms), which bounds every derived playedat (the split
// rule: started_at + max(0, start_k − offset_ms) < started_at + duration_ms).
// Zero fields take DefaultTimeBack and DefaultTimeAhead.
type TimeWindow struct {
	Back, Ahead time.Duration
}

// WithDefaults returns w with zero fields set to the defaults.
func (w TimeWindow) WithDefaults() TimeWindow {
	if w.Back == 0 {
		w.Back = DefaultTimeBack
	}
	if w.Ahead == 0 {
		w.Ahead = DefaultTimeAhead
	}
	return w
}

// Validate refuses negative bounds; the error names the flags.
func (w TimeWindow) Validate() error {
	if w.Back < 0 || w.Ahead < 0 {
		return fmt.Errorf("schemas: the plausible-time window (--time-window-back %s, --time-window-ahead %s) must not be negative", w.Back, w.Ahead)
	}
	return nil
}

// checkTimes adds implausible_time violations for the segment's times:
// overflow of started_at + duration_ms or offset_ms + duration_ms always;
// the window around opts.ArrivalMS when it is set (> 0). Values it cannot
// read (absent or already refused) are skipped.
func (c *eventCheck) checkTimes(r *rawEvent, opts ValidateOptions) {
	startOK := r.StartedAt != nil && *r.StartedAt > 0
	durOK := r.DurationMS != nil && *r.DurationMS > 0
	offOK := r.OffsetMS != nil && *r.OffsetMS >= 0
	if offOK && durOK && *r.OffsetMS > math.MaxInt64-*r.DurationMS {
		c.add("duration_ms", ReasonImplausibleTime, fmt.Sprintf("offset_ms %d + duration_ms %d overflows a 64-bit integer", *r.OffsetMS, *r.DurationMS))
	}
	if !startOK {
		return
	}
	start := *r.StartedAt
	if opts.ArrivalMS > 0 {
		w := opts.Window.WithDefaults()
		lo := satSub(opts.ArrivalMS, w.Back.Milliseconds())
		hi := satAdd(opts.ArrivalMS, w.Ahead.Milliseconds())
		if start < lo || start > hi {
			c.add("started_at", ReasonImplausibleTime, fmt.Sprintf("started_at %d (%s) is not epoch milliseconds within %s before and %s after the event's arrival %s (%d–%d)%s",
				start, msTime(start), w.Back, w.Ahead, msTime(opts.ArrivalMS), lo, hi, unitHint(start, lo, hi)))
			return
		}
		if durOK {
			end := satAdd(start, *r.DurationMS)
			if end > hi {
				c.add("duration_ms", ReasonImplausibleTime, fmt.Sprintf("the segment's end, started_at %d + duration_ms %d = %d (%s), is more than %s after the event's arrival %s: its plays' playedat would leave the plausible window",
					start, *r.DurationMS, end, msTime(end), w.Ahead, msTime(opts.ArrivalMS)))
			}
		}
		return
	}
	if durOK && start > math.MaxInt64-*r.DurationMS {
		c.add("started_at", ReasonImplausibleTime, fmt.Sprintf("started_at %d + duration_ms %d overflows a 64-bit integer", start, *r.DurationMS))
	}
}

// unitHint says which unit v looks like when it is not milliseconds.
func unitHint(v, lo, hi int64) string {
	in := func(x int64) bool { return x >= lo && x <= hi }
	switch {
	case v < lo && v <= math.MaxInt64/1000 && in(v*1000):
		return "; it looks like epoch seconds: send milliseconds"
	case v > hi && in(v/1000):
		return "; it looks like epoch microseconds: send milliseconds"
	case v > hi && in(v/1_000_000):
		return "; it looks like epoch nanoseconds: send milliseconds"
	}
	return ""
}

// msTime formats epoch ms as an RFC 3339 UTC time, or "out of range".
func msTime(ms int64) string {
	if ms < -62135596800000 || ms > 253402300799999 { // years 1–9999
		return "out of range"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z")
}

func satAdd(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}

func satSub(a, b int64) int64 {
	if b == math.MinInt64 {
		return satAdd(satAdd(a, math.MaxInt64), 1)
	}
	return satAdd(a, -b)
}
