package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"sort"
	"testing"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/producertest"
)

// simMixes is the simulated fleet's catalog: two mixes of 40 and 50 minutes.
var simMixes = []simulator.MixInfo{
	{ID: 7, LengthMS: 2_400_000, TrackStartsMS: []int64{0, 300_000, 700_000, 1_300_000, 2_000_000}},
	{ID: 9, LengthMS: 3_000_000, TrackStartsMS: []int64{0, 600_000, 1_500_000, 2_400_000}},
}

// simulated returns every message of a simulation of cfg.
func simulated(t *testing.T, cfg simulator.Config) []simulator.Message {
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

// TestGatewayWithSimulatedFleet posts a simulated fleet's messages (good and
// bad) through the gateway in NDJSON batches: every valid and unknown_mix
// message must be accepted (the mix is the consumer's business), every other
// kind refused with its reason, the events topic must hold exactly the
// accepted messages verbatim and the rejected topic exactly the refused ones.
func TestGatewayWithSimulatedFleet(t *testing.T) {
	e := startGateway(t, Config{MaxEvents: 500}, producer.Config{})
	topics := e.k.Config.Topics()
	msgs := simulated(t, simulator.Config{Mixes: simMixes, Events: 2000, Devices: 60, BadShare: 0.15, Seed: 11, StartMS: producertest.StartedAtMS})
	wantReason := map[string]string{simulator.KindMalformedJSON: schemas.ReasonMalformedJSON, simulator.KindMissingField: schemas.ReasonMissingField, simulator.KindBadCountry: schemas.ReasonBadCountry}
	var wantAccepted, wantRefused []string
	for start := 0; start < len(msgs); start += 500 {
		batch := msgs[start:min(start+500, len(msgs))]
		var body bytes.Buffer
		for _, m := range batch {
			body.Write(m.Value)
			body.WriteByte('\n')
		}
		resp, b := e.post(t, "application/x-ndjson", body.Bytes(), bearer...)
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("batch at %d: %d %s", start, resp.StatusCode, b)
		}
		var ir IngestResponse
		if err := json.Unmarshal(b, &ir); err != nil {
			t.Fatal(err)
		}
		if len(ir.Events) != len(batch) {
			t.Fatalf("%d answers for %d events", len(ir.Events), len(batch))
		}
		for i, m := range batch {
			a := ir.Events[i]
			switch m.Kind {
			case simulator.KindValid, simulator.KindUnknownMix:
				if a.Status != producer.StatusAccepted || a.EventID != string(m.Key) {
					t.Fatalf("%s message %s answered %+v", m.Kind, m.Value, a)
				}
				wantAccepted = append(wantAccepted, string(m.Value))
			default:
				if a.Status != producer.StatusRefused || len(a.Reasons) != 1 || a.Reasons[0].Reason != wantReason[m.Kind] {
					t.Fatalf("%s message %s answered %+v", m.Kind, m.Value, a)
				}
				wantRefused = append(wantRefused, string(m.Value))
			}
		}
	}
	var gotAccepted, gotRefused []string
	for _, r := range producertest.ReadTopic(t, e.k, topics.Events, len(wantAccepted)) {
		gotAccepted = append(gotAccepted, string(r.Value))
	}
	for _, r := range producertest.ReadTopic(t, e.k, topics.Rejected, len(wantRefused)) {
		var rej schemas.Rejection
		if err := json.Unmarshal(r.Value, &rej); err != nil {
			t.Fatal(err)
		}
		gotRefused = append(gotRefused, rej.Raw)
	}
	for _, s := range [][]string{wantAccepted, wantRefused, gotAccepted, gotRefused} {
		sort.Strings(s)
	}
	if len(wantRefused) < 200 || len(wantAccepted) < 1600 {
		t.Fatalf("unexpected mix: %d accepted, %d refused", len(wantAccepted), len(wantRefused))
	}
	if !equalStrings(gotAccepted, wantAccepted) {
		t.Errorf("events topic: %d records, want exactly the %d accepted messages", len(gotAccepted), len(wantAccepted))
	}
	if !equalStrings(gotRefused, wantRefused) {
		t.Errorf("rejected topic: %d records, want exactly the %d refused messages", len(gotRefused), len(wantRefused))
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
