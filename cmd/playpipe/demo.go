package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
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
	registerKafkaFlags(fs, &c.kafka)
	registerClickHouseFlags(fs, &c.clickhouse)
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
	dbSet := os.Getenv(envClickHouseDatabase) != ""
	fs.Visit(func(f *flag.Flag) { dbSet = dbSet || f.Name == "clickhouse-db" })
	if !dbSet {
		c.clickhouse.Database = "demo_" + time.Now().UTC().Format("20060102_150405")
		c.dropOld = c.clickhouse.Addr == "" // only in the demo's own local server
	}
	return demoMain(ctx, c, stdout)
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
	case c.clickhouse.Cluster != "":
		return errors.New("--clickhouse-cluster: the demo writes a ledger of its own on one server (demo_<time>); migrate and sink take a cluster")
	}
	if err := c.kafka.Validate(); err != nil {
		return err
	}
	return c.clickhouse.Validate()
}

// demoRun is one run of the demo: the harness with its ledger connection
// and ingest gateway, and what the fleet has put on the events topic.
type demoRun struct {
	c       demoConfig
	out     io.Writer
	log     *slog.Logger
	start   time.Time
	p       *demo.Pipeline
	conn    driver.Conn
	gw      *demoGateway
	onTopic atomic.Int64 // events on the events topic (Kafka-acknowledged), as they are
	closers []func()
}

func demoMain(ctx context.Context, c demoConfig, out io.Writer) error {
	d := &demoRun{c: c, out: out}
	defer d.close()
	if err := d.setUp(ctx); err != nil {
		return err
	}
	mixes, err := simulator.CatalogFromAPI(ctx, d.p.API, 0)
	if err != nil {
		if ctx.Err() != nil {
			return demoInterrupted{summary: "interrupted while reading the catalog"}
		}
		return fmt.Errorf("catalog walk: %w", err)
	}
	// The fleet and the fault schedule run in goroutines owned here: on any
	// return they are cancelled and waited for before the pipeline closes.
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	d.out = &syncWriter{w: d.out} // the schedule and the progress line both print
	fleetDone := d.startFleet(runCtx, &wg, mixes)

	// The partner API's bad day, scheduled by the consumer's progress.
	var idle atomic.Bool // the fleet is done and the ledger drained
	faults := &demoSchedule{c: c, sb: d.p.Sandbox, out: d.out, start: d.start, idle: idle.Load,
		progress: func() float64 {
			if e := d.p.Enricher(); e != nil {
				return float64(e.Stats().Events) / float64(c.events)
			}
			return 0
		}}
	wg.Add(1)
	go func() {
		defer wg.Done()
		faults.run(runCtx)
	}()
	return d.watch(ctx, cancel, fleetDone, faults, &idle)
}

// close stops what setUp started, in reverse order.
func (d *demoRun) close() {
	for i := len(d.closers) - 1; i >= 0; i-- {
		d.closers[i]()
	}
}

