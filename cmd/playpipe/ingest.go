package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/wiring/roles"
)

func init() {
	register(command{
		name:    "ingest",
		summary: "HTTP gateway for fleets that do not speak Kafka: POST /v1/events → plays.events",
		run:     runIngest,
	})
}

const ingestSynopsis = `Accepts batches of player events (a JSON array, or NDJSON: one event per line) on
POST /v1/events, validates every event, publishes the valid ones to <prefix>.events and
answers 202 with a per-event answer only after Kafka acknowledged the batch. Refused events
are answered with their reasons and also published to <prefix>.rejected (source "ingest").
Each request needs a fleet API key: "Authorization: Bearer <key>" or "X-API-Key: <key>".
Keys are configured as SHA-256 hashes, fleet-name:hexsha256. Guide: docs/producer.md.

Make a key and its configuration line:
  playpipe ingest --new-key acme          # prints the key (give it to the fleet) and acme:<hash>
  printf %s "$KEY" | playpipe ingest --hash-key   # the hash of an existing key`

func runIngest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runIngestWith(ctx, args, os.Stdin, stdout, stderr, nil)
}

// runIngestWith is runIngest with its stdin, and a hook told the listen
// address once the gateway serves (tests).
func runIngestWith(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, ready func(addr string)) error {
	fs := newFlagSet("ingest", stderr, ingestSynopsis)
	f := newIngestFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *f.hashKey {
		return printKeyHash(stdin, stdout, stderr)
	}
	if *f.newKey != "" {
		return printNewKey(*f.newKey, stdout, stderr)
	}
	log, err := f.lf.logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	st, err := f.settings(stderr)
	if err != nil {
		return err
	}
	if err := requireKafka(f.kcfg); err != nil {
		return err
	}
	return serveIngest(ctx, f, st, log, ready)
}

// ingestFlags are the flags of playpipe ingest.
type ingestFlags struct {
	lf       logFlags
	kcfg     kafkax.Config
	keySpecs []string

	addr, keysFile, newKey, maxEvent, defVendor, adminAddr *string
	hashKey, allowNoU                                      *bool
	maxBody, minRate                                       *int64
	maxEvents, burst, maxConc, maxPerKey                   *int
	ratePer                                                *float64
	linger, delivery, bodyGrace, readTO, shutdownT         *time.Duration
	window                                                 timeWindowFlags
}

