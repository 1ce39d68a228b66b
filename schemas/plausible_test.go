package schemas

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"
)

func timeEvent(started, offset, dur int64) []byte {
	return fmt.Appendf(nil, `{"event_id":"t-1","mix_id":42,"started_at":%d,"offset_ms":%d,"duration_ms":%d,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`, started, offset, dur)
}

// TestImplausibleTime: the four implausible time cases (seconds, microseconds,
// the year 2100, int64 max) and the derived-time cases, around a fixed
// arrival, with the default and a configured window.
func TestImplausibleTime(t *testing.T) {
	arrival := time.Date(2026, 1, 11, 3, 0, 0, 0, time.UTC).UnixMilli() // 1768100400000
	def := ValidateOptions{ArrivalMS: arrival}
	day := int64(24 * time.Hour / time.Millisecond)
	for _, c := range []struct {
		name                 string
		started, offset, dur int64
		opts                 ValidateOptions
		field, detail        string // "" field: accepted
	}{
		{"milliseconds now", arrival - 60_000, 0, 60_000, def, "", ""},
		{"29 days back", arrival - 29*day, 0, 1000, def, "", ""},
		{"23 hours ahead, ending within", arrival + 23*3600_000, 0, 3600_000, def, "", ""},
		{"seconds", 1768100000, 0, 1000, def, "started_at", "started_at 1768100000 (1970-01-21T11:08:20.000Z) is not epoch milliseconds within 720h0m0s before and 24h0m0s after the event's arrival 2026-01-11T03:00:00.000Z (1765508400000–1768186800000); it looks like epoch seconds"},
		{"microseconds", 1768100000000000, 0, 1000, def, "started_at", "it looks like epoch microseconds"},
		{"nanoseconds", 1768100000000000000, 0, 1000, def, "started_at", "it looks like epoch nanoseconds"},
		{"year 2100", 4102444800000, 0, 1000, def, "started_at", "started_at 4102444800000 (2100-01-01T00:00:00.000Z)"},
		{"int64 max", math.MaxInt64, 0, 1, def, "started_at", "started_at 9223372036854775807 (out of range)"},
		{"31 days back", arrival - 31*day, 0, 1000, def, "started_at", "720h0m0s before"},
		{"2 days ahead", arrival + 2*day, 0, 1000, def, "started_at", "24h0m0s after"},
		{"segment ends past the window", arrival, 0, 2 * day, def, "duration_ms", "the segment's end, started_at 1768100400000 + duration_ms 172800000"},
		{"duration int64 max", arrival, 0, math.MaxInt64, def, "duration_ms", "9223372036854775807"},
		{"offset+duration overflow", arrival, math.MaxInt64, 10, def, "duration_ms", "overflows a 64-bit integer"},
		{"no arrival: int64 max + duration overflows", math.MaxInt64, 0, 1, ValidateOptions{}, "started_at", "overflows a 64-bit integer"},
		{"no arrival: seconds not checked", 1768100000, 0, 1000, ValidateOptions{}, "", ""},
		{"configured window: 2 h back refused", arrival - 2*3600_000, 0, 1000, ValidateOptions{ArrivalMS: arrival, Window: TimeWindow{Back: time.Hour, Ahead: time.Minute}}, "started_at", "1h0m0s before and 1m0s after"},
		{"configured window: 59 min back passes", arrival - 59*60_000, 0, 1000, ValidateOptions{ArrivalMS: arrival, Window: TimeWindow{Back: time.Hour}}, "", ""},
	} {
		ev, vs := ParseEvent(timeEvent(c.started, c.offset, c.dur), c.opts)
		if c.field == "" {
			if vs != nil || ev.StartedAt != c.started {
				t.Errorf("%s: %v, want accepted", c.name, vs)
			}
			continue
		}
		if len(vs) != 1 || vs[0].Reason != ReasonImplausibleTime || vs[0].Field != c.field || !strings.Contains(vs[0].Detail, c.detail) {
			t.Errorf("%s: %+v, want one implausible_time on %s containing %q", c.name, vs, c.field, c.detail)
		}
		// The slow path agrees.
		_, slow := parseEventSlow(timeEvent(c.started, c.offset, c.dur), c.opts)
		if fmt.Sprint(slow) != fmt.Sprint(vs) {
			t.Errorf("%s: slow path %v, fast %v", c.name, slow, vs)
		}
	}
}

func TestTimeWindowValidate(t *testing.T) {
	if err := (TimeWindow{Back: -1}).Validate(); err == nil || !strings.Contains(err.Error(), "--time-window-back") {
		t.Fatalf("negative window: %v", err)
	}
	if w := (TimeWindow{}).WithDefaults(); w.Back != 30*24*time.Hour || w.Ahead != 24*time.Hour {
		t.Fatalf("defaults %+v", w)
	}
}
