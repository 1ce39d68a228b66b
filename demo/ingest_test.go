package demo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
	"github.com/playpipe/playpipe/wiring/roles"
)

// wantPlay is a track play as an independent reading of docs/design.md's split
// rule computes it from the sandbox's catalog.
type wantPlay struct {
	TrackID, PlayedAt, PlayLength int64
	ISRC                          string
	BelowMinimum                  bool
}

// TestIngestAndEnrichEndToEnd is the ingest and enrich acceptance test over real parts:
// the simulator (kafka-go) and the HTTP ingest gateway publish a few thousand
// events, bad ones included; the enrich consumer splits them with mixes from
// the sandbox. plays.reports must then hold exactly the plays computed
// independently from the sandbox catalog (same ids, isrcs byte-identical,
// lengths and timestamps equal), plays.rejected every bad event with its
// reason, and nothing else.
func TestIngestAndEnrichEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	k := testenv.StartKafka(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := demo.Start(ctx, demo.Config{
		Kafka:    k.Config,
		Sandbox:  sandbox.Config{Seed: 21, Pages: 2, ListsPerPage: 2, MixesPerList: 4},
		NoSink:   true,
		Consumer: consumer.Config{TransactionalID: "ingest-e2e"},
		Logger:   testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.StopRole(demo.RoleReport); err != nil { // the reports stay on their topic: nothing but enrich reads them here
		t.Fatal(err)
	}

	// The gateway, on loopback, with one fleet key.
	pub, err := producer.NewPublisher(ctx, roles.Publisher(p.Kafka))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	key, fk := "fleet-key-for-the-test", gateway.HashKey("fleet-key-for-the-test")
	fleetKey, err := gateway.ParseFleetKey("test-fleet:" + fk)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := gateway.New(gateway.Config{Publisher: pub, Keys: []gateway.FleetKey{fleetKey}, Logger: testenv.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	gwURL := testenv.ServeHandler(t, gw)

	mixes, err := simulator.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		t.Fatal(err)
	}
	viaKafka := simulator.Config{Kafka: p.Kafka, Mixes: mixes, Events: 2500, Devices: 50, BadShare: 0.1, Seed: 8, StartMS: simulator.DefaultStart(time.Now())}
	viaHTTP := viaKafka
	viaHTTP.Events, viaHTTP.Seed = 600, 9
	kafkaMsgs, httpMsgs := generate(t, viaKafka), generate(t, viaHTTP)
	// The two fleets must not share event ids.
	seen := map[string]bool{}
	for _, m := range append(append([]simulator.Message(nil), kafkaMsgs...), httpMsgs...) {
		if m.Kind == simulator.KindValid && seen[string(m.Key)] {
			t.Fatalf("simulated event id %s twice", m.Key)
		}
		seen[string(m.Key)] = true
	}

	simDone := make(chan error, 1)
	go func() {
		_, err := simulator.Run(ctx, viaKafka)
		simDone <- err
	}()
	refusedHTTP := 0
	for start := 0; start < len(httpMsgs); start += 200 {
		batch := httpMsgs[start:min(start+200, len(httpMsgs))]
		var body bytes.Buffer
		for _, m := range batch {
			body.Write(bytes.ReplaceAll(m.Value, []byte("\n"), []byte(" ")))
			body.WriteByte('\n')
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gwURL+"/v1/events", &body)
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("X-API-Key", key)
		req.Header.Set("User-Agent", version.UserAgent())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var ir gateway.IngestResponse
		err = json.NewDecoder(resp.Body).Decode(&ir)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusAccepted || len(ir.Events) != len(batch) {
			t.Fatalf("ingest answered %d (%v): %+v", resp.StatusCode, err, ir)
		}
		for i, a := range ir.Events {
			if a.Status == "refused" {
				refusedHTTP++
				// Only events the schema refuses are refused at the gateway (an unknown mix is found by the consumer).
				if batch[i].Kind == simulator.KindValid || batch[i].Kind == simulator.KindUnknownMix {
					t.Errorf("gateway refused a %s event: %+v", batch[i].Kind, a)
				}
			}
		}
	}
	if err := <-simDone; err != nil {
		t.Fatal(err)
	}

	// What must be on the topics, computed from the catalog.
	cat := p.Sandbox.Catalog()
	want := map[string]wantPlay{}
	wantRejected := map[string]string{} // event id → reason, for the events with an id
	badWithoutID := 0
	for _, m := range append(kafkaMsgs, httpMsgs...) {
		if m.Kind != simulator.KindValid {
			var ev struct {
				EventID string `json:"event_id"`
			}
			if json.Unmarshal(m.Value, &ev) != nil || ev.EventID == "" {
				badWithoutID++
			} else {
				wantRejected[ev.EventID] = m.Kind
			}
			continue
		}
		var ev schemas.PlayerEvent
		if err := json.Unmarshal(m.Value, &ev); err != nil {
			t.Fatal(err)
		}
		mix, _ := cat.Mix(ev.MixID)
		end := min(ev.OffsetMS+ev.DurationMS, int64(mix.LengthSec)*1000)
		for pos, tr := range mix.Tracks {
			s := int64(tr.StartSec) * 1000
			overlap := min(s+int64(tr.LengthSec)*1000, end) - max(s, ev.OffsetMS)
			if overlap > 0 {
				want[schemas.ReportID(ev.EventID, pos)] = wantPlay{tr.ID, ev.StartedAt + max(0, s-ev.OffsetMS), overlap / 1000, tr.ISRC, overlap < 1000}
			}
		}
	}

	reports := readN(t, k, p.Kafka.Topics().Reports, len(want))
	got := map[string]wantPlay{}
	for _, r := range reports {
		var tp schemas.TrackPlay
		if err := json.Unmarshal(r.Value, &tp); err != nil {
			t.Fatalf("report record does not decode: %v", err)
		}
		if string(r.Key) != tp.ReportID {
			t.Errorf("report record key %q, id %q", r.Key, tp.ReportID)
		}
		if _, dup := got[tp.ReportID]; dup {
			t.Errorf("report %s twice on the topic", tp.ReportID)
		}
		got[tp.ReportID] = wantPlay{tp.Report.TrackID, tp.Report.PlayedAt, tp.Report.PlayLength, tp.Report.ISRC, tp.BelowMinimum}
	}
	for id, w := range want {
		if g, ok := got[id]; !ok {
			t.Errorf("report %s missing (want %+v)", id, w)
		} else if g != w {
			t.Errorf("report %s = %+v, want %+v", id, g, w)
		}
	}
	for id := range got {
		if _, ok := want[id]; !ok {
			t.Errorf("unexpected report %s", id)
		}
	}

	rejected := readN(t, k, p.Kafka.Topics().Rejected, len(wantRejected)+badWithoutID)
	byReason := map[string]int{}
	for _, r := range rejected {
		var rej schemas.Rejection
		if err := json.Unmarshal(r.Value, &rej); err != nil {
			t.Fatalf("rejection does not decode: %v", err)
		}
		byReason[rej.Reason]++
		if rej.Raw == "" || len(rej.Violations) == 0 {
			t.Errorf("rejection without raw bytes or reasons: %+v", rej)
		}
		if kind, ok := wantRejected[rej.EventID]; rej.EventID != "" {
			if !ok {
				t.Errorf("event %s rejected (%s) but it was valid", rej.EventID, rej.Reason)
			} else if kind != rej.Reason && !(kind == simulator.KindMissingField && rej.Reason == schemas.ReasonMissingField) {
				t.Errorf("event %s rejected as %s, simulated as %s", rej.EventID, rej.Reason, kind)
			}
		}
	}
	t.Logf("%d events (%d through the gateway, %d refused there) → %d track plays, %d rejections %v",
		len(kafkaMsgs)+len(httpMsgs), len(httpMsgs), refusedHTTP, len(got), len(rejected), byReason)
}

func generate(t *testing.T, cfg simulator.Config) []simulator.Message {
	t.Helper()
	g, err := simulator.NewGenerator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var out []simulator.Message
	for m, ok := g.Next(); ok; m, ok = g.Next() {
		out = append(out, m)
	}
	return out
}

// readN reads the committed records of topic until n arrived, then one more
// quiet second to catch any extra.
func readN(t *testing.T, k *testenv.Kafka, topic string, n int) []*kgo.Record {
	t.Helper()
	cl := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	var out []*kgo.Record
	deadline := time.Now().Add(90 * time.Second)
	quietUntil := time.Time{}
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r) })
		switch {
		case len(out) >= n && quietUntil.IsZero():
			quietUntil = time.Now().Add(time.Second)
		case !quietUntil.IsZero() && time.Now().After(quietUntil):
			return out
		case time.Now().After(deadline):
			t.Fatalf("%s: %d records, want %d", topic, len(out), n)
		}
	}
}
