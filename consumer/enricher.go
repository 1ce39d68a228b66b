package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/backoff"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

const instrumentationName = "github.com/playpipe/playpipe/consumer"

// DefaultGroup is the consumer group of the enrich role.
const DefaultGroup = "playpipe-enrich"

// Config configures an Enricher. Zero fields take the stated defaults.
type Config struct {
	// Kafka is the connection and topic names; Brokers must be set.
	Kafka kafkax.Config
	// Group is the consumer group; defaults to DefaultGroup.
	Group string
	// TransactionalID identifies this instance's transactional producer;
	// defaults to "playpipe-enrich-<hostname>". Keep it stable across
	// restarts of one instance (a restart then fences the crashed
	// instance's open transaction at once instead of after its timeout)
	// and unique among running instances.
	TransactionalID string
	// Source serves mixes (a *partnerapi.Client); required unless Cache is set.
	Source MixSource
	// Cache, when set, is used instead of building one over Source with CacheConfig.
	Cache       *MixCache
	CacheConfig CacheConfig
	// Events are the deployment's event policies (--allow-missing-user-id,
	// --default-vendor, the plausible-time window --time-window-back and
	// --time-window-ahead). ArrivalMS is ignored: each event's arrival is
	// its record's timestamp.
	Events schemas.ValidateOptions
	// MaxEventBytes is the longest event accepted; a longer one is rejected
	// as too_large (its rejection keeps a bounded prefix, see
	// schemas.Rejection). Defaults to DefaultMaxEventBytes.
	MaxEventBytes int
	// MaxProduceAttempts bounds how often the outputs of one event may fail
	// to produce with an error Kafka gives for the record itself
	// (MESSAGE_TOO_LARGE, INVALID_RECORD, …): each failure aborts the
	// transaction, and the event is then retried in batches of its own;
	// after this many it is rejected as produce_failed instead (raw bytes
	// bounded), and the partition moves on. Defaults to 3.
	MaxProduceAttempts int
	// MinPlayLength is the shortest play that is posted; shorter ones are
	// derived with below_minimum and counted. Defaults to 1s; negative disables.
	MinPlayLength time.Duration
	// TxnRecords and TxnInterval end a transaction once it holds this many
	// events or has been open this long; defaults 1000 and 100ms.
	TxnRecords  int
	TxnInterval time.Duration
	// MaxTxnWait bounds how long an open transaction may wait for the
	// partner API: it is the upper bound of MixHoldAfter (events whose mix
	// has not come by then are held, see hold.go, so a transaction never
	// waits longer). Defaults to 10s; must stay well under
	// TransactionTimeout.
	MaxTxnWait time.Duration
	// TransactionTimeout is the broker-side transaction timeout; defaults to 60s.
	TransactionTimeout time.Duration
	// MixHoldAfter is how long a batch waits for a mix that is not cached;
	// events whose mix has not come by then are held (with every later
	// event of their key) while the rest flows on, and the mix is fetched
	// in the background (docs/consumer.md). A mix already being fetched for
	// held events is not waited for at all. Defaults to 1s; at most
	// MaxTxnWait.
	MixHoldAfter time.Duration
	// MaxHeld bounds the events held at once. When it is reached the
	// enricher fetches no new events until a mix is served (block, never
	// drop): the behaviour of a partition waiting, for every partition.
	// Defaults to 10000 (about 3 MB of ~300-byte events).
	MaxHeld int
	// MetadataMaxBytes is the brokers' offset.metadata.max.bytes: the commit
	// metadata that lists a partition's held offsets must fit it, so it
	// also bounds the held events of one partition (a full partition
	// blocks like MaxHeld). Defaults to 4096, Kafka's default.
	MetadataMaxBytes int
	// FetchConcurrency bounds the mixes fetched at once for one batch; defaults to 8.
	FetchConcurrency int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// KafkaOpts are appended to the client options (tests, tuning).
	KafkaOpts []kgo.Opt
	// Now is the clock for derived_at and rejection times; defaults to time.Now.
	Now func() time.Time
	// MeterProvider makes the enricher's and its mix cache's instruments;
	// the command passes telemetry.Role.Providers.Meter. Nil: a no-op
	// provider (nothing is measured; no otel global is read).
	MeterProvider metric.MeterProvider
	// TracerProvider makes the enrich and send spans; the command passes
	// telemetry.Role.Providers.Tracer. Nil: a no-op provider, which still
	// carries an event's trace context on to the records produced. The
	// trace context in Kafka headers is always W3C (telemetry.Inject, Extract).
	TracerProvider trace.TracerProvider
}

