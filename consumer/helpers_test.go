package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// refMix is the test's own view of a mix: what the reference computation
// needs, taken from the catalog (not from the enricher's code).
type refMix struct {
	id       int64
	title    string
	lengthMS int64
	tracks   []refTrack // listing order as served
}

type refTrack struct {
	id      int64
	isrc    string
	startMS int64
}

func refFromMix(m partnerapi.Mix) refMix {
	r := refMix{id: m.ID, title: m.Title, lengthMS: hmsMS(m.Length)}
	for _, t := range m.Tracks {
		r.tracks = append(r.tracks, refTrack{id: t.ID, isrc: t.ISRC, startMS: hmsMS(t.Time)})
	}
	return r
}

// hmsMS parses H:MM:SS independently of partnerapi.ParseHMS.
func hmsMS(s string) int64 {
	var h, m, sec int64
	if _, err := fmt.Sscanf(s, "%d:%d:%d", &h, &m, &sec); err != nil {
		panic("test listing time " + s)
	}
	return ((h*60+m)*60 + sec) * 1000
}

// refPlay is one expected track play.
type refPlay struct {
	ReportID   string
	TrackID    int64
	ISRC       string
	PlayedAt   int64
	PlayLength int64
	Overlap    int64
	Below      bool
	Cached     *bool
	Jump       *bool
	End        *int64
}

// expectPlays is the reference split, written differently from Split: the
// end of track k is the earliest start of another track that starts later,
// or at the same time but later in the listing; else the mix length.
func expectPlays(m refMix, ev map[string]any) []refPlay {
	eventID := ev["event_id"].(string)
	offset := toInt(ev["offset_ms"])
	segEnd := min(offset+toInt(ev["duration_ms"]), m.lengthMS)
	started := toInt(ev["started_at"])
	type span struct {
		pos        int
		start, end int64
	}
	var spans []span
	for k, t := range m.tracks {
		end := m.lengthMS
		for j, u := range m.tracks {
			if (u.startMS > t.startMS || (u.startMS == t.startMS && j > k)) && u.startMS < end {
				end = u.startMS
			}
		}
		if end < t.startMS {
			end = t.startMS
		}
		spans = append(spans, span{k, t.startMS, end})
	}
	sort.Slice(spans, func(a, b int) bool {
		if spans[a].start != spans[b].start {
			return spans[a].start < spans[b].start
		}
		return spans[a].pos < spans[b].pos
	})
	var out []refPlay
	for _, s := range spans {
		lo, hi := max(offset, s.start), min(segEnd, s.end)
		if hi <= lo {
			continue
		}
		t := m.tracks[s.pos]
		p := refPlay{ReportID: schemas.ReportID(eventID, s.pos), TrackID: t.id, ISRC: t.isrc,
			PlayedAt: started + max(0, s.start-offset), PlayLength: (hi - lo) / 1000, Overlap: hi - lo, Below: hi-lo < 1000}
		if v, ok := ev["cached"].(bool); ok {
			p.Cached = &v
		}
		out = append(out, p)
	}
	if len(out) > 0 {
		if v, ok := ev["jump_forward"].(bool); ok {
			out[0].Jump = &v
		}
		if _, ok := ev["end_reason"]; ok {
			v := toInt(ev["end_reason"])
			out[len(out)-1].End = &v
		}
	}
	return out
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case int:
		return int64(x)
	case float64:
		return int64(x)
	}
	panic(fmt.Sprintf("not an int: %T", v))
}

// genEvent is one published event and what the test expects of it.
type genEvent struct {
	key, value []byte
	eventID    string
	fields     map[string]any // nil for a malformed one
	mix        *refMix        // nil when rejected before the split
	wantReason string         // "" when it should yield plays
}

// genEvents makes n events over mixes: mostly valid ones (segments inside,
// across and past the end of tracks, with and without the optional fields),
// and about 6 in 16 bad ones of six kinds (malformed JSON, missing field,
// bad country, missing user_id, unknown mix) and valid ones past the mix end (no play), each
// with its expected reason.
func genEvents(seed uint64, n int, mixes []refMix, unknownMixID int64) []genEvent {
	rng := rand.New(rand.NewPCG(seed, 7))
	countries := []string{"DE", "us", "GB", "fr", "JP"}
	out := make([]genEvent, 0, n)
	for i := 0; i < n; i++ {
		m := &mixes[rng.IntN(len(mixes))]
		id := fmt.Sprintf("ev-%d-%06d", seed, i)
		ev := map[string]any{
			"event_id": id, "mix_id": m.id, "started_at": int64(1_700_000_000_000) + int64(i)*997,
			"offset_ms": rng.Int64N(max(m.lengthMS, 1)), "duration_ms": 1 + rng.Int64N(900_000),
			"user_id": "user-" + strconv.Itoa(rng.IntN(500)), "country": countries[rng.IntN(len(countries))],
			"os": "Android 14", "device": "watch", "vendor": int64(3),
		}
		if rng.IntN(10) == 0 {
			ev["duration_ms"] = 1 + rng.Int64N(1500) // under or around the minimum
		}
		if rng.IntN(2) == 0 {
			ev["cached"] = rng.IntN(2) == 0
		}
		if rng.IntN(3) == 0 {
			ev["jump_forward"] = rng.IntN(2) == 0
		}
		if rng.IntN(3) == 0 {
			ev["end_reason"] = rng.Int64N(3)
		}
		if rng.IntN(4) == 0 {
			ev["source_stream"] = "radio"
		}
		g := genEvent{key: []byte(id), eventID: id, fields: ev, mix: m}
		switch rng.IntN(16) {
		case 0:
			g.value = []byte(`{"event_id":"` + id + `","mix_id":` + strconv.FormatInt(m.id, 10) + `,"started_at":17`)
			g.fields, g.mix, g.wantReason = nil, nil, schemas.ReasonMalformedJSON
		case 1:
			delete(ev, "country")
			g.mix, g.wantReason = nil, schemas.ReasonMissingField
		case 2:
			ev["country"] = "DEU"
			g.mix, g.wantReason = nil, schemas.ReasonBadCountry
		case 3:
			delete(ev, "user_id")
			g.mix, g.wantReason = nil, schemas.ReasonMissingUserID
		case 4:
			ev["mix_id"] = unknownMixID
			g.mix, g.wantReason = nil, schemas.ReasonUnknownMix
		case 5:
			// Valid, zero plays (the split rule of docs/design.md): no report, no rejection.
			ev["offset_ms"] = m.lengthMS + rng.Int64N(10_000)
		}
		if g.value == nil {
			b, err := json.Marshal(ev)
			if err != nil {
				panic(err)
			}
			g.value = b
		}
		out = append(out, g)
	}
	return out
}

