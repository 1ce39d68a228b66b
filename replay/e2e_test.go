package replay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"net/http"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/replay"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

const bugMessage = "isrc is invalid"

// TestReplayAfterPartnerDataLoss runs the live pipeline (kfake over TCP, the
// sandbox over HTTP behind a proxy that wrongly rejects some reports with
// 400, a real ClickHouse), then simulates the partner losing everything
// (the sandbox's reset) and replays the second half of the delivery window:
// the partner's strict ledger ends with every report of the window exactly
// once, the audit lists the replay on its own and has no problem; a dry
// run and a re-run of the same replay id send nothing; a redrive after the
// proxy's bug is "fixed" delivers every rejected report once.
func TestReplayAfterPartnerDataLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	k := testenv.SharedApacheKafka(t, 3)
	ch := testenv.StartClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testenv.Logger(t)

	srv, err := sandbox.New(sandbox.Config{Seed: 11, Pages: 2, ListsPerPage: 2, MixesPerList: 5})
	if err != nil {
		t.Fatal(err)
	}
	var buggy atomic.Bool
	buggy.Store(true)
	proxy := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if buggy.Load() && r.Method == http.MethodPost && r.URL.Path == partnerapi.PathRoyaltyTracking {
			body, _ := io.ReadAll(r.Body)
			if crc32.ChecksumIEEE(body)%6 == 0 {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(`{"error":true,"reason":"` + bugMessage + `","mix":null}`))
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		srv.Handler().ServeHTTP(w, r)
	})
	url := testenv.ServeHandler(t, proxy)

	chCfg := analytics.Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password}
	p, err := demo.Start(ctx, demo.Config{
		Kafka: k.Config,
		API: partnerapi.Config{BaseURL: url, Credentials: partnerapi.Credentials{ClientID: sandbox.DefaultClientID,
			ClientSignature: sandbox.DefaultClientSignature, Email: sandbox.DefaultEmail}},
		ClickHouse: chCfg,
		Consumer:   consumer.Config{TransactionalID: "replay-e2e-enrich"},
		Reporter:   reporter.Config{Concurrency: 8, BackoffMax: 300 * time.Millisecond},
		Sink:       analytics.SinkConfig{BatchRows: 500, Linger: 100 * time.Millisecond},
		Logger:     log,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	mixes, err := simulator.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := simulator.Run(ctx, simulator.Config{Kafka: p.Kafka, Mixes: mixes, Events: 150, Rate: 1000, Devices: 20, Seed: 3}); err != nil {
		t.Fatal(err)
	}

	conn := ch.Conn(t)
	aud, err := analytics.NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	opts := func() analytics.AuditOptions {
		now := time.Now()
		return analytics.AuditOptions{From: now.Add(-time.Hour), To: now.Add(time.Minute), Now: now}
	}
	audit := func() *analytics.Audit {
		r, err := aud.Audit(ctx, opts())
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// The live run settles: every reportable play final, twice in a row.
	var live *analytics.Audit
	prev := uint64(0)
	waitFor(t, ctx, 90*time.Second, "the live run to settle", func() (bool, string) {
		r := audit()
		ok := r.PlaysReportable > 0 && r.Pending == 0 && r.PlaysReportable == prev
		prev, live = r.PlaysReportable, r
		return ok, fmt.Sprintf("reportable %d delivered %d rejected %d pending %d", r.PlaysReportable, r.Delivered, r.RejectedByAPI, r.Pending)
	})
	if live.RejectedByAPI == 0 || live.Delivered < 20 {
		t.Fatalf("the live run should deliver plenty and see the proxy's 400s: %+v", live)
	}
	t.Logf("live: %d reportable, %d delivered, %d rejected", live.PlaysReportable, live.Delivered, live.RejectedByAPI)

	// The window: the second half of the live deliveries, from the Kafka log.
	topics := p.Kafka.Topics()
	bodies := map[string]string{}
	for _, r := range k.ReadAll(t, topics.Reports) {
		var tp struct {
			ReportID string          `json:"report_id"`
			Report   json.RawMessage `json:"report"`
		}
		if err := json.Unmarshal(r.Value, &tp); err != nil {
			t.Fatal(err)
		}
		bodies[tp.ReportID] = string(tp.Report)
	}
	type del struct {
		id string
		at int64
	}
	var delivered []del
	for _, r := range k.ReadAll(t, topics.Deliveries) {
		var d schemas.Delivery
		if len(r.Headers) > 0 && r.Headers[0].Key == schemas.HeaderLease || json.Unmarshal(r.Value, &d) != nil {
			continue
		}
		if d.Outcome == schemas.OutcomeDelivered && d.ReplayID == "" {
			delivered = append(delivered, del{d.ReportID, d.At})
		}
	}
	sort.Slice(delivered, func(i, j int) bool { return delivered[i].at < delivered[j].at })
	from := time.UnixMilli(delivered[len(delivered)/2].at)
	to := time.UnixMilli(delivered[len(delivered)-1].at + 1)
	want := map[string]bool{}
	for _, d := range delivered {
		if d.at >= from.UnixMilli() && d.at < to.UnixMilli() {
			want[d.id] = true
		}
	}
	wantBodies := map[string]bool{}
	for id := range want {
		wantBodies[bodies[id]] = true
	}

	// The partner loses everything.
	srv.Reset()
	sel := replay.Selection{Kind: replay.KindReplay, By: replay.ByDelivered, From: from, To: to}
	cfg := replay.Config{Kafka: p.Kafka, CH: conn, Database: ch.Database, ReplayID: "rp-e2e-1", Reason: "partner lost the second half",
		Partner: url, Concurrency: 4, Rate: 500, Logger: log, Out: testWriter{t}, Progress: 500 * time.Millisecond}

	dry := cfg
	dry.DryRun = true
	res, err := replay.Run(ctx, dry, nil, sel)
	if err != nil {
		t.Fatal(err)
	}
	if res.Selected != len(want) || len(res.Samples) == 0 || !want[res.Samples[0]] || srv.Counts().Accepted != 0 {
		t.Fatalf("dry run: %+v (want %d selected, samples from the window), partner accepted %d (want 0)", res, len(want), srv.Counts().Accepted)
	}

	res, err = replay.Run(ctx, cfg, p.API, sel)
	if err != nil {
		t.Fatalf("replay: %v (%+v)", err, res)
	}
	if res.Delivered != len(want) || res.Missing != 0 {
		t.Fatalf("replay: %+v, want %d delivered", res, len(want))
	}
	checkLedger := func(what string, wantBodies map[string]bool) {
		t.Helper()
		l := srv.Ledger()
		got := map[string]bool{}
		for _, e := range l.Accepted {
			if e.Duplicate || got[e.Raw] {
				t.Errorf("%s: the partner got a report twice: %s", what, e.Raw)
			}
			got[e.Raw] = true
		}
		if len(got) != len(wantBodies) {
			t.Errorf("%s: the partner holds %d reports, want %d", what, len(got), len(wantBodies))
		}
		for b := range wantBodies {
			if !got[b] {
				t.Errorf("%s: the partner lacks %s", what, b)
			}
		}
	}
	checkLedger("after the replay", wantBodies)

	// A re-run of the same replay id sends nothing more.
	res, err = replay.Run(ctx, cfg, p.API, sel)
	if err != nil || res.Posts != 0 {
		t.Fatalf("re-run: %+v, %v: want no post", res, err)
	}
	checkLedger("after the re-run", wantBodies)

	// The audit: the replay on its own, no double, no problem.
	waitFor(t, ctx, 60*time.Second, "the audit to list the replay", func() (bool, string) {
		r := audit()
		return len(r.Replays) == 1 && r.Replays[0].Delivered == uint64(len(want)), fmt.Sprintf("%+v", r.Replays)
	})
	r := audit()
	if rp := r.Replays[0]; rp.ID != cfg.ReplayID || rp.Reason != cfg.Reason || rp.DeliveredTwice != 0 || r.DeliveredTwice != 0 || len(r.Problems()) != 0 ||
		r.Delivered != live.Delivered {
		t.Fatalf("audit after the replay: replays %+v, delivered twice %d, delivered %d (live %d), problems %q", r.Replays, r.DeliveredTwice, r.Delivered, live.Delivered, r.Problems())
	}
	rows, err := aud.List(ctx, opts(), analytics.ReplayListPrefix+cfg.ReplayID, 0)
	if err != nil || len(rows) != len(want) {
		t.Fatalf("--list replay: %d rows (%v), want %d", len(rows), err, len(want))
	}

	// The bug is fixed: redrive every report rejected with its message.
	rejected := map[string]bool{}
	for _, row := range mustList(t, aud, opts(), "rejected-by-api") {
		rejected[bodies[row.ReportID]] = true
	}
	if len(rejected) != int(live.RejectedByAPI) {
		t.Fatalf("rejected list %d, audit %d", len(rejected), live.RejectedByAPI)
	}
	buggy.Store(false)
	rd := cfg
	rd.ReplayID, rd.Reason = "", "proxy ISRC check fixed"
	res, err = replay.Run(ctx, rd, p.API, replay.Selection{Kind: replay.KindRedrive, Messages: []string{bugMessage}})
	if err != nil || res.Delivered != len(rejected) {
		t.Fatalf("redrive: %+v, %v: want %d delivered", res, err, len(rejected))
	}
	all := map[string]bool{}
	for b := range wantBodies {
		all[b] = true
	}
	for b := range rejected {
		all[b] = true
	}
	checkLedger("after the redrive", all)
	waitFor(t, ctx, 60*time.Second, "the audit to see the redrive", func() (bool, string) {
		r := audit()
		return len(r.Replays) == 2 && r.RejectedByAPI == 0, fmt.Sprintf("rejected %d replays %+v", r.RejectedByAPI, r.Replays)
	})
	r = audit()
	if r.DeliveredTwice != 0 || len(r.Problems()) != 0 || r.Delivered != live.Delivered+live.RejectedByAPI {
		t.Fatalf("audit after the redrive: delivered %d, twice %d, problems %q", r.Delivered, r.DeliveredTwice, r.Problems())
	}
}

func mustList(t *testing.T, a *analytics.Auditor, o analytics.AuditOptions, metric string) []analytics.ListRow {
	t.Helper()
	rows, err := a.List(context.Background(), o, metric, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

func waitFor(t *testing.T, ctx context.Context, d time.Duration, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	last := ""
	for time.Now().Before(deadline) && ctx.Err() == nil {
		ok, s := f()
		if ok {
			return
		}
		last = s
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s; last: %s", what, last)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(b, "\n")))
	return len(b), nil
}
