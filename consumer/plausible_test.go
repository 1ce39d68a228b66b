package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestImplausibleTimeOverKafka: the four time cases (seconds, microseconds,
// the year 2100, int64 max) and a segment ending past the window are
// rejected implausible_time with the value, judged against each record's
// timestamp — so a backlog event that arrived 40 days ago with a started_at
// of then still yields its plays, read today — and a configured window
// (--time-window-back 1h) applies.
func TestImplausibleTimeOverKafka(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 2)
	mixes := fakeMixes()
	mix := mixes[0]
	now := time.Now()
	old := now.Add(-40 * 24 * time.Hour)
	ev := func(id string, started, dur int64) []byte {
		return fmt.Appendf(nil, `{"event_id":%q,"mix_id":%d,"started_at":%d,"offset_ms":0,"duration_ms":%d,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`,
			id, mix.ID, started, dur)
	}
	cases := []struct {
		id           string
		started, dur int64
		arrival      time.Time
		want         string // "" plays; else the detail contains it
	}{
		{"ok", now.Add(-5 * time.Minute).UnixMilli(), 60_000, now, ""},
		{"backlog-40-days", old.UnixMilli() - 60_000, 60_000, old, ""},
		{"seconds", now.Unix(), 60_000, now, fmt.Sprintf("started_at %d (1970", now.Unix())},
		{"micros", now.UnixMicro(), 60_000, now, "looks like epoch microseconds"},
		{"year2100", time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), 60_000, now, "started_at 4102444800000 (2100-01-01"},
		{"int64max", math.MaxInt64, 60_000, now, "started_at 9223372036854775807"},
		{"ends-2-days-ahead", now.UnixMilli(), 2 * 24 * 3600_000, now, "the segment's end"},
		{"2h-back-window-1h", now.Add(-2 * time.Hour).UnixMilli(), 60_000, now, "1h0m0s before"},
	}
	var recs []*kgo.Record
	for _, c := range cases {
		recs = append(recs, &kgo.Record{Topic: k.Config.Topics().Events, Key: []byte(c.id), Value: ev(c.id, c.started, c.dur), Timestamp: c.arrival})
	}
	if err := k.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e := newTestEnricher(t, k, newFakeSource(mixes...), func(o *Config) {
		o.Events.Window = schemas.TimeWindow{Back: time.Hour} // ahead: the default day
	})
	// The backlog event is older than the 1 h window relative to now, but
	// plausible relative to its own arrival 40 days ago.
	stop := runEnricher(t, e)
	waitFor(t, 30*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(cases)) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rejected, tps := readOutcomes(t, k)
	plays := map[string]int{}
	for _, tp := range tps {
		plays[tp.EventID]++
	}
	for _, c := range cases {
		rj, isRej := rejected[c.id]
		switch {
		case c.want == "" && (isRej || plays[c.id] == 0):
			t.Errorf("%s: rejected %+v, %d plays; want plays", c.id, rj, plays[c.id])
		case c.want != "" && (!isRej || plays[c.id] != 0 || rj.Reason != schemas.ReasonImplausibleTime || !strings.Contains(rj.Violations[0].Detail, c.want)):
			t.Errorf("%s: rejection %+v, %d plays; want implausible_time with %q and no play", c.id, rj, plays[c.id], c.want)
		}
	}
	if len(rejected) != 6 {
		t.Errorf("%d rejections, want 6", len(rejected))
	}
}

// TestImplausibleTimeFutureRecord: the window is bounded by the consumer's
// own clock (Config.Now, injected), not only by the record's timestamp,
// which the producer sets. A record stamped 2100 carrying started_at 2100
// was delivered with playedat 4102444800000; it is rejected
// implausible_time. A record stamped a little ahead (clock skew) with a
// started_at within a day of the clock still yields its plays.
func TestImplausibleTimeFutureRecord(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 2)
	mixes := fakeMixes()
	mix := mixes[0]
	clock := time.Now().Add(-3 * time.Hour).Truncate(time.Millisecond) // the consumer's clock, not the machine's
	y2100 := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC)
	ev := func(id string, started int64) []byte {
		return fmt.Appendf(nil, `{"event_id":%q,"mix_id":%d,"started_at":%d,"offset_ms":0,"duration_ms":60000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`,
			id, mix.ID, started)
	}
	cases := []struct {
		id      string
		started time.Time
		stamp   time.Time
		want    string // "" plays; else the rejection's detail contains it
	}{
		{"stamped-2100", y2100, y2100, "started_at 4102444800000 (2100-01-01"},
		{"stamped-2h-ahead-started-2h-ahead", clock.Add(2 * time.Hour), clock.Add(2 * time.Hour), ""},
		{"stamped-3d-ahead-started-2d-ahead", clock.Add(48 * time.Hour), clock.Add(72 * time.Hour), "started_at"},
		{"now", clock.Add(-time.Minute), clock, ""},
	}
	var recs []*kgo.Record
	for _, c := range cases {
		recs = append(recs, &kgo.Record{Topic: k.Config.Topics().Events, Key: []byte(c.id), Value: ev(c.id, c.started.UnixMilli()), Timestamp: c.stamp})
	}
	if err := k.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e := newTestEnricher(t, k, newFakeSource(mixes...), func(o *Config) {
		o.Now = func() time.Time { return clock }
	})
	stop := runEnricher(t, e)
	waitFor(t, 30*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(cases)) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	rejected, tps := readOutcomes(t, k)
	plays := map[string]int{}
	for _, tp := range tps {
		plays[tp.EventID]++
		if tp.Report.PlayedAt > clock.Add(schemas.DefaultTimeAhead).UnixMilli() {
			t.Errorf("%s: playedat %d is more than a day after the consumer's clock", tp.EventID, tp.Report.PlayedAt)
		}
	}
	for _, c := range cases {
		rj, isRej := rejected[c.id]
		switch {
		case c.want == "" && (isRej || plays[c.id] == 0):
			t.Errorf("%s: rejected %+v, %d plays; want plays", c.id, rj, plays[c.id])
		case c.want != "" && (!isRej || plays[c.id] != 0 || rj.Reason != schemas.ReasonImplausibleTime || !strings.Contains(rj.Violations[0].Detail, c.want)):
			t.Errorf("%s: rejection %+v, %d plays; want implausible_time with %q and no play", c.id, rj, plays[c.id], c.want)
		}
	}
}

// readOutcomes reads what the enricher wrote: the rejections by event id
// and the track plays.
func readOutcomes(t *testing.T, k *testenv.Kafka) (map[string]schemas.Rejection, []schemas.TrackPlay) {
	t.Helper()
	rejected := map[string]schemas.Rejection{}
	for _, r := range k.ReadAll(t, k.Config.Topics().Rejected) {
		var rj schemas.Rejection
		if err := json.Unmarshal(r.Value, &rj); err != nil {
			t.Fatal(err)
		}
		rejected[rj.EventID] = rj
	}
	var plays []schemas.TrackPlay
	for _, r := range k.ReadAll(t, k.Config.Topics().Reports) {
		var tp schemas.TrackPlay
		if err := json.Unmarshal(r.Value, &tp); err != nil {
			t.Fatal(err)
		}
		plays = append(plays, tp)
	}
	return rejected, plays
}
