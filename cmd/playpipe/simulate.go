package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/producer"
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
	var (
		lf       logFlags
		kcfg     kafkax.Config
		api      apiTarget
		events   = fs.Int("events", 10000, "messages to send")
		ratePS   = fs.Float64("rate", 0, "messages per second; 0: as fast as Kafka takes them")
		devices  = fs.Int("devices", 200, "devices in the fleet")
		users    = fs.Int("users", 0, "distinct users; 0: 80% of --devices")
		badShare = fs.Float64("bad-share", 0.05, "share of bad messages, 0–1, spread evenly over malformed_json, missing_field, unknown_mix, bad_country")
		seed     = fs.Int64("seed", 1, "random seed: the same seed and flags send the same messages")
		startMS  = fs.Int64("start-ms", 0, "the simulated clock's start, epoch ms; 0: now (rounded down to the minute)")
		mixes    = fs.String("mixes", "", "the catalog without the partner API: id:length[@start/start/…],… with length and track starts in ms or as Go durations (101:60m@0/4m/9m30s)")
		maxMixes = fs.Int("max-mixes", 0, "use at most this many mixes of the partner API's catalog; 0: all")
		record   = fs.String("record", "", "write every message Kafka acknowledged to this file, one JSON line each: {kind, key, value}")
		batch    = fs.Int("batch-size", 2000, "messages per synchronous kafka-go write (each write waits up to --batch-timeout for partition batches to fill)")
		batchTO  = fs.Duration("batch-timeout", 2*time.Millisecond, "kafka-go Writer.BatchTimeout: how long a partition batch waits to fill (kafka-go's own default, 1s, makes synchronous writes crawl)")
	)
	registerKafkaFlags(fs, &kcfg)
	api.register(fs, "walk the catalog of")
	lf.register(fs.StringVar)
	// The simulator publishes to a running Kafka: it has no embedded broker.
	fs.Lookup("brokers").Usage = "Kafka seed brokers, comma separated (env PLAYPIPE_BROKERS); required: the simulator publishes to a running Kafka (it starts no embedded broker)"
	hideFlags(fs, "simulate", simulateSynopsis, "embedded-kafka", "embedded-kafka-port")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
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
	if len(kcfg.Brokers) == 0 || kcfg.Embedded {
		fmt.Fprintln(stderr, "playpipe simulate: --brokers is required (env PLAYPIPE_BROKERS): the simulator publishes to a running Kafka, e.g. the one of docker compose or playpipe demo")
		return errUsage
	}
	if err := kcfg.Validate(); err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	var catalog []producer.MixInfo
	if *mixes != "" {
		catalog, err = parseMixes(*mixes)
		if err != nil {
			fmt.Fprintf(stderr, "--mixes: %v\n", err)
			return errUsage
		}
	} else {
		if api.cfg.BaseURL == "" && !api.sandbox {
			return usageError{errors.New("no catalog: pass --mixes, --api-url (env PLAYPIPE_API_URL) to walk the partner API's catalog, or --sandbox to walk a built-in sandbox's (seed 1)")}
		}
		client, stopAPI, err := api.open(log)
		if err != nil {
			return err
		}
		defer stopAPI()
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		catalog, err = producer.CatalogFromAPI(wctx, client, *maxMixes)
		cancel()
		if err != nil {
			return err
		}
		log.Info("simulate: catalog walked through the partner API", "url", api.cfg.BaseURL, "mixes", len(catalog))
	}
	if *startMS == 0 {
		*startMS = time.Now().Truncate(time.Minute).UnixMilli()
	}
	cfg := producer.SimConfig{
		Kafka: kcfg, Mixes: catalog, Events: *events, Rate: *ratePS, Devices: *devices, Users: *users,
		BadShare: *badShare, Seed: *seed, StartMS: *startMS, BatchSize: *batch, BatchTimeout: *batchTO,
	}
	if *record != "" {
		f, err := os.Create(*record)
		if err != nil {
			return fmt.Errorf("--record: %w", err)
		}
		defer f.Close()
		cfg.Record = f
	}
	if _, err := producer.NewSimGenerator(cfg); err != nil { // flag errors before connecting
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	log.Info("simulate: publishing", "topic", kcfg.Topics().Events, "events", *events, "rate", *ratePS, "devices", *devices,
		"bad_share", *badShare, "seed", *seed, "start_ms", *startMS, "mixes", len(catalog))
	stats, err := producer.Simulate(ctx, cfg)
	fmt.Fprintln(stdout, stats)
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return nil // interrupted: what was sent is printed
		}
		return err
	}
	return nil
}

// parseMixes parses id:length[@start/start/…],… (lengths and starts in ms
// or as Go durations).
func parseMixes(s string) ([]producer.MixInfo, error) {
	var out []producer.MixInfo
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
		m := producer.MixInfo{ID: id, LengthMS: length}
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
