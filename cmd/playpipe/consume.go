package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/wiring/roles"
)

func init() {
	register(command{
		name:    "consume",
		summary: "enrich <prefix>.events into per-track plays on <prefix>.reports (bad events to <prefix>.rejected), exactly once",
		run:     runConsume,
	})
}

const consumeSynopsis = `Consumes player events from <prefix>.events in a consumer group, splits every listening
segment into per-track plays with the mix's track listing (GET /partners/mix/{id}, cached),
and writes them to <prefix>.reports, or the event with its reasons to <prefix>.rejected,
in Kafka transactions together with the offset commit: a crash or rebalance never loses
or doubles a track play for read_committed readers. A 404 mix rejects the event as
unknown_mix; a mix answered 400 or an undecodable body is retried, then (see
--mix-unavailable-attempts) rejects its events as mix_unavailable; 500/503/network errors
are retried while the partition waits. Events over --max-event-bytes are rejected as
too_large. A blocked User-Agent or refused credentials stop it with exit status 78. Full guide: docs/consumer.md.

Example (brokers and API from flags; the signature never on the command line):
  PLAYPIPE_API_CLIENT_SIGNATURE=... playpipe consume --brokers kafka:9092 \
    --api-url https://api.example.com --api-client-id abcdefghij \
    --transactional-id playpipe-enrich-0 --min-play-length 1s

--brokers (or --embedded-kafka) and --api-url (or --sandbox) are required: without them
the command refuses to start (exit 2). Try-out: playpipe consume --embedded-kafka --sandbox`

// consumeFlags are the enrich role's own flags.
type consumeFlags struct {
	group, txnID       string
	allowMissingUserID bool
	defaultVendor      string
	minPlay            time.Duration
	maxEventBytes      int
	envErr             error // an environment default that does not parse
	cacheSize          int
	cacheTTL           time.Duration
	standbyTTL         time.Duration
	notFoundTTL        time.Duration
	unavailAttempts    int
	unavailAfter       time.Duration
	txnRecords         int
	txnInterval        time.Duration
	maxTxnWait         time.Duration
	txnTimeout         time.Duration
	window             timeWindowFlags
	holdAfter          time.Duration
	maxHeld            int
	metaMax            int
}

func (c *consumeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.group, "group", envDefault("PLAYPIPE_CONSUME_GROUP", consumer.DefaultGroup), "consumer group (env PLAYPIPE_CONSUME_GROUP)")
	fs.StringVar(&c.txnID, "transactional-id", envDefault("PLAYPIPE_TRANSACTIONAL_ID", ""),
		"transactional id of this instance: stable across its restarts, unique among running instances (env PLAYPIPE_TRANSACTIONAL_ID; default playpipe-enrich-<hostname>)")
	fs.BoolVar(&c.allowMissingUserID, "allow-missing-user-id", envDefault("PLAYPIPE_ALLOW_MISSING_USER_ID", "") == "true",
		"let events without user_id through (their plays are flagged no_user_id); by default they are rejected as missing_user_id (env PLAYPIPE_ALLOW_MISSING_USER_ID=true)")
	fs.StringVar(&c.defaultVendor, "default-vendor", envDefault("PLAYPIPE_DEFAULT_VENDOR", ""),
		"vendor (integer) used for events without one; empty: such events are rejected as missing_field (env PLAYPIPE_DEFAULT_VENDOR)")
	maxEvent := consumer.DefaultMaxEventBytes
	if v := envDefault("PLAYPIPE_MAX_EVENT_BYTES", ""); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			c.envErr = fmt.Errorf("PLAYPIPE_MAX_EVENT_BYTES %q: accepted: a whole number of bytes ≥ 1 (e.g. 65536)", v)
		}
		maxEvent = n
	}
	fs.IntVar(&c.maxEventBytes, "max-event-bytes", maxEvent,
		"longest event accepted, in bytes; longer ones are rejected as too_large with a bounded copy (env PLAYPIPE_MAX_EVENT_BYTES)")
	fs.DurationVar(&c.minPlay, "min-play-length", time.Second, "shortest play that is posted; shorter plays are derived with below_minimum and counted, never posted (0s disables)")
	fs.IntVar(&c.cacheSize, "mix-cache-size", 10000, "most mix listings kept in memory (least recently used evicted)")
	fs.DurationVar(&c.cacheTTL, "mix-cache-ttl", 10*time.Minute, "how long a listing served by live service is used")
	fs.DurationVar(&c.standbyTTL, "mix-cache-standby-ttl", 30*time.Second, "how long a listing served by the API's standby layer is used")
	fs.DurationVar(&c.notFoundTTL, "mix-cache-notfound-ttl", 30*time.Second, "how long a 404 for a mix is remembered")
	fs.IntVar(&c.unavailAttempts, "mix-unavailable-attempts", 5,
		"a mix the partner API answers 400 or an undecodable body for is declared unavailable after this many such answers (and --mix-unavailable-after); its events are then rejected as mix_unavailable, raw kept for a re-drive")
	fs.DurationVar(&c.unavailAfter, "mix-unavailable-after", 30*time.Second,
		"shortest time between the first and the last of --mix-unavailable-attempts answers before a mix is declared unavailable (500, 503 and network errors are retried for ever instead)")
	fs.IntVar(&c.txnRecords, "txn-records", 1000, "events per transaction (a transaction ends at this many events or --txn-interval)")
	fs.DurationVar(&c.txnInterval, "txn-interval", 100*time.Millisecond, "longest a transaction stays open collecting events")
	fs.DurationVar(&c.maxTxnWait, "max-txn-wait", 10*time.Second, "longest an open transaction waits for the partner API: the upper bound of --mix-hold-after, past which events are held instead")
	fs.DurationVar(&c.txnTimeout, "txn-timeout", 60*time.Second, "broker-side transaction timeout (≥ 2 × --max-txn-wait)")
	fs.DurationVar(&c.holdAfter, "mix-hold-after", time.Second, "how long a batch waits for a mix that is not cached; events whose mix has not come by then are held (with later events of their key) while every other event flows on (≤ --max-txn-wait)")
	fs.IntVar(&c.maxHeld, "max-held-events", consumer.DefaultMaxHeld, "most events held at once for mixes the partner API does not serve; at the bound no new events are fetched until a mix is served (nothing is dropped)")
	fs.IntVar(&c.metaMax, "offset-metadata-max-bytes", 4096, "the brokers' offset.metadata.max.bytes: the commit metadata listing a partition's held offsets must fit it (it also bounds the events held per partition)")
	c.window.register(fs)
}