// testArrival is the record timestamp a test gives an event: a second after
// its segment ended (the fleet sends it then), so that the fixed started_at
// of the generated events is plausible; 2023-11-14 for bytes without one.
func testArrival(value []byte) time.Time {
	var f struct {
		StartedAt  *int64 `json:"started_at"`
		DurationMS int64  `json:"duration_ms"`
	}
	if json.Unmarshal(value, &f) == nil && f.StartedAt != nil && *f.StartedAt > 0 && *f.StartedAt < 1<<50 && f.DurationMS >= 0 && f.DurationMS < 1<<40 {
		return time.UnixMilli(*f.StartedAt + f.DurationMS + 1000)
	}
	return time.UnixMilli(1_700_000_000_000)
}

// publish writes the events to topic (timestamps from testArrival) and
// waits for the acks.
func publish(t testing.TB, k *testenv.Kafka, topic string, evs []genEvent) {
	t.Helper()
	cl := k.Client(t, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(0))
	recs := make([]*kgo.Record, len(evs))
	for i, e := range evs {
		recs[i] = &kgo.Record{Key: e.key, Value: e.value, Timestamp: testArrival(e.value)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// checkOutput compares the committed contents of the reports and rejected
// topics with the reference: the same report ids exactly once each, with
// the expected fields, and every bad event rejected once with its reason.
func checkOutput(t *testing.T, k *testenv.Kafka, evs []genEvent) {
	t.Helper()
	want := map[string]refPlay{}
	wantRej := map[string]string{}
	for _, e := range evs {
		if e.wantReason != "" {
			wantRej[e.eventID] = e.wantReason
			continue
		}
		for _, p := range expectPlays(*e.mix, e.fields) {
			want[p.ReportID] = p
		}
	}
	topics := k.Config.Topics()
	reports := k.ReadAll(t, topics.Reports)
	rejected := k.ReadAll(t, topics.Rejected)

	got := map[string]int{}
	bad := 0
	for _, r := range reports {
		var tp schemas.TrackPlay
		if err := json.Unmarshal(r.Value, &tp); err != nil {
			t.Fatalf("report not JSON: %v: %s", err, r.Value)
		}
		got[tp.ReportID]++
		if string(r.Key) != tp.ReportID {
			t.Errorf("report key %q != report_id %q", r.Key, tp.ReportID)
		}
		w, ok := want[tp.ReportID]
		if !ok {
			t.Errorf("unexpected report %s", r.Value)
			bad++
			continue
		}
		rp := tp.Report
		if rp.TrackID != w.TrackID || rp.ISRC != w.ISRC || rp.PlayedAt != w.PlayedAt || rp.PlayLength != w.PlayLength ||
			tp.OverlapMS != w.Overlap || tp.BelowMinimum != w.Below || !eqPtr(rp.CachedPlay, w.Cached) ||
			!eqPtr(rp.JumpForward, w.Jump) || !eqPtr(rp.EndReason, w.End) {
			bad++
			if bad < 10 {
				t.Errorf("report %s differs:\n got %s\nwant %+v", tp.ReportID, r.Value, w)
			}
		}
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("report %s present %d times", id, n)
		}
	}
	missing := 0
	for id := range want {
		if got[id] == 0 {
			missing++
			if missing < 5 {
				t.Errorf("report %s missing (%+v)", id, want[id])
			}
		}
	}
	gotRej := map[string]int{}
	for _, r := range rejected {
		var rj schemas.Rejection
		if err := json.Unmarshal(r.Value, &rj); err != nil {
			t.Fatalf("rejection not JSON: %v", err)
		}
		id := string(r.Key) // the generator keys events by event id
		gotRej[id]++
		if w, ok := wantRej[id]; !ok {
			t.Errorf("unexpected rejection %s", r.Value)
		} else if rj.Reason != w {
			t.Errorf("rejection of %s: reason %s, want %s (%v)", id, rj.Reason, w, rj.Violations)
		}
		if rj.Raw == "" || (rj.EventID != id && rj.Reason != schemas.ReasonMalformedJSON && rj.Reason != schemas.ReasonKeyCase) {
			t.Errorf("rejection without raw bytes or event id: %s", r.Value)
		}
	}
	for id := range wantRej {
		if gotRej[id] != 1 {
			t.Errorf("bad event %s rejected %d times, want once", id, gotRej[id])
		}
	}
	t.Logf("%d events: %d reports (want %d, %d missing, %d differing), %d rejections (want %d)",
		len(evs), len(reports), len(want), missing, bad, len(rejected), len(wantRej))
}

func eqPtr[T comparable](a, b *T) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return *a == *b
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
