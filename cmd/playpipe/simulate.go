package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/producer/simulator"
)

func init() {
	register(command{
		name:    "simulate",
		summary: "fleet simulator: publish realistic listening segments (and bad events) with kafka-go",
		run:     runSimulate,
	})
}

const simulateSynopsis = `Publishes player events of a simulated fleet to <prefix>.events through segmentio/kafka-go
(a second, independent Kafka client): many devices and users in several countries listening
naturally (playing through, pausing, seeking, skipping, stopping mid-track, cached plays), plus
a share of bad events (malformed JSON, missing fields, unknown mix, bad country). The same
--seed sends the same events. Prints what it sent, by kind. Guide: docs/producer.md.

The catalog comes from --mixes, or by walking the partner API (catalog → pages → lists →
mixes) at --api-url, or of a built-in sandbox with --sandbox (seed 1, the same catalog as
every playpipe sandbox with seed 1). One of the three is required.

Example:
  playpipe simulate --brokers 127.0.0.1:9092 --events 20000 --rate 5000 --bad-share 0.05`

func runSimulate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("simulate", stderr, simulateSynopsis)
	f := newSimulateFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := f.lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	tel, err := telemetry.StartRole(ctx, "simulate", "off", log) // OTEL_* export of the simulator's spans; no admin port
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = tel.Close(cctx)
	}()
	if len(f.kcfg.Brokers) == 0 || f.kcfg.Embedded {
		fmt.Fprintln(stderr, "playpipe simulate: --brokers is required (env PLAYPIPE_BROKERS): the simulator publishes to a running Kafka, e.g. the one of docker compose or playpipe demo")
		return errUsage
	}
	if err := f.kcfg.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	catalog, stopAPI, err := f.catalog(ctx, log, tel.Providers, stderr)
	if err != nil {
		return err
	}
	defer stopAPI()
	start := *f.startMS // 0 stays 0 in the Config: the default start, held to the clock from both sides
	if start == 0 {
		start = simulator.DefaultStart(time.Now())
	}
	cfg := simulator.Config{
		Kafka: f.kcfg, Mixes: catalog, Events: *f.events, Rate: *f.ratePS, Devices: *f.devices, Users: *f.users,
		BadShare: *f.badShare, Seed: *f.seed, StartMS: *f.startMS, BatchSize: *f.batch, BatchTimeout: *f.batchTO,
		TracerProvider: tel.Providers.Tracer, Propagator: tel.Providers.Propagator,
	}
	if *f.record != "" {
		rf, err := os.Create(*f.record)
		if err != nil {
			return fmt.Errorf("--record: %w", err)
		}
		defer rf.Close()
		cfg.Record = rf
	}
	if _, err := simulator.NewGenerator(cfg); err != nil { // flag errors before connecting
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	log.Info("simulate: publishing", "topic", f.kcfg.Topics().Events, "events", *f.events, "rate", *f.ratePS, "devices", *f.devices,
		"bad_share", *f.badShare, "seed", *f.seed, "start_ms", start, "mixes", len(catalog))
	stats, err := simulator.Run(ctx, cfg)
	fmt.Fprintln(stdout, stats)
	if err != nil && !errors.Is(err, context.Canceled) { // interrupted: what was sent is printed
		return err
	}
	return nil
}

// simulateFlags are the flags of playpipe simulate.
type simulateFlags struct {
	lf   logFlags
	kcfg kafkax.Config
	api  apiTarget

	events, devices, users, maxMixes, batch *int
	ratePS, badShare                        *float64
	seed, startMS                           *int64
	mixes, record                           *string
	batchTO                                 *time.Duration
}

