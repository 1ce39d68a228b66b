package consumer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

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
	// Events are the deployment's event policies (--allow-missing-user-id, --default-vendor).
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
	// MaxTxnWait is how long an open transaction that already produced
	// records may wait for the partner API (a 503 storm on a cold mix).
	// Past it the transaction is aborted (nothing is lost: its events are
	// read again from the committed offsets) and the enricher waits for the
	// mix outside any transaction. Defaults to 10s; must stay well under
	// TransactionTimeout.
	MaxTxnWait time.Duration
	// TransactionTimeout is the broker-side transaction timeout; defaults to 60s.
	TransactionTimeout time.Duration
	// FetchConcurrency bounds the mixes fetched at once for one batch; defaults to 8.
	FetchConcurrency int
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// KafkaOpts are appended to the client options (tests, tuning).
	KafkaOpts []kgo.Opt
	// Now is the clock for derived_at and rejection times; defaults to time.Now.
	Now func() time.Time
}

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
	switch {
	case o.TxnRecords < 0:
		return fmt.Errorf("consumer: --txn-records must be ≥ 1, got %d", o.TxnRecords)
	case o.TxnInterval < 0:
		return fmt.Errorf("consumer: --txn-interval must be > 0, got %s", o.TxnInterval)
	case o.MaxTxnWait < 0:
		return fmt.Errorf("consumer: --max-txn-wait must be > 0, got %s", o.MaxTxnWait)
	case o.MaxProduceAttempts < 0:
		return fmt.Errorf("consumer: MaxProduceAttempts must be ≥ 1, got %d", o.MaxProduceAttempts)
	case o.MaxEventBytes < 0:
		return fmt.Errorf("consumer: --max-event-bytes must be ≥ 1, got %d", o.MaxEventBytes)
	case o.FetchConcurrency < 0:
		return fmt.Errorf("consumer: FetchConcurrency must be ≥ 1, got %d", o.FetchConcurrency)
	case o.TransactionTimeout < 0:
		return fmt.Errorf("consumer: --txn-timeout must be > 0, got %s", o.TransactionTimeout)
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
	return o.CacheConfig.Validate()
}

func (o *Config) setDefaults() {
	if o.Group == "" {
		o.Group = DefaultGroup
	}
	if o.TransactionalID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "local"
		}
		o.TransactionalID = "playpipe-enrich-" + host
	}
	if o.MinPlayLength == 0 {
		o.MinPlayLength = time.Duration(DefaultMinPlayLength) * time.Millisecond
	}
	if o.MaxEventBytes == 0 {
		o.MaxEventBytes = DefaultMaxEventBytes
	}
	if o.MaxProduceAttempts == 0 {
		o.MaxProduceAttempts = 3
	}
	if o.TxnRecords == 0 {
		o.TxnRecords = 1000
	}
	if o.TxnInterval == 0 {
		o.TxnInterval = 100 * time.Millisecond
	}
	if o.MaxTxnWait == 0 {
		o.MaxTxnWait = 10 * time.Second
	}
	if o.TransactionTimeout == 0 {
		o.TransactionTimeout = 60 * time.Second
	}
	if o.FetchConcurrency == 0 {
		o.FetchConcurrency = 8
	}
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

// Enricher is the enrich role. Make one with New; call Run once.
type Enricher struct {
	opts   Config
	topics kafkax.Topics
	cache  *MixCache
	proc   *processor

	mu      sync.Mutex
	sess    *kgo.GroupTransactSession // while Run runs; crash() closes it
	crashed atomic.Bool

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
	e.proc.maxEvent = opts.MaxEventBytes
	e.proc.maxProduce = opts.MaxProduceAttempts
	return e, nil
}

// Cache returns the enricher's mix cache.
func (e *Enricher) Cache() *MixCache { return e.cache }

// Stats are counters of committed work.
type Stats struct {
	Events, Plays, BelowMinimum, Rejected int64
	// WithoutPlays are valid events that yielded no play (a segment past
	// the mix end or before its first track): consumed, not rejected.
	WithoutPlays    int64
	Commits, Aborts int64
}

// Stats returns the counters of work in committed transactions.
func (e *Enricher) Stats() Stats {
	e.proc.statsMu.Lock()
	defer e.proc.statsMu.Unlock()
	return e.proc.committed
}