// DefaultMaxHeld is the default Config.MaxHeld.
const DefaultMaxHeld = 10000

// DefaultMaxEventBytes is the default Config.MaxEventBytes: 64 KiB, two
// orders of magnitude above a real event (~300 bytes), far below Kafka's
// 1 MiB record limit even after the sixfold growth of JSON escaping.
const DefaultMaxEventBytes = 64 << 10

// Validate checks the options once; errors name the flag or field.
func (o Config) Validate() error {
	if err := o.Kafka.Validate(); err != nil {
		return err
	}
	if len(o.Kafka.Brokers) == 0 {
		return errors.New("consumer: Kafka brokers are required (--brokers)")
	}
	if o.Source == nil && o.Cache == nil {
		return errors.New("consumer: a mix source (partner API client) is required")
	}
	if err := o.Events.Window.Validate(); err != nil {
		return err
	}
	for _, c := range []struct {
		bad        bool
		name, want string
		got        any
	}{
		{o.TxnRecords < 0, "--txn-records", "≥ 1", o.TxnRecords},
		{o.TxnInterval < 0, "--txn-interval", "> 0", o.TxnInterval},
		{o.MaxTxnWait < 0, "--max-txn-wait", "> 0", o.MaxTxnWait},
		{o.MaxProduceAttempts < 0, "MaxProduceAttempts", "≥ 1", o.MaxProduceAttempts},
		{o.MaxEventBytes < 0, "--max-event-bytes", "≥ 1", o.MaxEventBytes},
		{o.FetchConcurrency < 0, "FetchConcurrency", "≥ 1", o.FetchConcurrency},
		{o.TransactionTimeout < 0, "--txn-timeout", "> 0", o.TransactionTimeout},
		{o.MixHoldAfter < 0, "--mix-hold-after", "> 0", o.MixHoldAfter},
		{o.MaxHeld < 0, "--max-held-events", "≥ 1", o.MaxHeld},
		{o.MetadataMaxBytes != 0 && o.MetadataMaxBytes < 256, "--offset-metadata-max-bytes", "≥ 256", o.MetadataMaxBytes},
	} {
		if c.bad {
			return fmt.Errorf("consumer: %s must be %s, got %v", c.name, c.want, c.got)
		}
	}
	wait, tt := o.MaxTxnWait, o.TransactionTimeout
	if wait == 0 {
		wait = 10 * time.Second
	}
	if tt == 0 {
		tt = 60 * time.Second
	}
	if wait*2 > tt {
		return fmt.Errorf("consumer: --max-txn-wait (%s) must be at most half of --txn-timeout (%s)", wait, tt)
	}
	if o.MixHoldAfter > wait {
		return fmt.Errorf("consumer: --mix-hold-after (%s) must be at most --max-txn-wait (%s)", o.MixHoldAfter, wait)
	}
	return o.CacheConfig.Validate()
}

func (o *Config) setDefaults() {
	orDefault(&o.Group, DefaultGroup)
	if o.TransactionalID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "local"
		}
		o.TransactionalID = "playpipe-enrich-" + host
	}
	orDefault(&o.MinPlayLength, time.Duration(DefaultMinPlayLength)*time.Millisecond)
	orDefault(&o.MaxEventBytes, DefaultMaxEventBytes)
	orDefault(&o.MaxProduceAttempts, 3)
	orDefault(&o.TxnRecords, 1000)
	orDefault(&o.TxnInterval, 100*time.Millisecond)
	orDefault(&o.MaxTxnWait, 10*time.Second)
	orDefault(&o.TransactionTimeout, 60*time.Second)
	orDefault(&o.FetchConcurrency, 8)
	orDefault(&o.MixHoldAfter, min(time.Second, o.MaxTxnWait))
	orDefault(&o.MaxHeld, DefaultMaxHeld)
	orDefault(&o.MetadataMaxBytes, 4096)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CacheConfig.Logger == nil {
		o.CacheConfig.Logger = o.Logger
	}
}

// orDefault sets *v to def when it is the zero value.
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Enricher is the enrich role. Make one with New; call Run once.
type Enricher struct {
	opts   Config
	topics kafkax.Topics
	cache  *MixCache
	proc   *processor

	mu      sync.Mutex
	sess    *kgo.GroupTransactSession // while Run runs; crash() closes it
	crashed atomic.Bool

	// prevMember is the group member of the last Kafka session closed,
	// removed by the next session (leavePrevious); Run's goroutine only.
	prevMember string

	lost              lostParts // partitions revoked or lost, until the loop forgets their held events
	held, heldPeak    atomic.Int64
	released, skipped atomic.Int64

	// testHookProduced, when set (tests only), runs after each batch's
	// records were handed to the producer, inside the open transaction.
	testHookProduced func(*kgo.Client)
}

