package replay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// deliverRig is a runner on an embedded broker posting to a partner whose
// play report answers the test scripts (sessions are answered).
type deliverRig struct {
	k      *testenv.Kafka
	r      *runner
	mu     sync.Mutex
	copies int
}

const deliverReportID = "0123456789abcdef0123456789abcdef"

func newDeliverRig(t *testing.T, report func(n int, w http.ResponseWriter, r *http.Request), wrap func(http.RoundTripper) http.RoundTripper) *deliverRig {
	t.Helper()
	g := &deliverRig{k: testenv.StartKafka(t, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, partnerapi.PathSession) {
			fmt.Fprint(w, `{"session":{"token":{"token":"tok1","error":null}}}`)
			return
		}
		_, _ = io.ReadAll(r.Body)
		g.mu.Lock()
		g.copies++
		n := g.copies
		g.mu.Unlock()
		report(n, w, r)
	}))
	t.Cleanup(srv.Close)
	cfg := partnerapi.Config{BaseURL: srv.URL, Credentials: partnerapi.Credentials{ClientID: "id", ClientSignature: "signature-of-the-test"},
		RequestTimeout: 5 * time.Second}
	if wrap != nil {
		cfg.HTTPClient = &http.Client{Transport: wrap(http.DefaultTransport)}
	}
	api, err := partnerapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(api.Close)
	c := Config{ReplayID: "rp-test", Reason: "a test", Partner: srv.URL, MaxAttempts: 4,
		BackoffInitial: time.Millisecond, BackoffMax: time.Millisecond, Logger: testenv.Logger(t)}
	g.r = &runner{cfg: c, w: waits{timeout: 10 * time.Second, brokers: g.k.Config.Brokers}, api: api,
		log: c.Logger, cl: g.k.Client(t), topic: g.k.Config.Topics().Deliveries, kind: KindReplay}
	return g
}

func (g *deliverRig) deliver(ctx context.Context) error {
	return g.r.deliver(ctx, context.WithoutCancel(ctx), job{it: item{reportID: deliverReportID, eventID: "ev-1"}, body: []byte(`{"track_id":1}`)})
}

func (g *deliverRig) records(t *testing.T) []schemas.Delivery {
	t.Helper()
	var out []schemas.Delivery
	for _, rec := range g.k.ReadAll(t, g.r.topic) {
		var d schemas.Delivery
		if err := schemas.DecodeDelivery(rec.Value, &d); err != nil {
			t.Fatalf("decode %s: %v", rec.Value, err)
		}
		out = append(out, d)
	}
	return out
}

// TestReplayCancelledPostRecorded: a replay post cancelled after its
// request was written (the operator's interrupt) gets a Delivery record of
// its own, in doubt (cause cancelled), not final; one whose 200 came back
// just as the run was cancelled is recorded as delivered. Before, both
// were dropped without a record.
func TestReplayCancelledPostRecorded(t *testing.T) {
	t.Run("cancelled after written", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		g := newDeliverRig(t, func(_ int, _ http.ResponseWriter, r *http.Request) {
			cancel() // the whole report is here
			<-r.Context().Done()
		}, nil)
		if err := g.deliver(ctx); err != nil {
			t.Fatal(err)
		}
		ds := g.records(t)
		if len(ds) != 1 {
			t.Fatalf("%d Delivery records, want 1: %+v", len(ds), ds)
		}
		d := ds[0]
		if !d.InDoubt || d.DoubtCause != schemas.DoubtCancelled || d.Outcome != schemas.OutcomeRetry || d.ReplayID != "rp-test" || d.Attempt != 1 || d.ReportID != deliverReportID {
			t.Errorf("record %+v, want outcome retry, in doubt, cause cancelled, replay rp-test", d)
		}
	})
	t.Run("answered, then cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		g := newDeliverRig(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, `{"error":false,"message":"success"}`)
		}, func(rt http.RoundTripper) http.RoundTripper {
			return rtFunc(func(req *http.Request) (*http.Response, error) {
				resp, err := rt.RoundTrip(req)
				if err != nil || req.URL.Path != partnerapi.PathRoyaltyTracking {
					return resp, err
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				resp.Body = io.NopCloser(bytes.NewReader(b))
				cancel() // the run is interrupted as the answer arrives
				return resp, nil
			})
		})
		if err := g.deliver(ctx); err != nil {
			t.Fatal(err)
		}
		ds := g.records(t)
		if len(ds) != 1 || ds[0].Outcome != schemas.OutcomeDelivered || ds[0].InDoubt || ds[0].DoubtCause != "" {
			t.Fatalf("records %+v, want one delivered, not in doubt", ds)
		}
		if g.r.delivered.Load() != 1 {
			t.Errorf("delivered %d, want 1", g.r.delivered.Load())
		}
	})
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestReplayLabelsDoubt: replay labels doubt as the reporter does. A post
// answered by an edge's page carries its cause (edge_answer) and every
// later record of the report says in_doubt; on a resumed run every record
// of a re-posted report is in doubt, the first carrying crash. Before,
// replay set no cause and in_doubt only on a resumed run's first attempt.
func TestReplayLabelsDoubt(t *testing.T) {
	answers := func(n int, w http.ResponseWriter, _ *http.Request) {
		switch n {
		case 1:
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprint(w, "<html>502 Bad Gateway</html>")
		case 2:
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, `{"error":true,"reason":"internal service error","mix":null}`)
		default:
			fmt.Fprint(w, `{"error":false,"message":"success"}`)
		}
	}
	t.Run("first run", func(t *testing.T) {
		g := newDeliverRig(t, answers, nil)
		if err := g.deliver(context.Background()); err != nil {
			t.Fatal(err)
		}
		ds := g.records(t)
		want := []struct {
			outcome, cause string
			inDoubt        bool
		}{
			{schemas.OutcomeRetry, schemas.DoubtEdgeAnswer, true},
			{schemas.OutcomeRetry, "", true},
			{schemas.OutcomeDelivered, "", true},
		}
		if len(ds) != len(want) {
			t.Fatalf("%d records, want %d: %+v", len(ds), len(want), ds)
		}
		for i, w := range want {
			if d := ds[i]; d.Outcome != w.outcome || d.DoubtCause != w.cause || d.InDoubt != w.inDoubt || d.Attempt != i+1 {
				t.Errorf("record %d: %s cause %q in_doubt %v attempt %d, want %s cause %q in_doubt %v", i, d.Outcome, d.DoubtCause, d.InDoubt, d.Attempt, w.outcome, w.cause, w.inDoubt)
			}
		}
	})
	t.Run("resumed run", func(t *testing.T) {
		g := newDeliverRig(t, func(n int, w http.ResponseWriter, r *http.Request) { answers(n+1, w, r) }, nil) // 500, then 200
		g.r.inDoubt = true
		if err := g.deliver(context.Background()); err != nil {
			t.Fatal(err)
		}
		ds := g.records(t)
		if len(ds) != 2 {
			t.Fatalf("%d records, want 2: %+v", len(ds), ds)
		}
		if !ds[0].InDoubt || ds[0].DoubtCause != schemas.DoubtCrash || !ds[1].InDoubt || ds[1].DoubtCause != "" || ds[1].Outcome != schemas.OutcomeDelivered {
			t.Errorf("records %+v, want both in doubt, the first carrying crash", ds)
		}
	})
}