// errWaitTooLong: a mix needed by a transaction that already produced records
// did not arrive within MaxTxnWait.
type errWaitTooLong struct{ mixIDs []int64 }

func (e *errWaitTooLong) Error() string {
	return fmt.Sprintf("consumer: mixes %v not available within the transaction's wait budget", e.mixIDs)
}

// Run consumes until ctx ends (it then commits the open transaction, leaves
// the group and returns nil) or a fatal error occurs (returned; the open
// transaction is aborted, nothing is lost).
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
	)
	kopts = append(kopts, o.KafkaOpts...)
	sess, err := kgo.NewGroupTransactSession(kopts...)
	if err != nil {
		return fmt.Errorf("consumer: kafka session: %w", err)
	}
	e.mu.Lock()
	e.sess = sess
	e.mu.Unlock()
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
		sess.Close()
		return fmt.Errorf("consumer: claim transactional id %q: %w", o.TransactionalID, err)
	}
	meter := otel.Meter(instrumentationName)
	unreg, err := e.cache.registerMetrics(meter)
	if err != nil {
		o.Logger.Warn("mix cache metrics not registered", "err", err)
	}
	defer unreg()
	if err := e.proc.initMetrics(meter); err != nil {
		o.Logger.Warn("enrich metrics not registered", "err", err)
	}
	o.Logger.Info("enricher started", "group", o.Group, "topic", e.topics.Events, "transactional_id", o.TransactionalID,
		"txn_records", o.TxnRecords, "txn_interval", o.TxnInterval)

	err = e.loop(ctx, sess)
	if errors.Is(err, errClientClosed) || e.crashed.Load() {
		return err // crashed (tests): no clean end, no leave
	}
	if err != nil && ctx.Err() == nil {
		// Fatal: abort what is open (best effort), then leave.
		endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		_, _ = sess.End(endCtx, kgo.TryAbort)
		cancel()
	}
	sess.Close()
	return err
}

var errClientClosed = errors.New("consumer: kafka client closed")

// shutdown ends the open transaction with a short deadline of its own (ctx
// has ended) and reports.
func (e *Enricher) shutdown(ctx context.Context, end func(context.Context, kgo.TransactionEndTry) error, commit kgo.TransactionEndTry) error {
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := end(endCtx, commit)
	e.opts.Logger.Info("enricher stopped", "committed_last", bool(commit), "stats", e.Stats())
	return err
}

// crash closes the session's client without ending the open transaction
// (tests: a process that dies mid-stream).
func (e *Enricher) crash() {
	e.mu.Lock()
	s := e.sess
	e.mu.Unlock()
	if s != nil {
		e.crashed.Store(true)
		s.Client().Close()
	}
}