func newIngestFlags(fs *flag.FlagSet) *ingestFlags {
	f := &ingestFlags{
		addr:      fs.String("addr", envDefault("PLAYPIPE_INGEST_ADDR", "127.0.0.1:8090"), "listen address (env PLAYPIPE_INGEST_ADDR); use :8090 to serve other hosts"),
		keysFile:  fs.String("api-keys-file", os.Getenv("PLAYPIPE_INGEST_API_KEYS_FILE"), "file of fleet API keys, one fleet-name:hexsha256 per line, # comments (env PLAYPIPE_INGEST_API_KEYS_FILE)"),
		hashKey:   fs.Bool("hash-key", false, "read an API key from stdin, print its SHA-256 (hex) and exit"),
		newKey:    fs.String("new-key", "", "make a random API key for the named fleet, print it and its configuration line, and exit"),
		maxBody:   fs.Int64("max-body", 4<<20, "largest request body in bytes (larger: 413)"),
		maxEvent:  fs.String("max-event-bytes", envDefault("PLAYPIPE_MAX_EVENT_BYTES", strconv.Itoa(gateway.DefaultMaxEventBytes)), fmt.Sprintf("largest event in bytes, 1–%d (env PLAYPIPE_MAX_EVENT_BYTES); a larger one is refused with reason too_large (413 when the request holds nothing else) and recorded with a bounded prefix of its bytes", gateway.MaxEventBytesCeiling)),
		maxEvents: fs.Int("max-events", 5000, "most events in one request (more: 413)"),
		ratePer:   fs.Float64("rate", 20000, "sustained events per second allowed per API key (more: 429 with Retry-After)"),
		burst:     fs.Int("burst", 0, "events an API key may send at once; 0: max(--max-events, --rate); must be ≥ --max-events"),
		linger:    fs.Duration("linger", 5*time.Millisecond, "how long a Kafka partition batch waits to fill"),
		delivery:  fs.Duration("delivery-timeout", 30*time.Second, "longest a request waits for Kafka's acknowledgement, whatever the broker does; past it the answer is 503 kafka_timeout with each event's fate (failed: not on Kafka; unknown: sent, not acknowledged, may be on Kafka)"),
		allowNoU:  fs.Bool("allow-missing-user-id", false, "accept events without user_id (must match the consumer's policy)"),
		defVendor: fs.String("default-vendor", "", "vendor for events without one (must match the consumer's policy); empty: vendor is required"),
		maxConc:   fs.Int("max-concurrent", 64, "POST requests served at once (bounds memory to about this × --max-body); more: 503 with Retry-After. A request takes a slot only after its key passed its own limits"),
		maxPerKey: fs.Int("max-concurrent-per-key", 0, "POST requests one API key may have in flight, 1–--max-concurrent; more: 429 concurrency_limited. 0: a quarter of --max-concurrent"),
		minRate:   fs.Int64("min-body-rate", 1024, "slowest average rate, in bytes/s, a request body may arrive at after --body-grace; slower: cut with 408 slow_body"),
		bodyGrace: fs.Duration("body-grace", 10*time.Second, "time a request body may take before --min-body-rate applies"),
		readTO:    fs.Duration("read-timeout", time.Minute, "longest time from a request's headers to the end of its body; later: cut with 408 read_timeout"),
		adminAddr: adminAddrFlag(fs, "ingest"),
		shutdownT: fs.Duration("shutdown-timeout", 30*time.Second, "how long shutdown waits for requests in flight"),
	}
	fs.Func("api-key", "a fleet API key as fleet-name:hexsha256 (repeatable; env PLAYPIPE_INGEST_API_KEYS, comma separated)", func(s string) error {
		f.keySpecs = append(f.keySpecs, s)
		return nil
	})
	f.window.register(fs)
	registerKafkaFlags(fs, &f.kcfg)
	f.lf.register(fs.StringVar)
	return f
}

// ingestSettings are the gateway's settings checked from the flags.
type ingestSettings struct {
	keys          []gateway.FleetKey
	limits        gateway.Config // without Publisher, Keys and Logger
	vopts         schemas.ValidateOptions
	maxEventBytes int64
}

// settings checks the flags before anything is started; a bad one is
// reported on stderr with errUsage.
func (f *ingestFlags) settings(stderr io.Writer) (ingestSettings, error) {
	var st ingestSettings
	if v := os.Getenv("PLAYPIPE_INGEST_API_KEYS"); v != "" && len(f.keySpecs) == 0 {
		f.keySpecs = strings.Split(v, ",")
	}
	keys, err := loadFleetKeys(f.keySpecs, *f.keysFile)
	if err != nil {
		return st, err
	}
	if len(keys) == 0 {
		fmt.Fprintln(stderr, "playpipe ingest: no fleet API key configured: pass --api-key fleet:hexsha256, --api-keys-file or PLAYPIPE_INGEST_API_KEYS (make one with --new-key <fleet>)")
		return st, errUsage
	}
	st.keys = keys
	if st.maxEventBytes, err = f.eventBound(stderr); err != nil {
		return st, err
	}
	st.limits = gateway.Config{
		MaxBodyBytes: *f.maxBody, MaxEventBytes: st.maxEventBytes, MaxEvents: *f.maxEvents,
		RatePerKey: *f.ratePer, Burst: *f.burst, MaxConcurrent: *f.maxConc, MaxConcurrentPerKey: *f.maxPerKey,
		MinBodyRate: *f.minRate, BodyGrace: *f.bodyGrace, ReadTimeout: *f.readTO,
	}
	if err := st.limits.ValidateLimits(); err != nil {
		fmt.Fprintf(stderr, "playpipe ingest: %v\n", err)
		return st, errUsage
	}
	st.vopts = schemas.ValidateOptions{AllowMissingUserID: *f.allowNoU}
	if st.vopts.Window, err = f.window.window(); err != nil {
		fmt.Fprintf(stderr, "playpipe ingest: %v\n", err)
		return st, errUsage
	}
	if *f.defVendor != "" {
		v, err := strconv.ParseInt(*f.defVendor, 10, 64)
		if err != nil {
			fmt.Fprintf(stderr, "--default-vendor %q: an integer is required\n", *f.defVendor)
			return st, errUsage
		}
		st.vopts.DefaultVendor = &v
	}
	return st, nil
}