// New validates opts and returns an Enricher.
func New(opts Config) (*Enricher, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	cache := opts.Cache
	if cache == nil {
		var err error
		if cache, err = NewMixCache(opts.Source, opts.CacheConfig); err != nil {
			return nil, err
		}
	}
	e := &Enricher{opts: opts, topics: opts.Kafka.Topics(), cache: cache}
	e.proc = newProcessor(cache, e.topics, opts.Events, SplitOptions{MinPlayMS: opts.MinPlayLength.Milliseconds()}, opts.FetchConcurrency)
	e.proc.tracer = telemetry.OrNoopTracerProvider(opts.TracerProvider).Tracer(instrumentationName)
	e.proc.maxEvent = opts.MaxEventBytes
	e.proc.maxProduce = opts.MaxProduceAttempts
	return e, nil
}

// Cache returns the enricher's mix cache.
func (e *Enricher) Cache() *MixCache { return e.cache }

// Stats are counters of committed work, and of held events.
type Stats struct {
	Events, Plays, BelowMinimum, Rejected int64
	// Held are the events held now (their mix is not served, or an event
	// with their key is held); HeldPeak the most held at once; Released
	// the held events handed back to enrichment; Skipped the events read
	// again after a restart or rebalance that a predecessor had produced
	// already (commit metadata).
	Held, HeldPeak, Released, Skipped int64
	// WithoutPlays are valid events that yielded no play (a segment past
	// the mix end or before its first track): consumed, not rejected.
	WithoutPlays    int64
	Commits, Aborts int64
}

// Stats returns the counters of work in committed transactions.
func (e *Enricher) Stats() Stats {
	e.proc.statsMu.Lock()
	st := e.proc.committed
	e.proc.statsMu.Unlock()
	st.Held, st.HeldPeak, st.Released, st.Skipped = e.held.Load(), e.heldPeak.Load(), e.released.Load(), e.skipped.Load()
	return st
}

// setHeld records the number of events held now.
func (e *Enricher) setHeld(n int) { e.held.Store(int64(n)) }

// noteHeld records the number held after one more was held.
func (e *Enricher) noteHeld(n int) {
	e.held.Store(int64(n))
	for {
		p := e.heldPeak.Load()
		if int64(n) <= p || e.heldPeak.CompareAndSwap(p, int64(n)) {
			return
		}
	}
}

// Run consumes until ctx ends (it then commits the open transaction, leaves
// the group and returns nil) or a fatal error occurs (returned; the open
// transaction is aborted, nothing is lost).
//
// A Kafka session that fails on Kafka itself (its transaction cannot be
// ended or its transactional id claimed because the coordinator does not
// answer, the group's offsets cannot be read: see sessionError) is closed
// and made again in place after a pause of 1 s doubling to 10 s, as a
// restart of the process would: the new session's claim of the
// transactional id fences the old one and aborts its open transaction, and
// its events are read again from the committed offsets (nothing lost,
// nothing doubled), and it removes the old session's group member should
// that one's bounded leave not have got through (leavePrevious), so that
// its join does not wait for the member's session timeout. franz-go says an error of GroupTransactSession.End is
// never retryable on the same client. Fencing and authorization errors are
// returned: another instance holds the id, or the operator must act.
func (e *Enricher) Run(ctx context.Context) error {
	o := e.opts
	base, err := o.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	kopts := append(append(base, o.Kafka.GroupOpts(o.Group)...),
		kgo.ConsumeTopics(e.topics.Events),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.TransactionalID(o.TransactionalID),
		kgo.TransactionTimeout(o.TransactionTimeout),
		kgo.ProducerLinger(0),
		kgo.ProducerBatchMaxBytes(1<<20),
		kgo.MaxBufferedRecords(1<<20),
		kgo.OnPartitionsRevoked(e.lost.note),
		kgo.OnPartitionsLost(e.lost.note),
	)
	kopts = append(kopts, o.KafkaOpts...)
	meter := telemetry.OrNoopMeterProvider(o.MeterProvider).Meter(instrumentationName)
	unreg, err := e.cache.registerMetrics(meter)
	if err != nil {
		o.Logger.Warn("mix cache metrics not registered", "err", err)
	}
	defer unreg()
	if _, err := meter.Int64ObservableGauge("playpipe.events.held", metric.WithDescription("player events held because their mix is not served (or an event with their key is held)"),
		metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
			obs.Observe(e.held.Load())
			return nil
		})); err != nil {
		o.Logger.Warn("held-events gauge not registered", "err", err)
	}
	if err := e.proc.initMetrics(meter); err != nil {
		o.Logger.Warn("enrich metrics not registered", "err", err)
	}
	fails := 0
	for n := 1; ; n++ {
		began := time.Now()
		err := e.session(ctx, kopts, n)
		if err == nil || ctx.Err() != nil || e.crashed.Load() || !retrySession(err) {
			return err
		}
		if time.Since(began) > sessionPause.Max {
			fails = 0 // it had worked for a while: a new fault
		}
		fails++
		pause := sessionPause.Delay(fails, 0)
		o.Kafka.Faults.Say(o.Logger, slog.LevelWarn, kafkax.FaultUnreachable, "enricher session",
			"kafka: the enricher's Kafka session failed; a new one is made after a pause (its open transaction is aborted and its events read again: nothing lost, nothing doubled)",
			"err", err, "retry_in", pause.Round(time.Millisecond), "session", n)
		if !backoff.Sleep(ctx, pause) {
			return nil
		}
	}
}