// setUp opens the log file, starts the harness (embedded or configured
// Kafka, the built-in sandbox, the local or configured ClickHouse), drops
// the old demo ledgers and starts the ingest gateway, saying so on out.
func (d *demoRun) setUp(ctx context.Context) error {
	c := &d.c
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
	d.closers = append(d.closers, func() { lf.Close() })
	d.log = slog.New(slog.NewTextHandler(lf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if c.clickhouse.Addr == "" && c.clickhouse.DataDir == "" {
		c.clickhouse.DataDir = filepath.Join(c.dataDir, "clickhouse")
	}

	fmt.Fprintf(d.out, "playpipe %s demo — logs in %s\n", version.Version, c.logFile)
	d.start = time.Now()
	d.p, err = demo.Start(ctx, demo.Config{
		Kafka:      c.kafka,
		Sandbox:    sandbox.Config{Seed: c.seed, Pages: c.pages, ListsPerPage: c.lists, MixesPerList: c.mixes, Logger: d.log},
		ClickHouse: c.clickhouse,
		Reporter:   reporter.Config{Concurrency: c.concurrency, ProbeInterval: 200 * time.Millisecond, BackoffMax: time.Second},
		Logger:     d.log,
	})
	if err != nil {
		if ctx.Err() != nil {
			return demoInterrupted{summary: "interrupted while starting"}
		}
		return err
	}
	d.closers = append(d.closers, func() { d.p.Close() })
	kafkaNote := "embedded in-process broker (in memory, not durable)"
	if len(c.kafka.Brokers) > 0 {
		kafkaNote = strings.Join(c.kafka.Brokers, ",")
	}
	fmt.Fprintf(d.out, "  kafka       %s at %s\n  partner API built-in sandbox at %s\n  clickhouse  %s (database %s)\n",
		kafkaNote, strings.Join(d.p.Kafka.Brokers, ","), d.p.APIURL, d.p.ClickHouse.Addr, d.p.ClickHouse.Database)
	if err := d.openLedger(ctx); err != nil {
		return err
	}
	// The ingest gateway, with a key made for this run.
	if d.gw, err = startDemoGateway(ctx, d.p.Kafka, d.log); err != nil {
		return err
	}
	d.closers = append(d.closers, d.gw.close)
	fmt.Fprintf(d.out, "  ingest      http://%s/v1/events\n\n", d.gw.addr)
	return nil
}

// openLedger connects to the ledger and, for a demo_<time> ledger of the
// demo's own server, drops the old ones.
func (d *demoRun) openLedger(ctx context.Context) error {
	conn, err := d.p.ClickHouse.Open()
	if err != nil {
		return fmt.Errorf("clickhouse: %w", err)
	}
	d.conn = conn
	d.closers = append(d.closers, func() { conn.Close() })
	if !d.c.dropOld {
		return nil
	}
	dropped, err := dropOldDemoDatabases(ctx, conn, d.p.ClickHouse.Database, demoKeepDatabases)
	if err != nil {
		d.log.Warn("dropping old demo ledgers", "err", err)
		fmt.Fprintf(d.out, "  (old demo ledgers not dropped: %v)\n", err)
	} else if len(dropped) > 0 {
		fmt.Fprintf(d.out, "  dropped %d old demo ledger(s), keeping the last %d: %s\n", len(dropped), demoKeepDatabases, strings.Join(dropped, ", "))
	}
	return nil
}

// startFleet starts the simulated fleet: most segments through Kafka with
// kafka-go, the --ingest-share through the ingest gateway. Each of the two
// sends its outcome on the returned channel.
func (d *demoRun) startFleet(ctx context.Context, wg *sync.WaitGroup, mixes []simulator.MixInfo) <-chan error {
	c := d.c
	viaIngest := int(float64(c.events) * c.ingestShare)
	viaKafka := c.events - viaIngest
	simCfg := simulator.Config{Kafka: d.p.Kafka, Mixes: mixes, Events: viaKafka, Rate: c.rate * float64(viaKafka) / float64(c.events),
		Devices: c.devices, BadShare: c.badShare, Seed: c.seed,
		// Small synchronous writes and a counting Record keep onTopic current.
		BatchSize: 100, Record: lineCounter{&d.onTopic}}
	fmt.Fprintf(d.out, "fleet: %d devices publish %d segments over %d mixes (%d via kafka-go, %d via the ingest gateway), %.0f%% bad\n",
		c.devices, c.events, len(mixes), viaKafka, viaIngest, c.badShare*100)
	fleetDone := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		if viaKafka == 0 {
			fleetDone <- nil
			return
		}
		_, err := simulator.Run(ctx, simCfg)
		fleetDone <- err
	}()
	go func() {
		defer wg.Done()
		_, err := d.gw.send(ctx, simulator.Config{Mixes: mixes, Events: viaIngest, Devices: c.devices, BadShare: c.badShare, Seed: c.seed + 1,
			Rate: c.rate * float64(viaIngest) / float64(c.events), Kafka: d.p.Kafka}, &d.onTopic)
		fleetDone <- err
	}()
	return fleetDone
}

// watch prints the progress line until the pipeline drained and the fault
// schedule is done (then the final audit), a role or the fleet fails, the
// drain times out, or ctx ends (then the interrupted summary).
func (d *demoRun) watch(ctx context.Context, cancel context.CancelFunc, fleetDone <-chan error, faults *demoSchedule, idle *atomic.Bool) error {
	auditor, err := analytics.NewAuditor(d.conn, d.p.ClickHouse.Database)
	if err != nil {
		return err
	}
	window := analytics.AuditOptions{From: d.start.Add(-time.Minute)}
	tick := time.NewTicker(d.c.progressEvery)
	defer tick.Stop()
	fleetsRunning := 2
	var drainDeadline time.Time
	for {
		select {
		case <-ctx.Done():
			cancel()
			return interruptedSummary(d.out, auditor, window, d.p, d.start, d.onTopic.Load(), faults)
		case err := <-d.p.Errors():
			return fmt.Errorf("a role failed: %w", err)
		case err := <-fleetDone:
			if err != nil {
				if ctx.Err() != nil {
					continue // Ctrl-C: the next round prints the summary
				}
				return fmt.Errorf("fleet: %w", err)
			}
			if fleetsRunning--; fleetsRunning == 0 {
				drainDeadline = time.Now().Add(d.c.drainTimeout)
				fmt.Fprintf(d.out, "fleet done: %d events on the topic; draining…\n", d.onTopic.Load())
			}
		case <-tick.C:
			window.To = time.Now().Add(time.Minute)
			r, err := auditor.Audit(ctx, window)
			if err != nil {
				if ctx.Err() == nil {
					fmt.Fprintf(d.out, "  (audit not ready: %v)\n", err)
				}
				continue
			}
			fmt.Fprintln(d.out, progressLine(time.Since(d.start), d.onTopic.Load(), r, d.p.Sandbox))
			isDrained := fleetsRunning == 0 && drained(r, d.onTopic.Load(), d.p)
			idle.Store(isDrained)
			if isDrained && faults.done() {
				return finishDemo(ctx, d.out, auditor, window, d.p, d.start)
			}
			if fleetsRunning == 0 && time.Now().After(drainDeadline) {
				_ = analytics.WriteAudit(d.out, r, "table")
				return fmt.Errorf("the pipeline did not drain within --drain-timeout %s", d.c.drainTimeout)
			}
		}
	}
}

// progressLine is one line of the demo's progress. The fleet's count is the
// publisher's; everything else comes from one audit of the ledger, so the
// numbers agree with each other: plays ≥ delivered, and pending = plays −
// delivered − rejected. The partner API's own counters (its standby answers
// and mode) are labelled as such.
func progressLine(elapsed time.Duration, published int64, r *analytics.Audit, sb *sandbox.Server) string {
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
func interruptedSummary(out io.Writer, a *analytics.Auditor, window analytics.AuditOptions, p *demo.Pipeline, start time.Time, published int64, s *demoSchedule) error {
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
func drained(r *analytics.Audit, onTopic int64, p *demo.Pipeline) bool {
	e := p.Enricher()
	if e == nil || r.EventsReceived < uint64(onTopic) {
		return false
	}
	st := e.Stats()
	return st.Events >= onTopic && r.PlaysDerived == uint64(st.Plays) && r.Pending == 0 &&
		r.Delivered+r.RejectedByAPI == r.PlaysReportable
}

func finishDemo(ctx context.Context, out io.Writer, a *analytics.Auditor, window analytics.AuditOptions, p *demo.Pipeline, start time.Time) error {
	window.To = time.Now().Add(time.Minute)
	r, err := a.Audit(ctx, window)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\ndrained in %s. The audit of this run (playpipe audit):\n\n", time.Since(start).Round(100*time.Millisecond))
	if err := analytics.WriteAudit(out, r, "table"); err != nil {
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
