package simulator

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/producertest"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// testMixes is a small catalog: three mixes of 30–60 minutes.
var testMixes = []MixInfo{
	{ID: 101, LengthMS: 1_800_000, TrackStartsMS: []int64{0, 240_000, 500_000, 800_000, 1_200_000, 1_500_000}},
	{ID: 102, LengthMS: 3_600_000, TrackStartsMS: []int64{0, 300_000, 600_000, 1_800_000, 3_000_000}},
	{ID: 205, LengthMS: 2_700_000, TrackStartsMS: []int64{900_000, 0, 1_800_000}}, // unsorted listing
}

func generate(t *testing.T, cfg Config) []Message {
	t.Helper()
	g, err := NewGenerator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []Message
	for {
		m, ok := g.Next()
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

func TestSimGeneratorDeterministic(t *testing.T) {
	cfg := Config{Mixes: testMixes, Events: 2000, Devices: 50, BadShare: 0.2, Seed: 7}
	a, b := generate(t, cfg), generate(t, cfg)
	if len(a) != 2000 || !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave different messages")
	}
	cfg.Seed = 8
	if c := generate(t, cfg); reflect.DeepEqual(a, c) {
		t.Fatal("different seeds gave the same messages")
	}
}

// TestSimGeneratorRealism checks the messages of a long run: every kind is
// what it claims to be, the bad share is respected, and listening looks
// natural (segments inside the mix, continuity across pauses, every end
// reason, jumps, cached plays, many devices and countries).
func TestSimGeneratorRealism(t *testing.T) {
	const n = 12000
	msgs := generate(t, Config{Mixes: testMixes, Events: n, Devices: 300, BadShare: 0.12, Seed: 42})
	catalog := map[int64]MixInfo{}
	for _, m := range testMixes {
		catalog[m.ID] = m
	}
	byKind := map[string]int{}
	endReasons := map[int64]int{}
	countries, devices, users := map[string]bool{}, map[string]bool{}, map[string]bool{}
	var cachedTrue, jumpTrue, noEndReason, underASecond int
	type last struct {
		ev  schemas.PlayerEvent
		seq int
	}
	prev := map[string]last{} // the device's previous valid segment
	continuity := 0
	for _, m := range msgs {
		byKind[m.Kind]++
		ev, vs := schemas.ParseEvent(m.Value, schemas.ValidateOptions{})
		switch m.Kind {
		case KindValid, KindUnknownMix:
			if vs != nil {
				t.Fatalf("%s message refused: %v\n%s", m.Kind, vs, m.Value)
			}
			if string(m.Key) != ev.EventID {
				t.Fatalf("key %q is not the event_id %q", m.Key, ev.EventID)
			}
			mix, known := catalog[ev.MixID]
			if known != (m.Kind == KindValid) {
				t.Fatalf("%s message with mix %d (in catalog: %v)", m.Kind, ev.MixID, known)
			}
			if m.Kind == KindUnknownMix {
				continue
			}
			if ev.OffsetMS >= mix.LengthMS || ev.OffsetMS+ev.DurationMS > mix.LengthMS {
				t.Fatalf("segment [%d, +%d) outside mix %d of %d ms", ev.OffsetMS, ev.DurationMS, mix.ID, mix.LengthMS)
			}
			countries[ev.Country], users[ev.UserID] = true, true
			dev := ev.EventID[:len("sim42-dev-00000")]
			var seq int
			if _, err := fmt.Sscanf(ev.EventID[len(dev):], "-%d", &seq); err != nil {
				t.Fatalf("event id %s: %v", ev.EventID, err)
			}
			devices[dev] = true
			if ev.EndReason != nil {
				endReasons[*ev.EndReason]++
			} else {
				noEndReason++
			}
			if ev.Cached != nil && *ev.Cached {
				cachedTrue++
			}
			if ev.JumpForward != nil && *ev.JumpForward {
				jumpTrue++
			}
			if ev.DurationMS < 1000 {
				underASecond++
			}
			// After a pause (and no lost segment in between) playback resumes where it stopped.
			if p, ok := prev[dev]; ok && p.seq == seq-1 && p.ev.EndReason != nil && *p.ev.EndReason == EndPause {
				if ev.MixID != p.ev.MixID || ev.OffsetMS != p.ev.OffsetMS+p.ev.DurationMS || ev.StartedAt < p.ev.StartedAt+p.ev.DurationMS {
					t.Fatalf("after a pause %+v the device went on with %+v", p.ev, ev)
				}
				continuity++
			}
			prev[dev] = last{ev, seq}
		default:
			if vs == nil {
				t.Fatalf("%s message accepted: %s", m.Kind, m.Value)
			}
			want := map[string]string{KindMalformedJSON: schemas.ReasonMalformedJSON, KindMissingField: schemas.ReasonMissingField, KindBadCountry: schemas.ReasonBadCountry}[m.Kind]
			if len(vs) != 1 || vs[0].Reason != want {
				t.Fatalf("%s message: violations %v, want exactly one %s\n%s", m.Kind, vs, want, m.Value)
			}
		}
	}
	bad := n - byKind[KindValid]
	if share := float64(bad) / n; math.Abs(share-0.12) > 0.01 {
		t.Errorf("bad share %.4f, want 0.12 ± 0.01", share)
	}
	for _, k := range Kinds[1:] {
		if q := float64(byKind[k]) / float64(bad); q < 0.2 || q > 0.3 {
			t.Errorf("%s is %.2f of the bad messages, want about a quarter", k, q)
		}
	}
	for _, r := range []int64{EndFinished, EndSeek, EndPause, EndStop, EndSkip} {
		if endReasons[r] < n/100 {
			t.Errorf("end_reason %d seen %d times", r, endReasons[r])
		}
	}
	if len(countries) < 10 || len(devices) < 290 || len(users) < 150 || cachedTrue < n/50 || jumpTrue < n/50 ||
		noEndReason < n/100 || underASecond < n/200 || continuity < n/20 {
		t.Errorf("not natural enough: %d countries, %d devices, %d users, %d cached, %d jumps, %d without end_reason, %d under 1 s, %d resumes after pause",
			len(countries), len(devices), len(users), cachedTrue, jumpTrue, noEndReason, underASecond, continuity)
	}
	t.Logf("kinds %v, end reasons %v, %d countries, %d devices, %d cached, %d jumps", byKind, endReasons, len(countries), len(devices), cachedTrue, jumpTrue)
}

// TestSimulateThroughKafka publishes with kafka-go and reads back with
// franz-go: the topic holds exactly the messages the run printed and
// recorded, keyed on the partitions franz-go's own partitioner would choose.
func TestSimulateThroughKafka(t *testing.T) {
	k := testenv.StartKafka(t, 4)
	var rec bytes.Buffer
	cfg := Config{Kafka: k.Config, Mixes: testMixes, Events: 3000, Devices: 80, BadShare: 0.1, Seed: 3, Record: &rec, BatchSize: 400,
		TracerProvider: producertest.TracerProvider}
	stats, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, n := range stats.ByKind {
		sum += n
	}
	if stats.Sent != 3000 || sum != 3000 || stats.ByKind[KindValid] < 2600 || stats.ByKind[KindValid] > 2800 {
		t.Fatalf("stats %v", stats)
	}
	t.Log(stats)

	recs := producertest.ReadTopic(t, k, k.Config.Topics().Events, stats.Sent)
	if len(recs) != stats.Sent {
		t.Fatalf("topic holds %d records, the simulator says it sent %d", len(recs), stats.Sent)
	}
	// What the run recorded, and what it would generate again for the seed.
	want := generate(t, cfg)
	var recorded []Message
	sc := bufio.NewScanner(&rec)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var r simRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		recorded = append(recorded, Message{Kind: r.Kind, Key: []byte(r.Key), Value: []byte(r.Value)})
	}
	if !reflect.DeepEqual(recorded, want) {
		t.Fatalf("the record file (%d lines) is not the generated sequence (%d)", len(recorded), len(want))
	}
	onTopic := make([]string, 0, len(recs))
	part := kgo.StickyKeyPartitioner(nil).ForTopic(k.Config.Topics().Events)
	valid := 0
	for _, r := range recs {
		onTopic = append(onTopic, string(r.Key)+"\x00"+string(r.Value))
		if p := part.Partition(r, 4); p != int(r.Partition) {
			t.Fatalf("key %s on partition %d, franz-go would choose %d", r.Key, r.Partition, p)
		}
		if _, vs := schemas.ParseEvent(r.Value, schemas.ValidateOptions{}); vs == nil {
			valid++
		}
		if sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), r)); !sc.IsValid() {
			t.Fatalf("record %s has no trace context in its headers: %v", r.Key, r.Headers)
		}
	}
	var sent []string
	for _, m := range want {
		sent = append(sent, string(m.Key)+"\x00"+string(m.Value))
	}
	sort.Strings(onTopic)
	sort.Strings(sent)
	if !reflect.DeepEqual(onTopic, sent) {
		t.Fatal("the topic does not hold exactly the sent messages")
	}
	if wantValid := stats.ByKind[KindValid] + stats.ByKind[KindUnknownMix]; valid != wantValid {
		t.Errorf("%d records pass ParseEvent, want %d (valid + unknown_mix)", valid, wantValid)
	}
}