// sessionPause is the pause before a new Kafka session after one failed
// (Run): 1 s doubling to 10 s, each between half and all of its step.
var sessionPause = backoff.Policy{Initial: time.Second, Max: 10 * time.Second, Jitter: backoff.Equal}

// sessionError is an error of the Kafka session itself: its transaction
// could not be ended or flushed, its transactional id not claimed, the
// group's committed offsets not read. Run makes a new session after one
// unless retrySession says it is not worth it.
type sessionError struct{ err error }

func (e *sessionError) Error() string { return e.err.Error() }
func (e *sessionError) Unwrap() error { return e.err }

// inSession marks err (when not nil) as an error of the Kafka session.
func inSession(err error) error {
	if err == nil {
		return nil
	}
	return &sessionError{err}
}

// retrySession reports whether a new Kafka session may get past err: an
// error of the session (sessionError) other than fencing (another instance
// claimed the transactional id: a new claim would fence it in turn) or a
// refusal for lack of rights.
func retrySession(err error) bool {
	var se *sessionError
	if !errors.As(err, &se) {
		return false
	}
	for _, fatal := range []error{kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.TransactionalIDAuthorizationFailed,
		kerr.GroupAuthorizationFailed, kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed} {
		if errors.Is(err, fatal) {
			return false
		}
	}
	return true
}

// session runs one Kafka session (the n-th of Run): it makes the group
// transact session, claims the transactional id and consumes until ctx
// ends or an error; the session's client is closed when it returns.
func (e *Enricher) session(ctx context.Context, kopts []kgo.Opt, n int) error {
	o := e.opts
	sess, err := kgo.NewGroupTransactSession(kopts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka session: %w", err)
	}
	e.mu.Lock()
	e.sess = sess
	e.mu.Unlock()
	e.lost.takeAll() // a previous session's revocations: this one starts with none
	e.leavePrevious(ctx, sess.Client())
	// Claim the transactional id now (InitProducerId), as Java's
	// initTransactions does: a predecessor killed mid-transaction is fenced
	// and its open transaction aborted at once. franz-go would claim it only
	// at the first write, which never comes while the group's offset fetch
	// waits for that transaction to end (UNSTABLE_OFFSET_COMMIT): every
	// partition would stall until the transaction timeout.
	initCtx, cancelInit := context.WithTimeout(ctx, o.TransactionTimeout)
	_, _, err = sess.Client().ProducerID(initCtx)
	cancelInit()
	if err != nil && ctx.Err() == nil {
		e.closeSession(sess)
		return inSession(fmt.Errorf("consumer: claim transactional id %q: %w", o.TransactionalID, err))
	}
	if n == 1 {
		o.Logger.Info("enricher started", "group", o.Group, "topic", e.topics.Events, "transactional_id", o.TransactionalID,
			"txn_records", o.TxnRecords, "txn_interval", o.TxnInterval, "mix_hold_after", o.MixHoldAfter, "max_held", o.MaxHeld)
	} else {
		o.Logger.Info("enricher resumed in a new Kafka session", "session", n, "transactional_id", o.TransactionalID)
	}

	err = e.loop(ctx, sess)
	if errors.Is(err, errClientClosed) || e.crashed.Load() {
		return err // crashed (tests): no clean end, no leave
	}
	if err != nil && ctx.Err() == nil {
		// Fatal to this session: abort what is open (best effort), then
		// leave. Whatever the open transaction held is forgotten: the
		// broker aborts it (or the next claim of the id does).
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, _ = sess.End(endCtx, kgo.TryAbort)
		cancel()
		e.proc.abandonTxn()
	}
	e.closeSession(sess)
	return err
}