// eventBound checks --max-event-bytes and the body deadline flags, and
// returns the per-event bound.
func (f *ingestFlags) eventBound(stderr io.Writer) (int64, error) {
	maxEventBytes, err := strconv.ParseInt(strings.TrimSpace(*f.maxEvent), 10, 64)
	if err != nil || maxEventBytes < 1 || maxEventBytes > gateway.MaxEventBytesCeiling {
		fmt.Fprintf(stderr, "playpipe ingest: --max-event-bytes (env PLAYPIPE_MAX_EVENT_BYTES) %q: a whole number of bytes from 1 to %d is required\n", *f.maxEvent, gateway.MaxEventBytesCeiling)
		return 0, errUsage
	}
	switch {
	case *f.minRate < 1:
		fmt.Fprintf(stderr, "playpipe ingest: --min-body-rate %d: at least 1 byte/s is required\n", *f.minRate)
		return 0, errUsage
	case *f.bodyGrace <= 0:
		fmt.Fprintf(stderr, "playpipe ingest: --body-grace %s: a duration > 0 is required (e.g. 10s)\n", *f.bodyGrace)
		return 0, errUsage
	case *f.readTO <= 0:
		fmt.Fprintf(stderr, "playpipe ingest: --read-timeout %s: a duration > 0 is required (e.g. 1m)\n", *f.readTO)
		return 0, errUsage
	}
	return maxEventBytes, nil
}

// serveIngest starts telemetry, Kafka (when embedded), the Publisher and the
// gateway, and serves until ctx ends.
func serveIngest(ctx context.Context, f *ingestFlags, st ingestSettings, log *slog.Logger, ready func(addr string)) error {
	tel, err := telemetry.StartRole(ctx, "ingest", *f.adminAddr, log)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := tel.Close(cctx); err != nil {
			log.Warn("ingest: stopping telemetry", "err", err)
		}
	}()
	kcfg, stopKafka, err := kafkax.Ready(ctx, f.kcfg, log)
	if err != nil {
		return err
	}
	defer stopKafka()
	health, kcfg, stopHealth, err := startKafkaHealth(ctx, "ingest", kcfg, tel.Providers.Meter, log)
	if err != nil {
		return err
	}
	defer stopHealth()
	pcfg := roles.Publisher(kcfg)
	pcfg.Validate, pcfg.Linger, pcfg.DeliveryTimeout = st.vopts, *f.linger, *f.delivery
	pcfg.TracerProvider, pcfg.MeterProvider = tel.Providers.Tracer, tel.Providers.Meter
	pub, err := producer.NewPublisher(ctx, pcfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), *f.shutdownT)
		defer cancel()
		if err := pub.Close(cctx); err != nil {
			log.Warn("ingest: closing the Kafka producer", "err", err)
		}
	}()
	tel.AddReadyCheck("kafka", health.Check)
	gcfg := st.limits
	gcfg.Publisher, gcfg.Keys, gcfg.Logger, gcfg.BrokerReady, gcfg.Faults = pub, st.keys, log, health.Check, health.Faults()
	gcfg.MeterProvider, gcfg.TracerProvider = tel.Providers.Meter, tel.Providers.Tracer
	gw, err := gateway.New(gcfg)
	if err != nil {
		return err
	}
	return serveGateway(ctx, gw, f, st, log.With("topic", pub.Topic()), ready)
}