func (e *Enricher) loop(ctx context.Context, sess *kgo.GroupTransactSession) error {
	o := e.opts
	p := e.proc
	var (
		open     bool
		started  time.Time
		inTxn    int
		produced bool
		recs     []*kgo.Record
	)
	end := func(ctx context.Context, commit kgo.TransactionEndTry) error {
		if !open {
			return nil
		}
		open = false
		// Ending is not cut short by shutdown: a cancelled End may have
		// committed on the broker without our knowing. It is bounded by
		// the transaction timeout instead.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.TransactionTimeout)
		defer cancel()
		if commit {
			if err := sess.Client().Flush(ctx); err != nil {
				return fmt.Errorf("consumer: flush: %w", err)
			}
			if perr := p.produceErr(); perr != nil {
				o.Logger.Warn("a produce failed; aborting the transaction (its events will be read again)", "err", perr)
				commit = kgo.TryAbort
				for _, s := range p.notePoison() {
					o.Logger.Warn("Kafka refused a record of this event; it is retried on its own, then rejected as produce_failed",
						"source", s.loc.String(), "failures", s.n, "max_produce_attempts", p.maxProduce, "err", s.err)
				}
			}
		}
		committed, err := sess.End(ctx, commit)
		p.endTxn(committed)
		inTxn, produced = 0, false
		if err != nil {
			return fmt.Errorf("consumer: end transaction: %w", err)
		}
		if commit == kgo.TryCommit && !committed {
			o.Logger.Info("transaction aborted by a rebalance; its events will be read again from the committed offsets")
		}
		return nil
	}
	for {
		pollCtx, cancel := ctx, context.CancelFunc(func() {})
		if open {
			pollCtx, cancel = context.WithDeadline(ctx, started.Add(o.TxnInterval))
		}
		fs := sess.PollRecords(pollCtx, o.TxnRecords-inTxn)
		cancel()
		if fs.IsClientClosed() {
			return errClientClosed
		}
		if ctx.Err() != nil {
			// Clean shutdown. Commit when everything polled was produced;
			// when this last poll returned records, abort instead (they
			// and the rest of the transaction are read again after a
			// restart: nothing lost, nothing doubled).
			commit := kgo.TryCommit
			if len(fs.Records()) > 0 {
				commit = kgo.TryAbort
			}
			return e.shutdown(ctx, end, commit)
		}
		fs.EachError(func(topic string, part int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			o.Logger.Warn("fetch error", "topic", topic, "partition", part, "err", err)
		})
		recs = recs[:0]
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
		if len(recs) > 0 {
			if !open {
				if err := sess.Begin(); err != nil {
					return fmt.Errorf("consumer: begin transaction: %w", err)
				}
				open, started = true, time.Now()
			}
			var waitCtx context.Context = ctx
			cancelWait := context.CancelFunc(func() {})
			if produced {
				waitCtx, cancelWait = context.WithTimeout(ctx, o.MaxTxnWait)
			}
			out, err := p.process(ctx, waitCtx, recs, o.Now().UnixMilli())
			cancelWait()
			var tooLong *errWaitTooLong
			switch {
			case errors.As(err, &tooLong) && ctx.Err() == nil:
				o.Logger.Warn("partner API slow for a mix while a transaction is open; aborting it and waiting outside any transaction",
					"mix_ids", tooLong.mixIDs, "max_txn_wait", o.MaxTxnWait)
				if err := end(ctx, kgo.TryAbort); err != nil {
					return err
				}
				for _, id := range tooLong.mixIDs {
					if _, err := e.cache.Get(ctx, id); err != nil && !rejectsEvents(err) && ctx.Err() == nil {
						return err
					}
				}
				continue
			case err != nil:
				if ctx.Err() != nil {
					// Shutdown while waiting for a mix: these records were
					// polled but not produced, so abort.
					return e.shutdown(ctx, end, kgo.TryAbort)
				}
				return err
			}
			if err := p.produce(ctx, sess.Client(), out); err != nil {
				return err
			}
			inTxn += len(recs)
			produced = produced || len(out) > 0
			if e.testHookProduced != nil {
				e.testHookProduced(sess.Client())
			}
		}
		if open && (inTxn >= o.TxnRecords || time.Since(started) >= o.TxnInterval) {
			if err := end(ctx, kgo.TryCommit); err != nil {
				if ctx.Err() != nil {
					continue
				}
				return err
			}
		}
	}
}

// processor turns polled event records into output records. It owns the
// per-transaction arenas (records and bytes), reused after each End.
type processor struct {
	cache    *MixCache
	topics   kafkax.Topics
	validate schemas.ValidateOptions
	split    SplitOptions
	conc     int
	maxEvent int // events longer than this are rejected too_large; 0: no limit
	tracer   trace.Tracer
	spanOpts []trace.SpanStartOption

	items []item
	plays []schemas.TrackPlay
	arena [][]kgo.Record // chunks of output records of the open transaction; never reallocated, as the producer holds pointers into them
	used  int
	buf   []byte
	out   []*kgo.Record

	errMu   sync.Mutex
	prodErr error
	refused []*kgo.Record // records Kafka refused for themselves (recordRefused), this transaction

	// Per transaction: the first output record (arena index) of each
	// event, to find the event behind a refused record.
	spans []evSpan
	// Events whose outputs Kafka refused, by source location, across
	// transactions (until one commits past them); bounded by the events
	// of the aborted transactions.
	poison     map[srcLoc]*poisonState
	maxProduce int
	isolate    [][2]int // ranges of p.out (suspects' records) produced between flushes

	pending   Stats // counts of the open transaction
	statsMu   sync.Mutex
	committed Stats

	mEvents, mPlays, mBelow metric.Int64Counter
	mRejected, mNoPlays     metric.Int64Counter
	rejectedByReason        map[string]int64
}

type item struct {
	rec     *kgo.Record
	ev      schemas.PlayerEvent
	vs      []schemas.Violation
	listing *Listing
	fetched bool // the listing was not cached: this batch fetched it
}

