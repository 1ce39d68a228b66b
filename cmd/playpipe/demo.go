package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/pipeline"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/reporter"
)

func init() {
	register(command{
		name:    "demo",
		summary: "run the whole pipeline on embedded defaults through a 500 storm and a standby window, then audit it",
		run:     runDemo,
	})
}

const demoSynopsis = `Runs every role of playpipe in one process — HTTP ingest, enrich consumer, reporter and
ClickHouse sink — over an embedded Kafka broker (in memory), the built-in partner API
sandbox and a local clickhouse-server, all on loopback. A simulated fleet publishes
segments (most through Kafka with kafka-go, some through the ingest gateway) while the
sandbox goes through a 500 storm and a standby window. When everything has drained it
prints the audit of the run and says whether every play was delivered exactly once
(exit status 1 when not).`

// demoConfig are the demo's knobs.
type demoConfig struct {
	events, devices     int
	rate, badShare      float64
	ingestShare         float64
	seed                int64
	storm, stormAt      time.Duration
	standby, standbyAt  time.Duration
	stormRate           float64
	dataDir, logFile    string
	drainTimeout        time.Duration
	kafka               kafkax.Config
	clickhouse          analytics.Config
	progressEvery       time.Duration
	concurrency         int
	pages, lists, mixes int
}

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr, demoSynopsis)
	var c demoConfig
	fs.IntVar(&c.events, "events", 5000, "segments the simulated fleet publishes")
	fs.Float64Var(&c.rate, "rate", 1000, "segments per second (0: as fast as Kafka takes them)")
	fs.IntVar(&c.devices, "devices", 150, "devices in the simulated fleet")
	fs.Float64Var(&c.badShare, "bad-share", 0.05, "share of bad events (malformed, missing fields, unknown mix, bad country), 0–1")
	fs.Float64Var(&c.ingestShare, "ingest-share", 0.1, "share of the segments sent through the HTTP ingest gateway instead of Kafka, 0–1")
	fs.Int64Var(&c.seed, "seed", 1, "seed of the simulation and of the sandbox catalog")
	fs.DurationVar(&c.stormAt, "storm-at", 2*time.Second, "when the 500 storm starts")
	fs.DurationVar(&c.storm, "storm", 3*time.Second, "how long the 500 storm lasts (0: none)")
	fs.Float64Var(&c.stormRate, "storm-rate", 0.3, "share of play reports answered 500 during the storm")
	fs.DurationVar(&c.standbyAt, "standby-at", 6*time.Second, "when the standby window opens")
	fs.DurationVar(&c.standby, "standby", 3*time.Second, "how long the partner API stays in standby (0: none)")
	fs.IntVar(&c.concurrency, "concurrency", reporter.DefaultConcurrency, "reports in flight")
	fs.StringVar(&c.dataDir, "data-dir", ".playpipe", "folder of the local ClickHouse data and the demo log")
	fs.StringVar(&c.logFile, "log-file", "", "where the roles log (default <data-dir>/demo.log)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 3*time.Minute, "how long to wait for the pipeline to drain after the fleet stopped")
	fs.DurationVar(&c.progressEvery, "progress", time.Second, "interval of the progress line")
	fs.IntVar(&c.pages, "pages", 3, "sandbox catalog: content pages")
	fs.IntVar(&c.lists, "lists-per-page", 3, "sandbox catalog: lists per page")
	fs.IntVar(&c.mixes, "mixes-per-list", 6, "sandbox catalog: mixes per list")
	c.kafka.RegisterFlags(fs)
	c.clickhouse.RegisterFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		fmt.Fprintf(stderr, "playpipe demo: %v\n", err)
		return errUsage
	}
	// The demo is the all-local try-out: without --brokers it runs on the
	// embedded broker, as its synopsis says (the explicit opt-in the roles
	// need, kafkax.Config.Embedded, is the demo's own choice here).
	c.kafka.Embedded = c.kafka.Embedded || len(c.kafka.Brokers) == 0
	// Each run has its own ledger database unless one is named: the embedded
	// broker starts its topics at offset 0 every time, and the ledger
	// recognises records by their Kafka location.
	dbSet := os.Getenv(analytics.EnvDatabase) != ""
	fs.Visit(func(f *flag.Flag) { dbSet = dbSet || f.Name == "clickhouse-db" })
	if !dbSet {
		c.clickhouse.Database = "demo_" + time.Now().UTC().Format("20060102_150405")
	}
	return demo(ctx, c, stdout)
}

