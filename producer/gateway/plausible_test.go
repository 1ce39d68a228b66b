package gateway

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/producertest"
)

// TestGatewayImplausibleTime posts the four implausible time cases (seconds,
// microseconds, the year 2100, int64 max), a segment ending past the window
// and a configured window, beside plausible events: each implausible one is
// refused in its per-event answer with implausible_time and its value, and
// its rejection record is on the rejected topic; only the plausible ones
// are on the events topic. The reference is the request's arrival from the
// gateway's injected clock.
func TestGatewayImplausibleTime(t *testing.T) {
	arrival := time.Date(2026, 1, 11, 3, 0, 0, 0, time.UTC)
	e := startGateway(t, Config{Now: func() time.Time { return arrival }},
		producer.Config{Validate: schemas.ValidateOptions{Window: schemas.TimeWindow{Back: 48 * time.Hour}}})
	at := arrival.UnixMilli()
	ev := func(id string, started, dur int64) string {
		return fmt.Sprintf(`{"event_id":%q,"mix_id":42,"started_at":%d,"offset_ms":0,"duration_ms":%d,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`, id, started, dur)
	}
	cases := []struct {
		id            string
		started, dur  int64
		field, detail string // "" field: accepted
	}{
		{"ok-now", at - 60_000, 60_000, "", ""},
		{"seconds", at / 1000, 1000, "started_at", fmt.Sprintf("started_at %d (", at/1000)},
		{"micros", at * 1000, 1000, "started_at", fmt.Sprintf("started_at %d (", at*1000)},
		{"year-2100", time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), 1000, "started_at", "started_at 4102444800000 (2100-01-01"},
		{"int64-max", math.MaxInt64, 1000, "started_at", "started_at 9223372036854775807 (out of range)"},
		{"ends-past-window", at, 25 * 3600_000, "duration_ms", "the segment's end"},
		{"3-days-back", at - 72*3600_000, 1000, "started_at", "48h0m0s before"}, // the configured window
		{"ok-47h-back", at - 47*3600_000, 1000, "", ""},
	}
	var body []string
	for _, c := range cases {
		body = append(body, ev(c.id, c.started, c.dur))
	}
	resp, b := e.post(t, "application/x-ndjson", []byte(strings.Join(body, "\n")), bearer...)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	var ir IngestResponse
	if err := json.Unmarshal(b, &ir); err != nil {
		t.Fatal(err)
	}
	var accepted, refused []string
	for i, c := range cases {
		a := ir.Events[i]
		if c.field == "" {
			if a.Status != producer.StatusAccepted {
				t.Errorf("%s: %+v, want accepted", c.id, a)
			}
			accepted = append(accepted, c.id)
			continue
		}
		refused = append(refused, c.id)
		if a.Status != producer.StatusRefused || len(a.Reasons) != 1 || a.Reasons[0].Reason != schemas.ReasonImplausibleTime ||
			a.Reasons[0].Field != c.field || !strings.Contains(a.Reasons[0].Detail, c.detail) {
			t.Errorf("%s: %+v, want refused implausible_time on %s with %q", c.id, a, c.field, c.detail)
		}
	}
	topics := e.k.Config.Topics()
	var onTopic []string
	for _, r := range producertest.ReadTopic(t, e.k, topics.Events, len(accepted)) {
		onTopic = append(onTopic, string(r.Key))
	}
	var rejected []string
	for _, r := range producertest.ReadTopic(t, e.k, topics.Rejected, len(refused)) {
		var rej schemas.Rejection
		if err := json.Unmarshal(r.Value, &rej); err != nil {
			t.Fatal(err)
		}
		if rej.Reason != schemas.ReasonImplausibleTime || rej.At != at {
			t.Errorf("rejection %+v: want reason implausible_time at the arrival %d", rej, at)
		}
		rejected = append(rejected, rej.EventID)
	}
	sort.Strings(onTopic)
	sort.Strings(accepted)
	sort.Strings(rejected)
	sort.Strings(refused)
	if fmt.Sprint(onTopic) != fmt.Sprint(accepted) || fmt.Sprint(rejected) != fmt.Sprint(refused) {
		t.Fatalf("events topic %v (want %v), rejected topic %v (want %v)", onTopic, accepted, rejected, refused)
	}
}
