//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/testkit/kafkanode"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// options are the benchmark's flags.
type options struct {
	mode   string // "e2e" (the whole pipeline) or "report" (reporter vs plain client)
	bin    string
	events int
	warmup int // events of unmeasured first rounds
	// warmupRounds: the rounds -warmup's events are split into.
	warmupRounds int
	// idle: how long the broker's CPU is measured with the pipeline idle,
	// before the measured round.
	idle time.Duration
	// floorRecords: records of Kafka's own perf tools after an e2e run on
	// Apache Kafka (0: none).
	floorRecords int
	// brokerProfile: the file name of a JFR recording of the Apache
	// Kafka broker over each measured round ("": none).
	brokerProfile string
	// reportProfile: the file name of CPU profiles of the reporter over
	// each measured round (-mode e2e).
	reportProfile string
	// roundsSet: -rounds was given (-kafka both: pairs of runs).
	roundsSet   bool
	concurrency int
	partitions  int
	kafka       string // kafkaKfake or kafkaApache
	seed        int64
	badShare    float64
	keep        bool
	timeout     time.Duration
	reports     int    // -mode report: play reports per round
	rounds      int    // -mode report: rounds of (reporter, plain client)
	profile     string // -mode report: file for a CPU profile of the first reporter round
	// -mode latency: the sandbox's answer latencies, and the plain
	// client's in flight at each.
	latencies     string
	plainInflight string
	reportArgs    string  // -mode e2e and latency: extra flags of `playpipe report` (default: none)
	errorRates    string  // -mode latency: shares of posts the sandbox answers 500, each run at every latency
	poisonShare   float64 // -mode latency: share of reports of a track the sandbox answers 500 every time (0: no such round)
	hangShare     float64 // -mode latency: share of reports of a track the sandbox holds past the reporter's timeout (0: no such round)
	hangHold      time.Duration
	holdRate      float64 // -mode latency: share of all posts the sandbox holds past the reporter's timeout at random (0: no such round)
}

// minWarmup is the least -warmup by default, in events (about 530 000
// plays). Apache Kafka's JIT compiler still took 12–15 µs of the broker's
// CPU per play in a round after 40 000 warm-up events, 5–9 µs after 120 000
// (2-core machine, 2026-11-29): a broker in service has long compiled its
// hot code, and the floor (floor.go) is measured on the node after the
// pipeline ran.
const minWarmup = 120000