func (c *demoConfig) validate() error {
	switch {
	case c.events < 1:
		return fmt.Errorf("--events must be ≥ 1, got %d", c.events)
	case c.rate < 0:
		return fmt.Errorf("--rate must be ≥ 0, got %g", c.rate)
	case c.badShare < 0 || c.badShare > 1:
		return fmt.Errorf("--bad-share must be within 0–1, got %g", c.badShare)
	case c.ingestShare < 0 || c.ingestShare > 1:
		return fmt.Errorf("--ingest-share must be within 0–1, got %g", c.ingestShare)
	case c.stormRate < 0 || c.stormRate > 1:
		return fmt.Errorf("--storm-rate must be within 0–1, got %g", c.stormRate)
	case c.devices < 1:
		return fmt.Errorf("--devices must be ≥ 1, got %d", c.devices)
	}
	return nil
}

func demo(ctx context.Context, c demoConfig, out io.Writer) error {
	if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
		return fmt.Errorf("data folder: %w", err)
	}
	if c.logFile == "" {
		c.logFile = filepath.Join(c.dataDir, "demo.log")
	}
	lf, err := os.Create(c.logFile)
	if err != nil {
		return fmt.Errorf("log file: %w", err)
	}
	defer lf.Close()
	log := slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if c.clickhouse.Addr == "" && c.clickhouse.DataDir == "" {
		c.clickhouse.DataDir = filepath.Join(c.dataDir, "clickhouse")
	}

	fmt.Fprintf(out, "playpipe %s demo — logs in %s\n", version.Version, c.logFile)
	start := time.Now()
	p, err := pipeline.Start(ctx, pipeline.Options{
		Kafka:      c.kafka,
		Sandbox:    sandbox.Options{Seed: c.seed, Pages: c.pages, ListsPerPage: c.lists, MixesPerList: c.mixes, Logger: log},
		ClickHouse: c.clickhouse,
		Reporter:   reporter.Config{Concurrency: c.concurrency, ProbeInterval: 200 * time.Millisecond, BackoffMax: time.Second},
		Logger:     log,
	})
	if err != nil {
		return err
	}
	defer p.Close()
	kafkaNote := "embedded in-process broker (in memory, not durable)"
	if len(c.kafka.Brokers) > 0 {
		kafkaNote = strings.Join(c.kafka.Brokers, ",")
	}
	fmt.Fprintf(out, "  kafka       %s at %s\n  partner API built-in sandbox at %s\n  clickhouse  %s (database %s)\n",
		kafkaNote, strings.Join(p.Kafka.Brokers, ","), p.APIURL, p.ClickHouse.Addr, p.ClickHouse.Database)

	// The ingest gateway, with a key made for this run.
	gw, err := startDemoGateway(ctx, p.Kafka, log)
	if err != nil {
		return err
	}
	defer gw.close()
	fmt.Fprintf(out, "  ingest      http://%s/v1/events\n\n", gw.addr)

	mixes, err := producer.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		return fmt.Errorf("catalog walk: %w", err)
	}
	viaIngest := int(float64(c.events) * c.ingestShare)
	viaKafka := c.events - viaIngest
	simCfg := producer.SimConfig{Kafka: p.Kafka, Mixes: mixes, Events: viaKafka, Rate: c.rate * float64(viaKafka) / float64(c.events),
		Devices: c.devices, BadShare: c.badShare, Seed: c.seed}
	fmt.Fprintf(out, "fleet: %d devices publish %d segments over %d mixes (%d via kafka-go, %d via the ingest gateway), %.0f%% bad\n",
		c.devices, c.events, len(mixes), viaKafka, viaIngest, c.badShare*100)

	// The fleet and the fault schedule run in goroutines owned here: on any
	// return they are cancelled and waited for before the pipeline closes.
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	out = &syncWriter{w: out} // the schedule and the progress line both print
	var onTopic atomic.Int64  // events on the events topic (Kafka-acknowledged)
	fleetDone := make(chan error, 2)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if viaKafka == 0 {
			fleetDone <- nil
			return
		}
		st, err := producer.Simulate(runCtx, simCfg)
		onTopic.Add(int64(st.Sent))
		fleetDone <- err
	}()
	go func() {
		defer wg.Done()
		n, err := gw.send(runCtx, producer.SimConfig{Mixes: mixes, Events: viaIngest, Devices: c.devices, BadShare: c.badShare, Seed: c.seed + 1,
			Rate: c.rate * float64(viaIngest) / float64(c.events), Kafka: p.Kafka})
		onTopic.Add(int64(n))
		fleetDone <- err
	}()

	// The partner API's bad day, on a schedule.
	faults := newDemoSchedule(c, p.Sandbox, out, start)
	go func() {
		defer wg.Done()
		faults.run(runCtx)
	}()

	var auditor *analytics.Auditor
	conn, err := p.ClickHouse.Open()
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	defer conn.Close()
	auditor, err = analytics.NewAuditor(conn, p.ClickHouse.Database)
	if err != nil {
		return err
	}
	window := analytics.AuditOptions{From: start.Add(-time.Minute)}

	tick := time.NewTicker(c.progressEvery)
	defer tick.Stop()
	fleetsRunning := 2
	var drainDeadline time.Time
	var rep *analytics.Report
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-p.Errors():
			return fmt.Errorf("a role failed: %w", err)
		case err := <-fleetDone:
			if err != nil {
				return fmt.Errorf("fleet: %w", err)
			}
			if fleetsRunning--; fleetsRunning == 0 {
				drainDeadline = time.Now().Add(c.drainTimeout)
				fmt.Fprintf(out, "fleet done: %d events on the topic; draining…\n", onTopic.Load())
			}
		case <-tick.C:
			window.To = time.Now().Add(time.Minute)
			r, err := auditor.Audit(ctx, window)
			if err != nil {
				fmt.Fprintf(out, "  (audit not ready: %v)\n", err)
				continue
			}
			rep = r
			counts := p.Sandbox.Counts()
			fmt.Fprintf(out, "%6.1fs  events %6d  plays %6d  delivered %6d  pending %5d  standby-answers %4d  api %s\n",
				time.Since(start).Seconds(), r.EventsReceived, r.PlaysReportable, counts.Accepted, r.Pending, counts.Standby, p.Sandbox.Mode())
			if fleetsRunning == 0 && faults.done() && drained(r, onTopic.Load(), p) {
				return finishDemo(ctx, out, auditor, window, p, start)
			}
			if fleetsRunning == 0 && time.Now().After(drainDeadline) {
				if rep != nil {
					_ = analytics.WriteReport(out, rep, "table")
				}
				return fmt.Errorf("the pipeline did not drain within --drain-timeout %s", c.drainTimeout)
			}
		}
	}
}