func newSimulateFlags(fs *flag.FlagSet) *simulateFlags {
	f := &simulateFlags{
		events:   fs.Int("events", 10000, "messages to send"),
		ratePS:   fs.Float64("rate", 0, "messages per second; 0: as fast as Kafka takes them"),
		devices:  fs.Int("devices", 200, "devices in the fleet"),
		users:    fs.Int("users", 0, "distinct users; 0: 80% of --devices"),
		badShare: fs.Float64("bad-share", 0.05, "share of bad messages, 0–1, spread evenly over malformed_json, missing_field, unknown_mix, bad_country"),
		seed:     fs.Int64("seed", 1, "random seed: the same seed and flags send the same messages"),
		startMS:  fs.Int64("start-ms", 0, "the simulated clock's start, epoch ms; 0: 28 days before today (UTC), so that the events lie within the consumer's plausible-time window (--time-window-back 720h); the simulated clocks advance ~4.5 min × events / devices but are held to the simulator's clock: never ahead of now, and with the default start never more than 29 days behind"),
		mixes:    fs.String("mixes", "", "the catalog without the partner API: id:length[@start/start/…],… with length and track starts in ms or as Go durations (101:60m@0/4m/9m30s)"),
		maxMixes: fs.Int("max-mixes", 0, "use at most this many mixes of the partner API's catalog; 0: all"),
		record:   fs.String("record", "", "write every message Kafka acknowledged to this file, one JSON line each: {kind, key, value}"),
		batch:    fs.Int("batch-size", 2000, "messages per synchronous kafka-go write (each write waits up to --batch-timeout for partition batches to fill)"),
		batchTO:  fs.Duration("batch-timeout", 2*time.Millisecond, "kafka-go Writer.BatchTimeout: how long a partition batch waits to fill (kafka-go's own default, 1s, makes synchronous writes crawl)"),
	}
	registerKafkaFlags(fs, &f.kcfg)
	f.api.register(fs, "walk the catalog of")
	f.lf.register(fs.StringVar)
	// The simulator publishes to a running Kafka: it has no embedded broker.
	fs.Lookup("brokers").Usage = "Kafka seed brokers, comma separated (env PLAYPIPE_BROKERS); required: the simulator publishes to a running Kafka (it starts no embedded broker)"
	hideFlags(fs, "simulate", simulateSynopsis, "embedded-kafka", "embedded-kafka-port")
	return f
}

// catalog returns the mixes to listen to: --mixes, or the partner API's
// (--api-url or --sandbox, its client instrumented by tel) walked; stop ends
// the sandbox, when one was started.
func (f *simulateFlags) catalog(ctx context.Context, log *slog.Logger, tel telemetry.Providers, stderr io.Writer) (mixes []simulator.MixInfo, stop func(), err error) {
	if *f.mixes != "" {
		mixes, err = parseMixes(*f.mixes)
		if err != nil {
			fmt.Fprintf(stderr, "--mixes: %v\n", err)
			return nil, nil, errUsage
		}
		return mixes, func() {}, nil
	}
	if f.api.cfg.BaseURL == "" && !f.api.sandbox {
		return nil, nil, usageError{errors.New("no catalog: pass --mixes, --api-url (env PLAYPIPE_API_URL) to walk the partner API's catalog, or --sandbox to walk a built-in sandbox's (seed 1)")}
	}
	client, stopAPI, err := f.api.open(log, tel)
	if err != nil {
		return nil, nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	mixes, err = simulator.CatalogFromAPI(wctx, client, *f.maxMixes)
	cancel()
	if err != nil {
		stopAPI()
		return nil, nil, err
	}
	log.Info("simulate: catalog walked through the partner API", "url", f.api.cfg.BaseURL, "mixes", len(mixes))
	return mixes, stopAPI, nil
}

// parseMixes parses id:length[@start/start/…],… (lengths and starts in ms
// or as Go durations).
func parseMixes(s string) ([]simulator.MixInfo, error) {
	var out []simulator.MixInfo
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		idStr, rest, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("%q: want id:length[@start/start/…]", item)
		}
		id, err := strconv.ParseInt(idStr, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q: mix id must be an integer", item)
		}
		lengthStr, startsStr, _ := strings.Cut(rest, "@")
		length, err := parseMS(lengthStr)
		if err != nil {
			return nil, fmt.Errorf("%q: length: %w", item, err)
		}
		m := simulator.MixInfo{ID: id, LengthMS: length}
		if startsStr != "" {
			for _, st := range strings.Split(startsStr, "/") {
				v, err := parseMS(st)
				if err != nil {
					return nil, fmt.Errorf("%q: track start: %w", item, err)
				}
				m.TrackStartsMS = append(m.TrackStartsMS, v)
			}
		}
		out = append(out, m)
	}
	if len(out) == 0 {
		return nil, errors.New("no mix given")
	}
	return out, nil
}

func parseMS(s string) (int64, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil && n >= 0 {
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is neither milliseconds nor a duration like 4m30s", s)
	}
	return d.Milliseconds(), nil
}
