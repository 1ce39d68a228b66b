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
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/harness"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
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
(exit status 1 when not).

The storm and the standby window are scheduled by progress, not wall time, so they
overlap the traffic on any machine: each opens when the consumer has enriched its
--storm-at / --standby-at share of the events, and closes when it has lasted its
--storm / --standby duration and the partner API has answered reports during it (or
when nothing is left to deliver). The progress line reads the ledger alone (one
audit per line): plays ≥ delivered, pending = reportable − delivered − rejected.

Each run writes a new ledger database demo_<time> in the local ClickHouse of
--data-dir; the older ones beyond the last 3 are dropped at start (databases named
with --clickhouse-db, or on a --clickhouse-addr server, are never dropped).
Ctrl-C stops the run cleanly and prints what it had done (exit status 130).`

// demoConfig are the demo's knobs.
type demoConfig struct {
	events, devices     int
	rate, badShare      float64
	ingestShare         float64
	seed                int64
	storm, standby      time.Duration // least duration of each fault window
	stormAt, standbyAt  float64       // share of the events enriched when each opens
	stormRate           float64
	dataDir, logFile    string
	drainTimeout        time.Duration
	kafka               kafkax.Config
	clickhouse          analytics.Config
	progressEvery       time.Duration
	concurrency         int
	pages, lists, mixes int
	dropOld             bool // this run's ledger is a fresh demo_<time>: drop the old ones
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
	fs.Float64Var(&c.stormAt, "storm-at", 0.15, "the 500 storm starts when this share of the events (0–1) went through the consumer")
	fs.DurationVar(&c.storm, "storm", 2*time.Second, "least duration of the 500 storm; it also lasts until reports were answered during it (0: none)")
	fs.Float64Var(&c.stormRate, "storm-rate", 0.3, "share of play reports answered 500 during the storm")
	fs.Float64Var(&c.standbyAt, "standby-at", 0.5, "the standby window opens when this share of the events (0–1) went through the consumer (after the storm)")
	fs.DurationVar(&c.standby, "standby", 2*time.Second, "least duration of the standby window; it also lasts until standby answered a report (0: none)")
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
		c.dropOld = c.clickhouse.Addr == "" // only in the demo's own local server
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
	case c.stormAt < 0 || c.stormAt >= 1:
		return fmt.Errorf("--storm-at must be within 0–1 (a share of the events, below 1), got %g", c.stormAt)
	case c.standbyAt < 0 || c.standbyAt >= 1:
		return fmt.Errorf("--standby-at must be within 0–1 (a share of the events, below 1), got %g", c.standbyAt)
	case c.progressEvery <= 0:
		return fmt.Errorf("--progress must be > 0, got %s", c.progressEvery)
	case c.storm < 0:
		return fmt.Errorf("--storm must be ≥ 0 (0: none), got %s", c.storm)
	case c.standby < 0:
		return fmt.Errorf("--standby must be ≥ 0 (0: none), got %s", c.standby)
	case c.drainTimeout <= 0:
		return fmt.Errorf("--drain-timeout must be > 0, got %s", c.drainTimeout)
	case c.concurrency < 1:
		return fmt.Errorf("--concurrency must be ≥ 1, got %d", c.concurrency)
	case c.pages < 1 || c.lists < 1 || c.mixes < 1:
		return fmt.Errorf("--pages, --lists-per-page and --mixes-per-list must be ≥ 1, got %d, %d, %d", c.pages, c.lists, c.mixes)
	case c.dataDir == "":
		return errors.New("--data-dir must not be empty")
	}
	if err := c.kafka.Validate(); err != nil {
		return err
	}
	return c.clickhouse.Validate()
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
	p, err := harness.Start(ctx, harness.Config{
		Kafka:      c.kafka,
		Sandbox:    sandbox.Config{Seed: c.seed, Pages: c.pages, ListsPerPage: c.lists, MixesPerList: c.mixes, Logger: log},
		ClickHouse: c.clickhouse,
		Reporter:   reporter.Config{Concurrency: c.concurrency, ProbeInterval: 200 * time.Millisecond, BackoffMax: time.Second},
		Logger:     log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return demoInterrupted{summary: "interrupted while starting"}
		}
		return err
	}
	defer p.Close()
	kafkaNote := "embedded in-process broker (in memory, not durable)"
	if len(c.kafka.Brokers) > 0 {
		kafkaNote = strings.Join(c.kafka.Brokers, ",")
	}
	fmt.Fprintf(out, "  kafka       %s at %s\n  partner API built-in sandbox at %s\n  clickhouse  %s (database %s)\n",
		kafkaNote, strings.Join(p.Kafka.Brokers, ","), p.APIURL, p.ClickHouse.Addr, p.ClickHouse.Database)

	conn, err := p.ClickHouse.Open()
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	defer conn.Close()
	if c.dropOld {
		dropped, err := dropOldDemoDatabases(ctx, conn, p.ClickHouse.Database, demoKeepDatabases)
		if err != nil {
			log.Warn("dropping old demo ledgers", "err", err)
			fmt.Fprintf(out, "  (old demo ledgers not dropped: %v)\n", err)
		} else if len(dropped) > 0 {
			fmt.Fprintf(out, "  dropped %d old demo ledger(s), keeping the last %d: %s\n", len(dropped), demoKeepDatabases, strings.Join(dropped, ", "))
		}
	}

	// The ingest gateway, with a key made for this run.
	gw, err := startDemoGateway(ctx, p.Kafka, log)
	if err != nil {
		return err
	}
	defer gw.close()
	fmt.Fprintf(out, "  ingest      http://%s/v1/events\n\n", gw.addr)

	mixes, err := producer.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		if ctx.Err() != nil {
			return demoInterrupted{summary: "interrupted while reading the catalog"}
		}
		return fmt.Errorf("catalog walk: %w", err)
	}
	viaIngest := int(float64(c.events) * c.ingestShare)
	viaKafka := c.events - viaIngest
	var onTopic atomic.Int64 // events on the events topic (Kafka-acknowledged), as they are
	simCfg := producer.SimConfig{Kafka: p.Kafka, Mixes: mixes, Events: viaKafka, Rate: c.rate * float64(viaKafka) / float64(c.events),
		Devices: c.devices, BadShare: c.badShare, Seed: c.seed,
		// Small synchronous writes and a counting Record keep onTopic current.
		BatchSize: 100, Record: lineCounter{&onTopic}}
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
	fleetDone := make(chan error, 2)
	wg.Add(3)
	go func() {
		defer wg.Done()
		if viaKafka == 0 {
			fleetDone <- nil
			return
		}
		_, err := producer.Simulate(runCtx, simCfg)
		fleetDone <- err
	}()
	go func() {
		defer wg.Done()
		_, err := gw.send(runCtx, producer.SimConfig{Mixes: mixes, Events: viaIngest, Devices: c.devices, BadShare: c.badShare, Seed: c.seed + 1,
			Rate: c.rate * float64(viaIngest) / float64(c.events), Kafka: p.Kafka}, &onTopic)
		fleetDone <- err
	}()

	// The partner API's bad day, scheduled by the consumer's progress.
	var idle atomic.Bool // the fleet is done and the ledger drained
	faults := &demoSchedule{c: c, sb: p.Sandbox, out: out, start: start, idle: idle.Load,
		progress: func() float64 {
			if e := p.Enricher(); e != nil {
				return float64(e.Stats().Events) / float64(c.events)
			}
			return 0
		}}
	go func() {
		defer wg.Done()
		faults.run(runCtx)
	}()

	auditor, err := analytics.NewAuditor(conn, p.ClickHouse.Database)
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
			cancel()
			return interruptedSummary(out, auditor, window, p, start, onTopic.Load(), faults)
		case err := <-p.Errors():
			return fmt.Errorf("a role failed: %w", err)
		case err := <-fleetDone:
			if err != nil {
				if ctx.Err() != nil {
					continue // Ctrl-C: the next round prints the summary
				}
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
				if ctx.Err() != nil {
					continue
				}
				fmt.Fprintf(out, "  (audit not ready: %v)\n", err)
				continue
			}
			rep = r
			fmt.Fprintln(out, progressLine(time.Since(start), onTopic.Load(), r, p.Sandbox))
			isDrained := fleetsRunning == 0 && drained(r, onTopic.Load(), p)
			idle.Store(isDrained)
			if isDrained && faults.done() {
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

// progressLine is one line of the demo's progress. The fleet's count is the
// publisher's; everything else comes from one audit of the ledger, so the
// numbers agree with each other: plays ≥ delivered, and pending = plays −
// delivered − rejected. The partner API's own counters (its standby answers
// and mode) are labelled as such.
func progressLine(elapsed time.Duration, published int64, r *analytics.Report, sb *sandbox.Server) string {
	counts := sb.Counts()
	return fmt.Sprintf("%6.1fs  published %6d | ledger: events %6d  plays %6d  delivered %6d  rejected %4d  pending %5d | api: standby-answers %4d  %s",
		elapsed.Seconds(), published, r.EventsReceived, r.PlaysReportable, r.Delivered, r.RejectedByAPI, r.Pending, counts.Standby, sb.Mode())
}

// demoInterrupted ends a demo stopped by Ctrl-C or SIGTERM: exit status 130
// after the summary (the conventional status of a SIGINT).
type demoInterrupted struct{ summary string }

func (e demoInterrupted) Error() string { return e.summary }
func (demoInterrupted) ExitCode() int   { return 130 }

// interruptedSummary prints what an interrupted run did, from one last audit
// (on a context of its own: the run's is cancelled).
func interruptedSummary(out io.Writer, a *analytics.Auditor, window analytics.AuditOptions, p *harness.Pipeline, start time.Time, published int64, s *demoSchedule) error {
	actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	window.To = time.Now().Add(time.Minute)
	fmt.Fprintf(out, "\ninterrupted after %s; stopping the roles (each drains what it has in hand)…\n", time.Since(start).Round(100*time.Millisecond))
	led := p.Sandbox.Counts()
	fmt.Fprintf(out, "  fleet: %d events published\n", published)
	if r, err := a.Audit(actx, window); err == nil {
		fmt.Fprintf(out, "  ledger: %d events, %d reportable plays, %d delivered, %d rejected by the API, %d pending (not yet final)\n",
			r.EventsReceived, r.PlaysReportable, r.Delivered, r.RejectedByAPI, r.Pending)
	} else {
		fmt.Fprintf(out, "  ledger: not read (%v)\n", err)
	}
	fmt.Fprintf(out, "  partner API (sandbox ledger): %d reports accepted, %d answered by standby, %d duplicates\n", led.Accepted, led.Standby, led.Duplicates)
	fmt.Fprintf(out, "  faults: %s\n", s.summary())
	if p.ClickHouse.DataDir != "" {
		fmt.Fprintf(out, "  the ledger stays in %s, database %s (playpipe audit --clickhouse-data %s --clickhouse-db %s --from %s)\n",
			p.ClickHouse.DataDir, p.ClickHouse.Database, p.ClickHouse.DataDir, p.ClickHouse.Database, start.Add(-time.Minute).UTC().Format(time.RFC3339))
	}
	return demoInterrupted{summary: "interrupted; the run above is incomplete"}
}

// lineCounter counts the lines written to it: the simulator's Record writes
// one line per message Kafka acknowledged.
type lineCounter struct{ n *atomic.Int64 }

func (l lineCounter) Write(p []byte) (int, error) {
	l.n.Add(int64(bytes.Count(p, []byte{'\n'})))
	return len(p), nil
}

// drained reports whether every event on the topic went through the consumer
// and every reportable play reached a final outcome, as the ledger shows.
func drained(r *analytics.Report, onTopic int64, p *harness.Pipeline) bool {
	e := p.Enricher()
	if e == nil || r.EventsReceived < uint64(onTopic) {
		return false
	}
	st := e.Stats()
	return st.Events >= onTopic && r.PlaysDerived == uint64(st.Plays) && r.Pending == 0 &&
		r.Delivered+r.RejectedByAPI == r.PlaysReportable
}

func finishDemo(ctx context.Context, out io.Writer, a *analytics.Auditor, window analytics.AuditOptions, p *harness.Pipeline, start time.Time) error {
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
		fmt.Fprintf(out, "\nThe ledger stays in %s; audit it again, or list the report ids behind a number, with:\n  playpipe audit --clickhouse-data %s --clickhouse-db %s --from %s [--list delivered] [--html audit.html]\n",
			p.ClickHouse.DataDir, p.ClickHouse.DataDir, p.ClickHouse.Database, start.Add(-time.Minute).UTC().Format(time.RFC3339))
	}
	return nil
}

// demoKeepDatabases is how many demo ledgers (demo_<time> databases) a demo
// run keeps in its local ClickHouse, its own included.
const demoKeepDatabases = 3

// dropOldDemoDatabases drops the demo_<time> databases older than the last
// keep (current included; the names sort by time). It returns their names.
func dropOldDemoDatabases(ctx context.Context, conn driver.Conn, current string, keep int) ([]string, error) {
	rows, err := conn.Query(ctx, "SELECT name FROM system.databases WHERE name LIKE 'demo\\_%'")
	if err != nil {
		return nil, fmt.Errorf("list databases: %w", err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return nil, err
		}
		if demoDBRE.MatchString(n) && n != current {
			names = append(names, n)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	sort.Strings(names)
	var dropped []string
	for len(names) > keep-1 {
		n := names[0]
		names = names[1:]
		if err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+n); err != nil {
			return dropped, fmt.Errorf("drop %s: %w", n, err)
		}
		dropped = append(dropped, n)
	}
	return dropped, nil
}

// demoDBRE matches the names runDemo gives its ledgers.
var demoDBRE = regexp.MustCompile(`^demo_[0-9]{8}_[0-9]{6}$`)

// demoSchedule drives the sandbox's 500 storm and standby window by progress:
// each opens when the consumer has gone through its share of the events and
// closes when it has lasted its least duration and the partner API answered
// reports during it — so both overlap traffic on a fast or a slow machine —
// or when nothing is left to deliver (idle).
type demoSchedule struct {
	c        demoConfig
	sb       *sandbox.Server
	out      io.Writer
	start    time.Time
	progress func() float64 // share of the events through the consumer
	idle     func() bool    // fleet done, ledger drained
	finished atomic.Bool

	mu           sync.Mutex
	stormAnswers int64 // reports accepted while the storm was on
	standbyAns   int64 // reports answered by standby during the window
	notes        []string
}

func (s *demoSchedule) done() bool { return s.finished.Load() }

func (s *demoSchedule) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.notes) == 0 {
		return "none happened yet"
	}
	return strings.Join(s.notes, "; ")
}

func (s *demoSchedule) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.notes = append(s.notes, msg)
	s.mu.Unlock()
	fmt.Fprintf(s.out, "%6.1fs  >>> partner API: %s\n", time.Since(s.start).Seconds(), msg)
}

// waitFor polls cond until it holds (true) or ctx ends (false).
func waitFor(ctx context.Context, cond func() bool) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

func (s *demoSchedule) run(ctx context.Context) {
	defer s.finished.Store(true)
	if s.c.storm > 0 {
		if !waitFor(ctx, func() bool { return s.progress() >= s.c.stormAt || s.idle() }) {
			return
		}
		s.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: s.c.stormRate}})
		at := s.progress()
		s.say("500 storm begins (%.0f%% of play reports) at %.0f%% of the events", s.c.stormRate*100, at*100)
		acc0, t0 := s.sb.Counts().Accepted, time.Now()
		// At least 20 reports accepted during the storm: with a 30 % rate the
		// chance that none of the posts around them was answered 500 is ~0.
		ok := waitFor(ctx, func() bool {
			return (time.Since(t0) >= s.c.storm && s.sb.Counts().Accepted-acc0 >= 20) || s.idle()
		})
		s.sb.SetFaults(sandbox.Faults{})
		if !ok {
			return
		}
		s.mu.Lock()
		s.stormAnswers = s.sb.Counts().Accepted - acc0
		s.mu.Unlock()
		s.say("500 storm over after %s (%d reports accepted during it)", time.Since(t0).Round(100*time.Millisecond), s.stormAnswers)
	}
	if s.c.standby > 0 {
		if !waitFor(ctx, func() bool { return s.progress() >= s.c.standbyAt || s.idle() }) {
			return
		}
		s.sb.SetMode(sandbox.ModeStandby)
		s.say("failover to STANDBY (reports answered 200 but not forwarded) at %.0f%% of the events", s.progress()*100)
		sb0, t0 := s.sb.Counts().Standby, time.Now()
		ok := waitFor(ctx, func() bool {
			return (time.Since(t0) >= s.c.standby && s.sb.Counts().Standby-sb0 >= 1) || s.idle()
		})
		s.sb.SetMode(sandbox.ModeLive)
		if !ok {
			return
		}
		s.mu.Lock()
		s.standbyAns = s.sb.Counts().Standby - sb0
		s.mu.Unlock()
		s.say("live service is back after %s (%d reports answered by standby, to be replayed)", time.Since(t0).Round(100*time.Millisecond), s.standbyAns)
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
// returns how many it accepted onto the events topic (also added to onTopic
// as they are accepted).
func (g *demoGateway) send(ctx context.Context, cfg producer.SimConfig, onTopic *atomic.Int64) (int, error) {
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
		onTopic.Add(int64(ir.Accepted))
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