// drained reports whether every event on the topic went through the consumer
// and every reportable play reached a final outcome, as the ledger shows.
func drained(r *analytics.Report, onTopic int64, p *pipeline.Pipeline) bool {
	e := p.Enricher()
	if e == nil || r.EventsReceived < uint64(onTopic) {
		return false
	}
	st := e.Stats()
	return st.Events >= onTopic && r.PlaysDerived == uint64(st.Plays) && r.Pending == 0 &&
		r.Delivered+r.RejectedByAPI == r.PlaysReportable
}

func finishDemo(ctx context.Context, out io.Writer, a *analytics.Auditor, window analytics.AuditOptions, p *pipeline.Pipeline, start time.Time) error {
	window.To = time.Now().Add(time.Minute)
	r, err := a.Audit(ctx, window)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\ndrained in %s. The audit of this run (playpipe audit):\n\n", time.Since(start).Round(100*time.Millisecond))
	if err := analytics.WriteReport(out, r, "table"); err != nil {
		return err
	}
	led := p.Sandbox.Counts()
	var problems []string
	problems = append(problems, r.Problems()...)
	if uint64(led.Accepted) != r.Delivered {
		problems = append(problems, fmt.Sprintf("the partner API accepted %d reports but the ledger says %d delivered", led.Accepted, r.Delivered))
	}
	if led.Duplicates > 0 {
		problems = append(problems, fmt.Sprintf("the partner API received %d reports twice", led.Duplicates))
	}
	fmt.Fprintf(out, "\npartner API (sandbox ledger): %d reports accepted, %d answered by standby and replayed, %d duplicates\n",
		led.Accepted, led.Standby, led.Duplicates)
	if len(problems) > 0 {
		fmt.Fprintf(out, "NOT every play was delivered exactly once:\n  - %s\n", strings.Join(problems, "\n  - "))
		return errors.New("the audit found problems")
	}
	fmt.Fprintf(out, "Every play was delivered exactly once: %d plays derived from %d events, %d delivered, 0 pending, 0 twice.\n",
		r.PlaysReportable, r.EventsReceived, r.Delivered)
	if p.ClickHouse.DataDir != "" {
		fmt.Fprintf(out, "\nThe ledger stays in %s; audit it again, or list the report ids behind a number, with:\n  playpipe audit --clickhouse-data %s --clickhouse-db %s --from %s [--list delivered]\n",
			p.ClickHouse.DataDir, p.ClickHouse.DataDir, p.ClickHouse.Database, start.Add(-time.Minute).UTC().Format(time.RFC3339))
	}
	return nil
}

// demoSchedule drives the sandbox's 500 storm and standby window.
type demoSchedule struct {
	c        demoConfig
	sb       *sandbox.Server
	out      io.Writer
	start    time.Time
	finished atomic.Bool
}

func newDemoSchedule(c demoConfig, sb *sandbox.Server, out io.Writer, start time.Time) *demoSchedule {
	return &demoSchedule{c: c, sb: sb, out: out, start: start}
}