// serveGateway serves gw on --addr until ctx ends or serving fails, then
// drains: /readyz answers 503 and requests in flight get --shutdown-timeout.
// log names the events topic.
func serveGateway(ctx context.Context, gw *gateway.Gateway, f *ingestFlags, st ingestSettings, log *slog.Logger, ready func(addr string)) error {
	ln, err := net.Listen("tcp", *f.addr)
	if err != nil {
		return fmt.Errorf("--addr %s: %w", *f.addr, err)
	}
	hs := &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: 10 * time.Second,
		// The gateway sets each POST's read deadline itself (--min-body-rate,
		// --body-grace, --read-timeout); this is the backstop for the rest.
		ReadTimeout:  *f.readTO + 10*time.Second,
		WriteTimeout: *f.delivery + time.Minute, // a request waits for Kafka's acknowledgement
		IdleTimeout:  2 * time.Minute,
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	fleets := map[string]bool{}
	for _, k := range st.keys {
		fleets[k.Fleet] = true
	}
	log.Info("ingest listening", "url", "http://"+ln.Addr().String()+"/v1/events",
		"fleets", len(fleets), "keys", len(st.keys), "rate_per_key", *f.ratePer, "max_events", *f.maxEvents, "max_body", *f.maxBody, "max_event_bytes", st.maxEventBytes)
	if ready != nil {
		ready(ln.Addr().String())
	}
	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		runErr = fmt.Errorf("serve: %w", err)
	}
	gw.SetDraining()
	log.Info("ingest shutting down: finishing requests in flight", "timeout", *f.shutdownT)
	sctx, scancel := context.WithTimeout(context.Background(), *f.shutdownT)
	defer scancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("ingest: requests still in flight at the shutdown timeout", "err", err)
		_ = hs.Close()
	}
	return runErr
}

// loadFleetKeys merges --api-key entries and the key file. Errors never
// repeat an entry: a raw key pasted by mistake must not reach the logs.
func loadFleetKeys(specs []string, file string) ([]gateway.FleetKey, error) {
	var keys []gateway.FleetKey
	for i, s := range specs {
		if strings.TrimSpace(s) == "" {
			continue
		}
		k, err := gateway.ParseFleetKey(s)
		if err != nil {
			return nil, fmt.Errorf("--api-key #%d: %w", i+1, err)
		}
		keys = append(keys, k)
	}
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return nil, fmt.Errorf("--api-keys-file: %w", err)
		}
		defer f.Close()
		fk, err := gateway.ParseFleetKeys(f)
		if err != nil {
			return nil, fmt.Errorf("--api-keys-file %s: %w", file, err)
		}
		keys = append(keys, fk...)
	}
	return keys, nil
}

func printKeyHash(stdin io.Reader, stdout, stderr io.Writer) error {
	line, err := bufio.NewReader(io.LimitReader(stdin, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("--hash-key: read stdin: %w", err)
	}
	key := strings.TrimRight(line, "\r\n")
	if key == "" {
		fmt.Fprintln(stderr, "playpipe ingest --hash-key: no key on stdin")
		return errUsage
	}
	_, err = fmt.Fprintln(stdout, gateway.HashKey(key))
	return err
}

func printNewKey(fleet string, stdout, stderr io.Writer) error {
	if _, err := gateway.ParseFleetKey(fleet + ":" + gateway.HashKey("")); err != nil || strings.Contains(fleet, ":") {
		fmt.Fprintf(stderr, "playpipe ingest --new-key %q: a fleet name without spaces or ':' is required\n", fleet)
		return errUsage
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("--new-key: %w", err)
	}
	key := "pp_" + base64.RawURLEncoding.EncodeToString(b[:])
	_, err := fmt.Fprintf(stdout, "key:    %s\n--api-key %s:%s\n", key, fleet, gateway.HashKey(key))
	return err
}