func TestSimulateRateAndCancel(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	start := time.Now()
	stats, err := Run(context.Background(), Config{Kafka: k.Config, Mixes: testMixes, Events: 600, Rate: 3000})
	if err != nil || stats.Sent != 600 {
		t.Fatalf("%v %v", err, stats)
	}
	// 150 events of burst, then 450 at 3000/s: at least 0.15 s (a bound, not a speed figure).
	if el := time.Since(start); el < 120*time.Millisecond {
		t.Errorf("600 events at --rate 3000 took %s: the rate is not applied", el)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	stats, err = Run(ctx, Config{Kafka: k.Config, Mixes: testMixes, Events: 1_000_000, Rate: 1000})
	if err == nil || stats.Sent >= 1_000_000 || stats.Sent == 0 {
		t.Fatalf("cancelled run: %v %v", err, stats)
	}
}

func TestSimConfigValidation(t *testing.T) {
	for name, cfg := range map[string]Config{
		"Mixes":        {Events: 1},
		"--events":     {Mixes: testMixes},
		"--bad-share":  {Mixes: testMixes, Events: 1, BadShare: 1.5},
		"--rate":       {Mixes: testMixes, Events: 1, Rate: -1},
		"at least 1 s": {Mixes: []MixInfo{{ID: 1, LengthMS: 10}}, Events: 1},
	} {
		if _, err := NewGenerator(cfg); err == nil || !bytes.Contains([]byte(err.Error()), []byte(name)) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := Run(context.Background(), Config{Mixes: testMixes, Events: 1}); err == nil {
		t.Error("no brokers accepted")
	}
}

// TestCatalogFromAPI walks the real sandbox through the partner API client
// and compares with the sandbox's own catalog.
func TestCatalogFromAPI(t *testing.T) {
	sb := testenv.StartSandbox(t)
	api, err := partnerapi.New(partnerapi.Config{BaseURL: sb.URL,
		Credentials: partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature}})
	if err != nil {
		t.Fatal(err)
	}
	defer api.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := CatalogFromAPI(ctx, api, 0)
	if err != nil {
		t.Fatal(err)
	}
	// The walk finds every mix that a list serves (a list may serve fewer
	// mixes than its page advertises; mixes in no list are not discoverable).
	listed := map[int64]bool{}
	for _, p := range sb.Catalog().Pages {
		for _, l := range p.Lists {
			for _, id := range l.MixIDs {
				listed[id] = true
			}
		}
	}
	want := map[int64]MixInfo{}
	for _, m := range sb.Catalog().Mixes {
		if !listed[m.ID] {
			continue
		}
		mi := MixInfo{ID: m.ID, LengthMS: int64(m.LengthSec) * 1000}
		for _, tr := range m.Tracks {
			mi.TrackStartsMS = append(mi.TrackStartsMS, int64(tr.StartSec)*1000)
		}
		want[m.ID] = mi
	}
	if len(got) != len(want) {
		t.Fatalf("walk found %d mixes, the sandbox has %d", len(got), len(want))
	}
	for _, m := range got {
		if !reflect.DeepEqual(m, want[m.ID]) {
			t.Fatalf("mix %d: walk %+v, sandbox %+v", m.ID, m, want[m.ID])
		}
	}
	if few, err := CatalogFromAPI(ctx, api, 3); err != nil || len(few) != 3 {
		t.Fatalf("maxMixes 3: %d %v", len(few), err)
	}
}

// TestSimHeldToTheClock: a simulated fleet's event times stay inside the
// window the consumer checks however long it runs. With an
// injected clock, no sleeping: 10 devices at 300 events/s would listen
// ~1.5 simulated days a minute, 60 000 events (200 s at 300/s) put the
// last ones weeks in the future; and a slow run (an event an hour) of
// 2 000 events lets the clocks fall more than 30 days behind. Every valid
// event must end by the clock and pass the consumer's plausible-time check
// against it.
func TestSimHeldToTheClock(t *testing.T) {
	for _, c := range []struct {
		name   string
		events int
		step   time.Duration // the clock's advance per event
	}{
		{"300/s", 60_000, time.Second / 300},
		{"one an hour", 2_000, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
			g, err := NewGenerator(Config{Mixes: testMixes, Events: c.events, Devices: 10, Seed: 3, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			bad, repeats := 0, 0
			anchors := map[string]string{} // user, mix, start − offset → the event that played it
			for {
				m, ok := g.Next()
				if !ok {
					break
				}
				if m.Kind == KindValid {
					var ev schemas.PlayerEvent
					if err := json.Unmarshal(m.Value, &ev); err != nil {
						t.Fatal(err)
					}
					// Held segments end at the clock: none may repeat an
					// earlier one's plays (one mix from one anchor).
					a := fmt.Sprintf("%s/%d/%d", ev.UserID, ev.MixID, ev.StartedAt-ev.OffsetMS)
					if first, ok := anchors[a]; ok && repeats < 3 {
						repeats++
						t.Errorf("event %s plays mix %d from the same instant as %s (user %s): the very same plays twice", ev.EventID, ev.MixID, first, ev.UserID)
					}
					anchors[a] = ev.EventID
					_, vs := schemas.ParseEvent(m.Value, schemas.ValidateOptions{ArrivalMS: now.UnixMilli()})
					if end := ev.StartedAt + ev.DurationMS; (end > now.UnixMilli() || len(vs) > 0) && bad < 3 {
						bad++
						t.Errorf("event %s at clock %s: started_at %s, ends %s; violations %+v",
							ev.EventID, now.Format(time.RFC3339), time.UnixMilli(ev.StartedAt).UTC().Format(time.RFC3339),
							time.UnixMilli(end).UTC().Format(time.RFC3339), vs)
					}
				}
				now = now.Add(c.step)
			}
		})
	}
}