func parseOptions(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.mode, "mode", "e2e", "e2e: the whole pipeline, then the raw ceiling; report: a fresh `playpipe report` process against a plain net/http client on the same N reports, interleaved rounds; latency: the same with the sandbox answering after each of -latencies, the reporter with default flags")
	fs.StringVar(&o.latencies, "latencies", "0s,5ms,50ms,150ms", "-mode latency: the sandbox's answer latencies, comma-separated")
	fs.StringVar(&o.reportArgs, "report-args", "", "extra flags of `playpipe report`, space-separated (e.g. \"--producers 2\"; -mode latency: \"--concurrency 4096\"); default none: the reporter's defaults")
	fs.StringVar(&o.errorRates, "error-rates", "0", "-mode latency: shares of posts the sandbox answers 500 (seeded with -seed), comma-separated; every latency runs once per rate, the plain client retrying a 500 with the reporter's default backoff (e.g. \"0,0.001,0.01,0.02\")")
	fs.Float64Var(&o.hangShare, "hang-share", 0, "-mode latency: after the poison round, one round in which this share of the reports (0–0.5) are of one track whose every report the sandbox holds -hang-hold (past the reporter's --api-timeout) and then answers 500: a partner hanging on one payload; the reporter with its defaults, the plain client dropping those reports at once")
	fs.Float64Var(&o.holdRate, "hold-rate", 0, "-mode latency: after the hang round, one round in which the sandbox holds this share of all posts (0–0.5, any track, retries drawn again; seeded) -hang-hold, past the reporter's --api-timeout, then answers 500; the plain client with the reporter's in-flight cap (--max-concurrency's default), --api-timeout and retries: every report delivered once by both, their rates between half and nine tenths of the reports compared")
	fs.DurationVar(&o.hangHold, "hang-hold", 35*time.Second, "-mode latency: how long the sandbox holds each report of the hang round's track (the reporter's default --api-timeout is 30s)")
	fs.Float64Var(&o.poisonShare, "poison-share", 0, "-mode latency: after each latency's error-rate rounds, one round in which this share of the reports (0–0.5) are of one track whose every report the sandbox answers 500 (a poison track): the reporter with its defaults, the plain client dropping those reports at once; the other reports' rate against the round with no fault (-error-rates must include 0)")
	fs.StringVar(&o.plainInflight, "plain-inflight", "512,512,512,1024", "-mode latency: the plain client's in flight at each latency (one value: all)")
	fs.IntVar(&o.reports, "reports", 100000, "-mode report: play reports per round (pre-enriched TrackPlay records on a fresh reports topic)")
	fs.IntVar(&o.rounds, "rounds", 3, "-mode report: rounds, each a reporter run and a plain-client run")
	fs.StringVar(&o.profile, "profile", "", "-mode report: write a 3 s CPU profile of the first reporter round to this file, and its allocation profile to <file>.allocs (the reporter runs with --pprof); -mode latency: a 3 s CPU profile of each run at a third of its reports to <file>.<latency>")
	fs.StringVar(&o.bin, "bin", "bin/playpipe", "the playpipe binary to run (make build makes it)")
	fs.IntVar(&o.events, "events", 40000, "player events to publish (about 4.4 plays each with the sandbox's default catalog; 40000 take ~30 s on a 2-core machine)")
	fs.IntVar(&o.warmup, "warmup", -1, "events of unmeasured first rounds (-warmup-rounds) through the same pipeline (other seeds): the broker's JVM compiles its hot code (a fresh node spends half its CPU in its JIT compiler for tens of seconds), caches fill (default: twice -events, at least minWarmup; 0: none)")
	fs.IntVar(&o.warmupRounds, "warmup-rounds", 3, "the unmeasured rounds -warmup's events are split into: each round's start (a new publisher, the backlog's phases) made the broker's JVM throw away and compile again code it had compiled in the round before, less each time")
	fs.DurationVar(&o.idle, "idle", 3*time.Second, "-mode e2e: measure the broker's CPU this long with every role up and nothing published, before the measured round (0: not)")
	fs.IntVar(&o.floorRecords, "floor-records", 300000, "e2e on Apache Kafka: records (300 bytes) that Kafka's own ProducerPerformance writes and ConsumerPerformance reads on the same node after the run, for the floor of the broker's CPU per play (0: no floor)")
	fs.StringVar(&o.brokerProfile, "broker-profile", "", "e2e on Apache Kafka: record the broker JVM with Java Flight Recorder (jcmd JFR.start, the JDK's profile settings with a Java stack sample every 1 ms) over each measured round into <file>.<hhmmss>.jfr and print its request threads' CPU per play by Kafka API (a recording over the warm-up first, discarded: starting the recorder recompiles the broker's hot code; the recorder's own work remains in the round's broker CPU, so take the broker's figures from rounds without it)")
	fs.StringVar(&o.reportProfile, "report-profile", "", "-mode e2e: run the reporter with --pprof and write a CPU profile of its first 5 s of each measured round to <file>.<broker>.<hhmmss>.pprof (go tool pprof -top bin/playpipe FILE): where its CPU per play goes in that round")
	fs.IntVar(&o.concurrency, "concurrency", reporter.DefaultConcurrency, "reports in flight: the reporter's --concurrency and the plain client's goroutines (default: playpipe report's own)")
	fs.IntVar(&o.partitions, "partitions", 6, "partitions of every topic")
	fs.StringVar(&o.kafka, "kafka", kafkaKfake, "the broker: kfake (the embedded fake, in this process) or apache (one Apache Kafka node, KRaft, from the jars `make kafka` resolved; PLAYPIPE_KAFKA_VERSION picks the release): its JVM's CPU and peak RSS are the broker's; -mode e2e also takes both: kfake then apache, -rounds pairs (default 1), and a comparison")
	fs.Int64Var(&o.seed, "seed", 1, "simulator seed (the same seed sends the same events)")
	fs.Float64Var(&o.badShare, "bad-share", 0.05, "share of bad events the simulator sends (0–1)")
	fs.BoolVar(&o.keep, "keep", false, "keep the run folder (process logs) instead of removing it")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up when the pipeline has not finished within this")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: go run ./tools/bench [flags]\n\nThe end-to-end benchmark: every role a process; see `go doc ./tools/bench`.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return o, err
		}
		return o, errUsage
	}
	bad := func(name string, v any, accepted string) (options, error) {
		fmt.Fprintf(stderr, "-%s %v: accepted %s\n", name, v, accepted)
		return o, errUsage
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "unexpected arguments %q: bench takes flags only\n", fs.Args())
		return o, errUsage
	case o.mode != "e2e" && o.mode != "report" && o.mode != "latency":
		return bad("mode", o.mode, "e2e, report or latency")
	case o.reports < 1:
		return bad("reports", o.reports, "1 or more")
	case o.rounds < 1 || o.rounds > 100:
		return bad("rounds", o.rounds, "1–100")
	case o.events < 1:
		return bad("events", o.events, "1 or more")
	case o.warmup < -1:
		return bad("warmup", o.warmup, "0 or more")
	case o.warmupRounds < 1:
		return bad("warmup-rounds", o.warmupRounds, "1 or more")
	case o.concurrency < 1 || o.concurrency > 1024:
		return bad("concurrency", o.concurrency, "1–1024")
	case o.kafka != kafkaKfake && o.kafka != kafkaApache && (o.kafka != kafkaBoth || o.mode != "e2e"):
		return bad("kafka", o.kafka, kafkaKfake+" or "+kafkaApache+" (-mode e2e: or "+kafkaBoth+")")
	case o.idle < 0:
		return bad("idle", o.idle, "0 or more")
	case o.floorRecords < 0:
		return bad("floor-records", o.floorRecords, "0 or more")
	case o.partitions < 1 || o.partitions > 1000:
		return bad("partitions", o.partitions, "1–1000")
	case o.badShare < 0 || o.badShare > 1:
		return bad("bad-share", o.badShare, "0–1")
	case o.timeout <= 0:
		return bad("timeout", o.timeout, "a positive duration")
	}
	if o.mode == "latency" {
		if _, _, err := parseLatencies(o.latencies, o.plainInflight); err != nil {
			fmt.Fprintln(stderr, err)
			return o, errUsage
		}
		if _, err := parseErrorRates(o.errorRates); err != nil {
			fmt.Fprintln(stderr, err)
			return o, errUsage
		}
		if o.hangShare < 0 || o.hangShare > 0.5 {
			return bad("hang-share", o.hangShare, "a share of 0–0.5")
		}
		if o.holdRate < 0 || o.holdRate > 0.5 {
			return bad("hold-rate", o.holdRate, "a share of 0–0.5")
		}
		if o.poisonShare < 0 || o.poisonShare > 0.5 {
			return bad("poison-share", o.poisonShare, "a share of 0–0.5")
		}
	}
	fs.Visit(func(f *flag.Flag) { o.roundsSet = o.roundsSet || f.Name == "rounds" })
	if o.warmup < 0 {
		o.warmup = max(2*o.events, minWarmup)
	}
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return o, fmt.Errorf("-bin %q: %w", o.bin, err)
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() {
		fmt.Fprintf(stderr, "-bin %q: not a file (run `make build` first): %v\n", o.bin, err)
		return o, errUsage
	}
	o.bin = bin
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseOptions(args, stderr)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if o.mode == "latency" {
		runs, started, err := runLatencyBench(ctx, o, log)
		if len(runs) > 0 {
			printLatency(stdout, o, runs, started)
			printPoison(stdout, runs)
			printHold(stdout, runs)
		}
		return err
	}
	if o.mode == "report" {
		rr, err := runReportBench(ctx, o, log)
		if err != nil {
			return err
		}
		rr.print(stdout, o)
		return nil
	}
	if o.kafka == kafkaBoth {
		return runBoth(ctx, o, log, stdout)
	}
	res, err := runBench(ctx, o, log)
	if err != nil {
		return err
	}
	res.print(stdout, o)
	return nil
}

// The brokers -kafka accepts.
const (
	kafkaKfake  = "kfake"
	kafkaApache = "apache"
	kafkaBoth   = "both" // -mode e2e: kfake, then apache, compared
)

// brokerDesc names the run's broker for the tables' headings.
func brokerDesc(o options) string {
	if o.kafka == kafkaKfake {
		return "broker: kfake (embedded fake, in the bench process)"
	}
	v := os.Getenv("PLAYPIPE_KAFKA_VERSION")
	if v == "" {
		v = kafkanode.DefaultVersion
	}
	return "broker: Apache Kafka " + v + " (one KRaft node, a JVM)"
}