func newProcessor(cache *MixCache, topics kafkax.Topics, v schemas.ValidateOptions, split SplitOptions, conc int) *processor {
	if conc <= 0 {
		conc = 8
	}
	return &processor{cache: cache, topics: topics, validate: v, split: split, conc: conc,
		tracer: otel.Tracer(instrumentationName), spanOpts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}, rejectedByReason: map[string]int64{}}
}

func (p *processor) initMetrics(m metric.Meter) error {
	var errs []error
	var err error
	p.mEvents, err = m.Int64Counter("playpipe.events.in", metric.WithDescription("player events consumed and committed by the enricher"))
	errs = append(errs, err)
	p.mPlays, err = m.Int64Counter("playpipe.plays.derived", metric.WithDescription("track plays derived and committed (below-minimum plays included)"))
	errs = append(errs, err)
	p.mBelow, err = m.Int64Counter("playpipe.plays.below_minimum", metric.WithDescription("derived plays shorter than the minimum play length (counted, not posted)"))
	errs = append(errs, err)
	p.mRejected, err = m.Int64Counter("playpipe.events.rejected", metric.WithDescription("events sent to the rejected topic, by reason"))
	errs = append(errs, err)
	p.mNoPlays, err = m.Int64Counter("playpipe.events.without_plays", metric.WithDescription("valid events that yielded no track play (segment past the mix end or before its first track)"))
	errs = append(errs, err)
	return errors.Join(errs...)
}

// promise records the first produce error of the transaction, and every
// record Kafka refused for itself.
func (p *processor) promise(r *kgo.Record, err error) {
	if err != nil {
		p.errMu.Lock()
		if p.prodErr == nil {
			p.prodErr = err
		}
		if recordRefused(err) {
			p.refused = append(p.refused, r)
		}
		p.errMu.Unlock()
	}
}

func (p *processor) produceErr() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.prodErr
}

// endTxn resets the arenas and moves the pending counts to the committed
// ones when the transaction committed.
func (p *processor) endTxn(committed bool) {
	p.errMu.Lock()
	p.prodErr = nil
	p.refused = p.refused[:0]
	p.errMu.Unlock()
	if committed && len(p.poison) > 0 {
		for _, sp := range p.spans {
			delete(p.poison, sp.loc) // committed past it
		}
	}
	p.spans = p.spans[:0]
	p.used = 0
	p.buf = p.buf[:0]
	pend := p.pending
	p.pending = Stats{}
	reasons := p.rejectedByReason
	p.statsMu.Lock()
	if committed {
		p.committed.Events += pend.Events
		p.committed.Plays += pend.Plays
		p.committed.BelowMinimum += pend.BelowMinimum
		p.committed.Rejected += pend.Rejected
		p.committed.WithoutPlays += pend.WithoutPlays
		p.committed.Commits++
	} else {
		p.committed.Aborts++
	}
	p.statsMu.Unlock()
	if committed && p.mEvents != nil {
		ctx := context.Background()
		p.mEvents.Add(ctx, pend.Events)
		p.mPlays.Add(ctx, pend.Plays)
		p.mBelow.Add(ctx, pend.BelowMinimum)
		p.mNoPlays.Add(ctx, pend.WithoutPlays)
		for r, n := range reasons {
			p.mRejected.Add(ctx, n, metric.WithAttributes(attribute.String("reason", r)))
		}
	}
	clear(p.rejectedByReason)
}

// arenaChunk is the number of records per arena chunk.
const arenaChunk = 1024

func (p *processor) newRecord(topic string) *kgo.Record {
	c, i := p.used/arenaChunk, p.used%arenaChunk
	if c == len(p.arena) {
		p.arena = append(p.arena, make([]kgo.Record, arenaChunk))
	}
	r := &p.arena[c][i]
	p.used++
	*r = kgo.Record{Topic: topic}
	return r
}