// config turns the flags into the consumer's configuration; errors name
// the flag.
func (c *consumeFlags) config() (consumer.Config, error) {
	o := consumer.Config{
		Group: c.group, TransactionalID: c.txnID, MaxEventBytes: c.maxEventBytes,
		TxnRecords: c.txnRecords, TxnInterval: c.txnInterval, MaxTxnWait: c.maxTxnWait, TransactionTimeout: c.txnTimeout,
		MixHoldAfter: c.holdAfter, MaxHeld: c.maxHeld, MetadataMaxBytes: c.metaMax,
		CacheConfig: consumer.CacheConfig{Size: c.cacheSize, TTL: c.cacheTTL, StandbyTTL: c.standbyTTL, NotFoundTTL: c.notFoundTTL,
			UnavailableAttempts: c.unavailAttempts, UnavailableAfter: c.unavailAfter},
	}
	if c.envErr != nil {
		return o, c.envErr
	}
	o.Events.AllowMissingUserID = c.allowMissingUserID
	w, err := c.window.window()
	if err != nil {
		return o, err
	}
	o.Events.Window = w
	if c.defaultVendor != "" {
		v, err := strconv.ParseInt(c.defaultVendor, 10, 64)
		if err != nil {
			return o, fmt.Errorf("--default-vendor %q: accepted: an integer, or empty for none", c.defaultVendor)
		}
		o.Events.DefaultVendor = &v
	}
	switch {
	case c.minPlay < 0:
		return o, fmt.Errorf("--min-play-length must be ≥ 0, got %s", c.minPlay)
	case c.minPlay == 0:
		o.MinPlayLength = -1 // disabled
	default:
		o.MinPlayLength = c.minPlay
	}
	if c.unavailAfter < 0 {
		return o, fmt.Errorf("--mix-unavailable-after must be ≥ 0, got %s", c.unavailAfter)
	}
	if c.holdAfter <= 0 || c.holdAfter > c.maxTxnWait {
		return o, fmt.Errorf("--mix-hold-after must be > 0 and at most --max-txn-wait (%s), got %s", c.maxTxnWait, c.holdAfter)
	}
	if c.metaMax < 256 {
		return o, fmt.Errorf("--offset-metadata-max-bytes must be ≥ 256, got %d", c.metaMax)
	}
	if c.maxTxnWait*2 > c.txnTimeout {
		return o, fmt.Errorf("--max-txn-wait (%s) must be at most half of --txn-timeout (%s)", c.maxTxnWait, c.txnTimeout)
	}
	for name, v := range map[string]int{"--mix-cache-size": c.cacheSize, "--txn-records": c.txnRecords, "--max-event-bytes": c.maxEventBytes,
		"--mix-unavailable-attempts": c.unavailAttempts, "--max-held-events": c.maxHeld} {
		if v < 1 {
			return o, fmt.Errorf("%s must be ≥ 1, got %d", name, v)
		}
	}
	for name, v := range map[string]time.Duration{"--mix-cache-ttl": c.cacheTTL, "--mix-cache-standby-ttl": c.standbyTTL,
		"--mix-cache-notfound-ttl": c.notFoundTTL, "--txn-interval": c.txnInterval, "--max-txn-wait": c.maxTxnWait, "--txn-timeout": c.txnTimeout} {
		if v <= 0 {
			return o, fmt.Errorf("%s must be > 0, got %s", name, v)
		}
	}
	return o, nil
}

func runConsume(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("consume", stderr, consumeSynopsis)
	var (
		rf  roleFlags
		api apiTarget
		cf  consumeFlags
	)
	rf.register(fs, "consume")
	api.register(fs, "read mix listings from")
	cf.register(fs)
	log, err := rf.parse(fs, args, stderr)
	if err != nil {
		return err
	}
	cfg, err := cf.config()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	run, err := rf.startWithAPI(ctx, log, &api, nil)
	if err != nil {
		return err
	}
	defer run.close()
	client, stopAPI, err := api.open(log, run.tel)
	if err != nil {
		return err
	}
	run.onClose(stopAPI)
	cfg.Logger = log
	enr, err := roles.NewEnricher(cfg, run.kafka, client, run.tel, log)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errUsage
	}
	if err := run.exportLagOf(cfg.Group, run.kafka.Topics().Events); err != nil {
		return err
	}
	err = enr.Run(ctx)
	st := enr.Stats()
	cs := enr.Cache().Stats()
	fmt.Fprintf(stdout, "consume: %d events committed: %d track plays (%d below the minimum), %d rejected, %d valid without plays; %d transactions, %d aborted; mix cache %d hits, %d misses, %d fetches\n",
		st.Events, st.Plays, st.BelowMinimum, st.Rejected, st.WithoutPlays, st.Commits, st.Aborts, cs.Hits, cs.Misses, cs.Fetches)
	if errors.Is(err, consumer.ErrInvalidConfig) {
		return configExit{err}
	}
	return err
}