func (s *demoSchedule) done() bool { return s.finished.Load() }

func (s *demoSchedule) run(ctx context.Context) {
	defer s.finished.Store(true)
	type step struct {
		at   time.Duration
		say  string
		what func()
	}
	var steps []step
	if s.c.storm > 0 {
		steps = append(steps,
			step{s.c.stormAt, fmt.Sprintf("partner API: 500 storm begins (%.0f%% of play reports)", s.c.stormRate*100), func() {
				s.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: s.c.stormRate}})
			}},
			step{s.c.stormAt + s.c.storm, "partner API: 500 storm over", func() { s.sb.SetFaults(sandbox.Faults{}) }})
	}
	if s.c.standby > 0 {
		steps = append(steps,
			step{s.c.standbyAt, "partner API: failover to STANDBY (reports answered 200 but not forwarded)", func() { s.sb.SetMode(sandbox.ModeStandby) }},
			step{s.c.standbyAt + s.c.standby, "partner API: live service is back", func() { s.sb.SetMode(sandbox.ModeLive) }})
	}
	// in time order
	for i := range steps {
		for j := i + 1; j < len(steps); j++ {
			if steps[j].at < steps[i].at {
				steps[i], steps[j] = steps[j], steps[i]
			}
		}
	}
	for _, st := range steps {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(s.start.Add(st.at))):
		}
		st.what()
		fmt.Fprintf(s.out, "%6.1fs  >>> %s\n", time.Since(s.start).Seconds(), st.say)
	}
}

// demoGateway is the ingest gateway of the demo, on loopback.
type demoGateway struct {
	addr  string
	key   string
	pub   *producer.Publisher
	srv   *http.Server
	done  chan struct{}
	close func()
}

func startDemoGateway(ctx context.Context, k kafkax.Config, log *slog.Logger) (*demoGateway, error) {
	pub, err := producer.NewPublisher(ctx, producer.PublisherConfig{Kafka: k})
	if err != nil {
		return nil, err
	}
	raw := make([]byte, 24)
	if _, err := rand.Read(raw); err != nil {
		return nil, err
	}
	key := hex.EncodeToString(raw)
	fk, err := producer.ParseFleetKey("demo-fleet:" + producer.HashKey(key))
	if err != nil {
		return nil, err
	}
	gw, err := producer.NewGateway(producer.GatewayConfig{Publisher: pub, Keys: []producer.FleetKey{fk}, Logger: log})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("ingest listen: %w", err)
	}
	g := &demoGateway{addr: ln.Addr().String(), key: key, pub: pub, done: make(chan struct{}),
		srv: &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(g.done)
		_ = g.srv.Serve(ln) // http.ErrServerClosed on shutdown
	}()
	g.close = func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		gw.SetDraining()
		_ = g.srv.Shutdown(sctx)
		<-g.done
		_ = pub.Close(sctx)
	}
	return g, nil
}

// send posts simulated segments to the gateway as NDJSON batches of 100 and
// returns how many it accepted onto the events topic.
func (g *demoGateway) send(ctx context.Context, cfg producer.SimConfig) (int, error) {
	if cfg.Events == 0 {
		return 0, nil
	}
	gen, err := producer.NewSimGenerator(cfg)
	if err != nil {
		return 0, err
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	accepted := 0
	var batch bytes.Buffer
	n := 0
	every := time.Duration(0)
	if cfg.Rate > 0 {
		every = time.Duration(float64(time.Second) * 100 / cfg.Rate)
	}
	flush := func() error {
		if n == 0 {
			return nil
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+g.addr+"/v1/events", bytes.NewReader(batch.Bytes()))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Authorization", "Bearer "+g.key)
		req.Header.Set("User-Agent", version.UserAgent())
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
		defer resp.Body.Close()
		var ir producer.IngestResponse
		if err := json.NewDecoder(resp.Body).Decode(&ir); err != nil {
			return fmt.Errorf("ingest: answer %d: %w", resp.StatusCode, err)
		}
		if resp.StatusCode != http.StatusAccepted {
			return fmt.Errorf("ingest: answer %d: %s", resp.StatusCode, ir.Error)
		}
		accepted += ir.Accepted
		batch.Reset()
		n = 0
		if every > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(every):
			}
		}
		return nil
	}
	for m, ok := gen.Next(); ok; m, ok = gen.Next() {
		batch.Write(bytes.ReplaceAll(m.Value, []byte("\n"), []byte(" ")))
		batch.WriteByte('\n')
		if n++; n == 100 {
			if err := flush(); err != nil {
				return accepted, err
			}
		}
	}
	return accepted, flush()
}

// syncWriter serialises writes from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