// process validates, splits and encodes recs. waitCtx bounds waiting for
// mixes; when it ends first, process returns *errWaitTooLong and nothing is
// produced for recs. The returned records are valid until the transaction ends.
func (p *processor) process(ctx, waitCtx context.Context, recs []*kgo.Record, nowMS int64) ([]*kgo.Record, error) {
	p.items = p.items[:0]
	p.isolate = p.isolate[:0]
	var missing []int64
	for _, r := range recs {
		p.items = append(p.items, item{rec: r})
		it := &p.items[len(p.items)-1]
		if p.maxEvent > 0 && len(r.Value) > p.maxEvent {
			it.vs = []schemas.Violation{{Reason: schemas.ReasonTooLarge,
				Detail: fmt.Sprintf("event is %d bytes, longer than the maximum event size of %d bytes (--max-event-bytes)", len(r.Value), p.maxEvent)}}
			continue
		}
		it.ev, it.vs = schemas.ParseEvent(r.Value, p.validate)
		if it.vs != nil {
			continue
		}
		l, err := p.cache.Lookup(it.ev.MixID)
		switch {
		case err != nil:
			it.vs = mixViolation(it.ev.MixID, err)
		case l != nil:
			it.listing = l
		default:
			if !containsID(missing, it.ev.MixID) {
				missing = append(missing, it.ev.MixID)
			}
		}
	}
	if len(missing) > 0 {
		if err := p.resolve(waitCtx, missing); err != nil {
			return nil, err
		}
		for i := range p.items {
			it := &p.items[i]
			if it.vs != nil || it.listing != nil {
				continue
			}
			it.fetched = true
			l, err := p.cache.Lookup(it.ev.MixID)
			switch {
			case err != nil:
				it.vs = mixViolation(it.ev.MixID, err)
			case l != nil:
				it.listing = l
			default:
				// Resolved moments ago but already evicted or expired (a
				// tiny cache or TTL): fetch once more, waiting as needed.
				l, err := p.cache.Get(waitCtx, it.ev.MixID)
				if rejectsEvents(err) {
					it.vs = mixViolation(it.ev.MixID, err)
				} else if err != nil {
					return nil, p.waitErr(waitCtx, err, []int64{it.ev.MixID})
				} else {
					it.listing = l
				}
			}
		}
	}

	p.out = p.out[:0]
	split := p.split
	split.DerivedAt = nowMS
	split.OmitReportID = true
	for i := range p.items {
		it := &p.items[i]
		ectx := ctx
		if len(it.rec.Headers) > 0 {
			ectx = telemetry.Extract(ctx, it.rec)
		}
		ectx, span := p.tracer.Start(ectx, "enrich", p.spanOpts...)
		traced := trace.SpanContextFromContext(ectx).IsValid()
		p.pending.Events++
		loc := srcLoc{it.rec.Topic, it.rec.Partition, it.rec.Offset}
		isoStart := -1 // ≥ 0: this event's records start there in p.out and are produced on their own
		p.spans = append(p.spans, evSpan{first: p.used, loc: loc})
		if ps := p.poison[loc]; ps != nil {
			// Kafka refused this event's records before: produce them
			// between flushes (batches of their own), or, past the bound,
			// its rejection.
			start := len(p.out)
			if ps.n >= p.maxProduce {
				if ps.n >= 3*p.maxProduce {
					span.End()
					return nil, fmt.Errorf("consumer: Kafka refuses even a rejection without raw bytes of the event at %s (%d failures): %s", loc, ps.n, ps.err)
				}
				maxRaw := schemas.MaxRejectionRaw
				if ps.n >= 2*p.maxProduce {
					maxRaw = 0 // the bounded rejection was refused too: keep only length and hash
				}
				it.vs = []schemas.Violation{{Reason: schemas.ReasonProduceFailed,
					Detail: trunc(fmt.Sprintf("Kafka refused what this event yields %d times: %s", ps.n, ps.err), 400)}}
				p.rejectBounded(ectx, it, nowMS, maxRaw)
				p.isolate = append(p.isolate, [2]int{start, len(p.out)})
				span.End()
				continue
			}
			isoStart = start
		}
		if it.vs == nil {
			var v *schemas.Violation
			p.plays, v = Split(p.plays[:0], &it.ev, it.listing, split)
			if v != nil {
				it.vs = []schemas.Violation{*v}
			} else if len(p.plays) == 0 {
				p.pending.WithoutPlays++
			}
		}
		if it.vs != nil {
			p.reject(ectx, it, nowMS)
			if isoStart >= 0 {
				p.isolate = append(p.isolate, [2]int{isoStart, len(p.out)})
			}
			if span.IsRecording() {
				span.SetAttributes(attribute.String("playpipe.event_id", it.ev.EventID), attribute.String("playpipe.rejected", it.vs[0].Reason))
			}
			span.End()
			continue
		}
		// A producer span per event for its track plays (only when traced):
		// the reporter's consume span becomes its child.
		pctx, send := ectx, trace.Span(nil)
		if span.IsRecording() {
			pctx, send = p.tracer.Start(ectx, "send "+p.topics.Reports, trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.type", "send"),
					attribute.String("messaging.destination.name", p.topics.Reports), attribute.Int("messaging.batch.message_count", len(p.plays))))
		}
		for j := range p.plays {
			pl := &p.plays[j]
			r := p.newRecord(p.topics.Reports)
			start := len(p.buf)
			p.buf = appendReportID(p.buf, it.ev.EventID, pl.Position)
			mid := len(p.buf)
			p.buf = appendTrackPlay(p.buf, pl, p.buf[start:mid])
			r.Key = p.buf[start:mid:mid]
			r.Value = p.buf[mid:len(p.buf):len(p.buf)]
			if traced {
				telemetry.Inject(pctx, r)
			}
			p.out = append(p.out, r)
			p.pending.Plays++
			if pl.BelowMinimum {
				p.pending.BelowMinimum++
			}
		}
		if send != nil {
			send.End()
		}
		if isoStart >= 0 {
			p.isolate = append(p.isolate, [2]int{isoStart, len(p.out)})
		}
		if span.IsRecording() {
			span.SetAttributes(attribute.String("playpipe.event_id", it.ev.EventID), attribute.Int64("playpipe.mix_id", it.ev.MixID),
				attribute.Bool("playpipe.mixcache.hit", !it.fetched),
				attribute.Int("playpipe.plays", len(p.plays)))
		}
		span.End()
	}
	return p.out, nil
}

