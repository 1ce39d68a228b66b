package demo_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// scrape reads a Prometheus text exposition and sums each metric's samples
// whose labels contain every given label pair (name{a="b"} → value).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("scrape: %d %s", resp.StatusCode, b)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		series := line[:i]
		name, labels, _ := strings.Cut(series, "{")
		out[name] += v
		for _, l := range strings.Split(strings.TrimSuffix(labels, "}"), ",") {
			if k, val, ok := strings.Cut(l, "="); ok && !strings.HasPrefix(k, "otel_") && k != "job" && k != "instance" {
				out[name+"{"+k+"="+val+"}"] += v
			}
		}
	}
	return out
}

// TestMetricsFollowTheLedger scrapes /metrics while the pipeline runs and
// checks that the counters move, and at the end equal what the sandbox's
// ledger, the consumer and the ClickHouse ledger counted.
func TestMetricsFollowTheLedger(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tel, shutdown, err := telemetry.Setup(ctx, telemetry.Config{ServiceName: "playpipe-metrics-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = shutdown(context.Background()) }()
	metricsURL := testenv.ServeHandler(t, telemetry.MetricsHandler()) + "/metrics"

	k := testenv.StartKafka(t, 3)
	ch := testenv.StartClickHouse(t)
	p, err := demo.Start(ctx, demo.Config{
		Kafka:      k.Config,
		Sandbox:    sandbox.Config{Seed: 5, Pages: 1, ListsPerPage: 2, MixesPerList: 4},
		ClickHouse: analytics.Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password},
		Consumer:   consumer.Config{TransactionalID: "metrics-enrich"},
		Sink:       analytics.SinkConfig{BatchRows: 1000, Linger: 100 * time.Millisecond},
		Logger:     testenv.Logger(t),
		Telemetry:  tel,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	mixes, err := simulator.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		t.Fatal(err)
	}
	before := scrape(t, metricsURL)
	const events = 1200
	simDone := make(chan error, 1)
	go func() {
		_, err := simulator.Run(ctx, simulator.Config{Kafka: p.Kafka, Mixes: mixes, Events: events, Rate: 1500, BadShare: 0.1, Seed: 2, Devices: 40})
		simDone <- err
	}()
	p.Sandbox.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{FailNext: 25, FailNextStatus: 503}})

	// During the run: the counters move.
	during := scrape(t, metricsURL)
	for deadline := time.Now().Add(30 * time.Second); during["playpipe_events_in_total"] <= before["playpipe_events_in_total"] && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond) // the polling pause
		during = scrape(t, metricsURL)
	}
	if during["playpipe_events_in_total"] <= before["playpipe_events_in_total"] {
		t.Errorf("events in did not move during the run: %v → %v", before["playpipe_events_in_total"], during["playpipe_events_in_total"])
	}
	if err := <-simDone; err != nil {
		t.Fatal(err)
	}

	// At the end: the counters equal the ledgers.
	// Counters are cumulative for the process (other tests, -count): compare
	// what moved since the run began.
	var m map[string]float64
	delta := func(name string) float64 { return m[name] - before[name] }
	var rep *analytics.Audit
	auditor, err := analytics.NewAuditor(ch.Conn(t), ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	window := analytics.AuditOptions{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(300 * time.Millisecond) {
		m = scrape(t, metricsURL)
		rep, err = auditor.Audit(ctx, window)
		st := p.Enricher().Stats()
		if err == nil && st.Events == events && rep.Pending == 0 && rep.PlaysDerived == uint64(st.Plays) &&
			delta(`playpipe_deliveries_total{outcome="delivered"}`) == float64(p.Sandbox.Counts().Accepted) &&
			delta("playpipe_sink_rows_total") >= float64(rep.EventsReceived+rep.PlayRecords) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("did not settle: audit %+v err %v; metrics %v", rep, err, filter(m, "sink"))
		}
	}
	st := p.Enricher().Stats()
	led := p.Sandbox.Counts()
	checks := []struct {
		name      string
		got, want float64
	}{
		{"playpipe_events_in_total", delta("playpipe_events_in_total"), float64(events)},
		{"playpipe_events_rejected_total", delta("playpipe_events_rejected_total"), float64(st.Rejected)},
		{"playpipe_events_rejected_total (ledger)", delta("playpipe_events_rejected_total"), float64(rep.EventsRejected)},
		{"playpipe_plays_derived_total", delta("playpipe_plays_derived_total"), float64(rep.PlaysDerived)},
		{`playpipe_deliveries_total{outcome="delivered"}`, delta(`playpipe_deliveries_total{outcome="delivered"}`), float64(led.Accepted)},
		{`playpipe_deliveries_total{outcome="delivered"} (ledger)`, delta(`playpipe_deliveries_total{outcome="delivered"}`), float64(rep.Delivered)},
		{`playpipe_delivery_retries_total{reason="http_503"}`, delta(`playpipe_delivery_retries_total{reason="http_503"}`), 25},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if delta("playpipe_mixcache_misses_total") == 0 || delta("playpipe_mixcache_hits_total") == 0 {
		t.Errorf("mix cache metrics did not move: %v", filter(m, "mixcache"))
	}
}

func filter(m map[string]float64, part string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "playpipe_") && strings.Contains(k, part) && !strings.Contains(k, "bucket") {
			out[k] = v
		}
	}
	return out
}