func (p *processor) reject(ctx context.Context, it *item, nowMS int64) {
	p.rejectBounded(ctx, it, nowMS, schemas.MaxRejectionRaw)
}

// rejectBounded is reject keeping at most maxRaw encoded bytes of the event.
func (p *processor) rejectBounded(ctx context.Context, it *item, nowMS int64, maxRaw int) {
	src := schemas.Source{Topic: it.rec.Topic, Partition: it.rec.Partition, Offset: it.rec.Offset}
	rej := schemas.NewRejectionBounded(it.rec.Value, it.ev.EventID, it.vs, src, nowMS, maxRaw)
	if rej.EventID == "" {
		rej.EventID = bestEffortEventID(it.rec.Value)
	}
	b, err := json.Marshal(rej)
	if err != nil { // cannot happen: plain strings and integers
		b = []byte(`{"v":1,"reason":"` + rej.Reason + `"}`)
	}
	r := p.newRecord(p.topics.Rejected)
	r.Key = it.rec.Key
	r.Value = b
	telemetry.Inject(ctx, r)
	p.out = append(p.out, r)
	p.pending.Rejected++
	p.rejectedByReason[rej.Reason]++
}

// srcLoc is where an event record was read.
type srcLoc struct {
	topic     string
	partition int32
	offset    int64
}

func (l srcLoc) String() string {
	return l.topic + "/" + strconv.Itoa(int(l.partition)) + "@" + strconv.FormatInt(l.offset, 10)
}

// evSpan is an event of the open transaction and the arena index of its
// first output record.
type evSpan struct {
	first int
	loc   srcLoc
}

// poisonState counts the transactions in which Kafka refused an output
// record of one event.
type poisonState struct {
	loc srcLoc
	n   int
	err string
}

// recordRefused reports whether a produce error is Kafka refusing the record
// itself, which no retry of the same bytes fixes, as opposed to the broker,
// the network or the transaction failing (those abort and redo the
// transaction as before, for ever).
func recordRefused(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || // over max.message.bytes (broker) or the client's batch limit
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || // refused by a broker-side record validation
		errors.Is(err, kerr.CorruptMessage)
}

// produce hands out to the transaction. The records of events whose
// outputs Kafka refused before (p.isolate) are produced between flushes, so
// that they share no batch with other events' records: a refusal then
// names exactly the event that caused it.
func (p *processor) produce(ctx context.Context, cl *kgo.Client, out []*kgo.Record) error {
	iso := p.isolate
	p.isolate = p.isolate[:0]
	next := 0
	for _, rg := range iso {
		for _, r := range out[next:rg[0]] {
			cl.Produce(ctx, r, p.promise)
		}
		if err := cl.Flush(ctx); err != nil {
			return fmt.Errorf("consumer: flush: %w", err)
		}
		for _, r := range out[rg[0]:rg[1]] {
			cl.Produce(ctx, r, p.promise)
		}
		if err := cl.Flush(ctx); err != nil {
			return fmt.Errorf("consumer: flush: %w", err)
		}
		next = rg[1]
	}
	for _, r := range out[next:] {
		cl.Produce(ctx, r, p.promise)
	}
	return nil
}

// notePoison counts, once per event, the events behind the records Kafka
// refused in the open transaction, and returns their states.
func (p *processor) notePoison() []*poisonState {
	p.errMu.Lock()
	refused := append([]*kgo.Record(nil), p.refused...)
	var firstErr error = p.prodErr
	p.errMu.Unlock()
	if len(refused) == 0 {
		return nil
	}
	if p.poison == nil {
		p.poison = map[srcLoc]*poisonState{}
	}
	idx := map[*kgo.Record]bool{}
	for _, r := range refused {
		idx[r] = true
	}
	var out []*poisonState
	seen := map[srcLoc]bool{}
	for i := 0; i < p.used; i++ {
		if !idx[&p.arena[i/arenaChunk][i%arenaChunk]] {
			continue
		}
		// The event whose outputs start at or before record i.
		k := sort.Search(len(p.spans), func(j int) bool { return p.spans[j].first > i }) - 1
		if k < 0 || seen[p.spans[k].loc] {
			continue
		}
		loc := p.spans[k].loc
		seen[loc] = true
		ps := p.poison[loc]
		if ps == nil {
			ps = &poisonState{loc: loc}
			p.poison[loc] = ps
		}
		ps.n++
		ps.err = trunc(firstErr.Error(), 300)
		out = append(out, ps)
	}
	return out
}

// bestEffortEventID reads event_id from an event that failed validation, so
// the ledger can name it: the first member spelled exactly "event_id" (as
// ParseEvent reads keys: a case variant such as "EVENT_ID" is not it); ""
// when it has none usable.
func bestEffortEventID(raw []byte) string {
	if !json.Valid(raw) {
		return "" // a truncated copy may start like another, valid event
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return ""
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return ""
		}
		if tok == "event_id" {
			var s string
			if json.Unmarshal(v, &s) != nil || len(s) > schemas.MaxEventIDLen {
				return ""
			}
			return s
		}
	}
	return ""
}

// resolve fetches the missing mixes (at most conc at once), waiting until
// waitCtx ends. A 404 is remembered by the cache and is not an error here.
func (p *processor) resolve(waitCtx context.Context, ids []int64) error {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []int64
		first  error
	)
	sem := make(chan struct{}, p.conc)
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := p.cache.Get(waitCtx, id); err != nil && !rejectsEvents(err) {
				mu.Lock()
				failed = append(failed, id)
				if first == nil || errors.Is(err, ErrInvalidConfig) {
					first = err
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if first != nil {
		return p.waitErr(waitCtx, first, failed)
	}
	return nil
}

func (p *processor) waitErr(waitCtx context.Context, err error, ids []int64) error {
	if errors.Is(err, ErrInvalidConfig) {
		return err
	}
	if waitCtx.Err() != nil {
		return &errWaitTooLong{mixIDs: ids}
	}
	return err
}

// rejectsEvents reports whether a MixCache error is a verdict on the mix
// that rejects its events (404, or declared unavailable), not a failure.
func rejectsEvents(err error) bool {
	return errors.Is(err, ErrUnknownMix) || errors.Is(err, ErrMixUnavailable)
}

// mixViolation is the violation of an event whose mix lookup gave err (one
// of the rejectsEvents errors).
func mixViolation(id int64, err error) []schemas.Violation {
	if errors.Is(err, ErrMixUnavailable) {
		return []schemas.Violation{{Field: "mix_id", Reason: schemas.ReasonMixUnavailable, Detail: trunc(err.Error(), 300)}}
	}
	return []schemas.Violation{{Field: "mix_id", Reason: schemas.ReasonUnknownMix,
		Detail: fmt.Sprintf("the partner API answered 404 for mix %d", id)}}
}

func containsID(ids []int64, id int64) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
