package analytics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/playpipe/playpipe/internal/backoff"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
)

// SinkConfig configures the sink role. Zero values take the defaults named
// in each field's comment.
type SinkConfig struct {
	Kafka      kafkax.Config
	ClickHouse Config
	// Group is the Kafka consumer group; defaults to "playpipe-sink".
	Group string
	// BatchRows is the most records per insert; defaults to 10000 (the
	// native protocol's sweet spot: 1k-row batches cost the server ~8× more per row).
	BatchRows int
	// Linger is the longest a non-empty batch waits for more records;
	// defaults to 1 s.
	Linger time.Duration
	// QueueBatches is the bound of the queue of full batches between the
	// reader and the writer; when it is full the reader blocks (it never
	// drops). Defaults to 2. Memory is bounded by about
	// (QueueBatches + 2) × BatchRows records.
	QueueBatches int
	// RetryMin and RetryMax bound the exponential backoff (with jitter)
	// between insert attempts while ClickHouse fails; defaults 200 ms and 5 s.
	RetryMin, RetryMax time.Duration
	// InsertTimeout bounds one insert attempt; defaults to 60 s.
	InsertTimeout time.Duration
	// ShutdownTimeout bounds the final drain (insert + commit of what was
	// read) when Run's context ends; defaults to 10 s. Records not inserted
	// by then are not committed: the next sink reads them again.
	ShutdownTimeout time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// MeterProvider makes the sink's instruments (playpipe.sink.*); the
	// command passes telemetry.Role.Providers.Meter. Nil: a no-op provider
	// (nothing is measured; no otel global is read).
	MeterProvider metric.MeterProvider
	// TracerProvider makes the sink's spans; the command passes
	// telemetry.Role.Providers.Tracer. Nil: a no-op provider.
	TracerProvider trace.TracerProvider

	// afterInsert, when set (tests), runs after a batch is in ClickHouse and
	// before its offsets are committed; an error ends Run at once without
	// committing, like a crash at the worst moment.
	afterInsert func(rows int) error
	// conn, when set (tests), is the ledger connection Run uses instead of
	// opening ClickHouse.Addr: the ledger suite's in-process current
	// ClickHouse (chdb), which has no address.
	conn driver.Conn
}

func (c SinkConfig) withDefaults() SinkConfig {
	if c.Group == "" {
		c.Group = "playpipe-sink"
	}
	if c.BatchRows == 0 {
		c.BatchRows = 10000
	}
	if c.Linger == 0 {
		c.Linger = time.Second
	}
	if c.QueueBatches == 0 {
		c.QueueBatches = 2
	}
	if c.RetryMin == 0 {
		c.RetryMin = 200 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = 5 * time.Second
	}
	if c.InsertTimeout == 0 {
		c.InsertTimeout = 60 * time.Second
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.ClickHouse = c.ClickHouse.withDefaults()
	return c
}

// Validate checks the configuration once; errors name the field's flag.
func (c SinkConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.BatchRows < 1 || c.BatchRows > 1_000_000:
		return fmt.Errorf("analytics: --batch-rows must be 1…1000000, got %d", c.BatchRows)
	case c.Linger < 0:
		return fmt.Errorf("analytics: --linger must be ≥ 0, got %v", c.Linger)
	case c.QueueBatches < 1:
		return fmt.Errorf("analytics: SinkConfig.QueueBatches must be ≥ 1, got %d", c.QueueBatches)
	case c.RetryMin <= 0 || c.RetryMax < c.RetryMin:
		return fmt.Errorf("analytics: retry backoff must satisfy 0 < RetryMin (%v) ≤ RetryMax (%v)", c.RetryMin, c.RetryMax)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("analytics: --shutdown-timeout must be ≥ 0, got %v", c.ShutdownTimeout)
	}
	if len(c.Kafka.Brokers) == 0 {
		return errors.New("analytics: sink: no Kafka brokers configured")
	}
	if err := c.Kafka.Validate(); err != nil {
		return err
	}
	if c.ClickHouse.Addr == "" && c.conn == nil {
		return errors.New("analytics: sink: no ClickHouse address configured (--clickhouse-addr; LocalOrConfigured starts a local server)")
	}
	return c.ClickHouse.Validate()
}

// Sink copies the four topics into the ledger tables. See the package
// documentation for its guarantees.
type Sink struct {
	cfg    SinkConfig
	log    *slog.Logger
	tracer trace.Tracer
	rows   metric.Int64Counter
	insDur metric.Float64Histogram
	retry  metric.Int64Counter

	stats struct {
		records, batches, retries, committed atomic.Int64
		lastInsertMS                         atomic.Int64
	}
	migrated atomic.Bool // Run applied (or found) the ledger schema
}

// Ready is the sink's readiness check of ClickHouse (for /readyz): an error
// until Run has applied the ledger schema, and whenever ClickHouse does not
// answer a ping. It never blocks past ctx.
func (s *Sink) Ready(ctx context.Context) error {
	if !s.migrated.Load() {
		return errors.New("clickhouse: not reached yet (the ledger schema is not applied)")
	}
	conn, err := s.cfg.ClickHouse.Open()
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.Ping(ctx); err != nil {
		return fmt.Errorf("clickhouse %s: %w", s.cfg.ClickHouse.Addr, err)
	}
	return nil
}

// SinkStats are counters of a running sink (for progress displays).
type SinkStats struct {
	Records       int64     // records inserted into ClickHouse (re-inserts included)
	Batches       int64     // batches inserted
	InsertRetries int64     // failed insert attempts
	Committed     int64     // batches whose offsets were committed
	LastInsert    time.Time // zero before the first insert
}

// Stats returns the sink's counters; safe to call while Run runs. The
// playpipe binary reports them as metrics instead (deadcode lists Stats):
// it is for programs that embed the sink, and the sink tests.
func (s *Sink) Stats() SinkStats {
	st := SinkStats{Records: s.stats.records.Load(), Batches: s.stats.batches.Load(), InsertRetries: s.stats.retries.Load(), Committed: s.stats.committed.Load()}
	if ms := s.stats.lastInsertMS.Load(); ms > 0 {
		st.LastInsert = time.UnixMilli(ms)
	}
	return st
}

// NewSink validates cfg and returns a sink; Run starts it.
func NewSink(cfg SinkConfig) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m := telemetry.OrNoopMeterProvider(cfg.MeterProvider).Meter("github.com/playpipe/playpipe/analytics")
	s := &Sink{cfg: cfg, log: cfg.Logger.With("role", "sink"), tracer: telemetry.OrNoopTracerProvider(cfg.TracerProvider).Tracer("github.com/playpipe/playpipe/analytics")}
	var err error
	if s.rows, err = m.Int64Counter("playpipe.sink.rows", metric.WithDescription("rows inserted into the ledger, by table")); err != nil {
		return nil, fmt.Errorf("analytics: metric: %w", err)
	}
	if s.insDur, err = m.Float64Histogram("playpipe.sink.insert.duration", metric.WithUnit("s"), metric.WithDescription("duration of one successful insert of a batch into one table")); err != nil {
		return nil, fmt.Errorf("analytics: metric: %w", err)
	}
	if s.retry, err = m.Int64Counter("playpipe.sink.insert.retries", metric.WithDescription("failed insert attempts that will be retried")); err != nil {
		return nil, fmt.Errorf("analytics: metric: %w", err)
	}
	return s, nil
}

// Run consumes until ctx ends, then drains what it has read (insert and
// commit) within ShutdownTimeout and returns nil; it returns an error only
// when it cannot run (bad Kafka settings) or the drain did not finish.
// ClickHouse being down is not an error: Run waits and retries.
func (s *Sink) Run(ctx context.Context) error {
	conn := s.cfg.conn
	if conn == nil {
		c, err := s.cfg.ClickHouse.Open()
		if err != nil {
			return err
		}
		defer c.Close()
		conn = c
	}
	if err := s.migrate(ctx, conn); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before ClickHouse answered: nothing was read
		}
		return err
	}

	topics := s.cfg.Kafka.Topics()
	opts, err := s.cfg.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	opts = append(append(opts, s.cfg.Kafka.GroupOpts(s.cfg.Group)...),
		kgo.ConsumeTopics(topics.Ledger()...),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.ClientID("playpipe-sink"),
		// A fetch waits for 1 MiB of records or 250 ms, whichever comes
		// first: fewer, fuller fetches cost the sink about a third less CPU
		// per play in make bench-e2e (8.0–8.8 → 5.4–6.3 µs) and the broker
		// some too. The wait is also how often an idle sink asks: on Apache
		// Kafka a read-committed fetch of the ledger topics costs the broker
		// about 1 ms of CPU, and with every role idle its request and fetch
		// purgatory threads used 2.2 % of a core at 50 ms (19 fetches a
		// second), 0.6 % at 250 ms (4 a second; docs/performance.md). The
		// ledger lags by at most 250 ms more than the batch's own linger; a
		// longer wait delays the tail of a short backlog (at 500 ms the sink
		// benchmark's 150k-row rounds fell from ~410k to ~150k rows/s,
		// docs/audit.md).
		kgo.FetchMaxWait(250*time.Millisecond),
		kgo.FetchMinBytes(1<<20),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("analytics: sink: kafka client: %w", err)
	}
	defer kafkax.CloseClient(cl, 0) // bounded leave: never waits on a frozen broker
	s.log.Info("sink started", "group", s.cfg.Group, "topics", topics.Ledger(), "clickhouse", s.cfg.ClickHouse.Addr,
		"database", s.cfg.ClickHouse.Database, "cluster", s.cfg.ClickHouse.Cluster, "batch_rows", s.cfg.BatchRows, "linger", s.cfg.Linger)

	queue := make(chan *batch, s.cfg.QueueBatches)
	// free holds emptied batches for reuse (their columns keep capacity):
	// the queue, the reader's and the writer's batch bound the memory.
	free := make(chan *batch, s.cfg.QueueBatches+2)
	rctx, stopReader := context.WithCancel(ctx)
	defer stopReader()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owner: Run; ends when rctx ends (then closes queue)
		defer wg.Done()
		s.read(rctx, cl, topics, queue, free)
	}()

	werr := s.write(ctx, conn, cl, queue, free)
	// When the writer gave up early (drain timeout, crash hook) the reader
	// may still run or be blocked on a full queue: stop it and empty the queue.
	stopReader()
	go func() { // owner: Run; ends when the reader closes queue
		for range queue {
		}
	}()
	wg.Wait()
	return werr
}

// migrate applies the migrations, retrying while ClickHouse is unreachable.
func (s *Sink) migrate(ctx context.Context, conn driver.Conn) error {
	for attempt := 1; ; attempt++ {
		mctx, cancel := context.WithTimeout(ctx, s.cfg.InsertTimeout)
		applied, err := s.cfg.ClickHouse.Migrate(mctx, conn)
		cancel()
		if err == nil {
			if len(applied) > 0 {
				s.log.Info("ledger schema migrated", "applied", applied, "version", LatestVersion())
			}
			s.migrated.Store(true)
			return nil
		}
		s.log.Warn("clickhouse: cannot apply the ledger schema; retrying", "attempt", attempt, "err", err)
		if !backoff.Sleep(ctx, s.backoff(attempt)) {
			return ctx.Err()
		}
	}
}

// read polls records, decodes them into batches of at most BatchRows that
// are closed after Linger, and hands full batches to the writer. It blocks
// when the queue is full. It closes queue when ctx ends, after handing over
// the partial batch it holds.
func (s *Sink) read(ctx context.Context, cl *kgo.Client, topics kafkax.Topics, queue chan<- *batch, free <-chan *batch) {
	defer close(queue)
	var cur *batch
	var deadline time.Time
	// sizes is the most rows per table, and bytes per String column, of a
	// batch so far: a batch taken for filling reserves that much room (a
	// no-op for one that had it). Columns keep their capacity across reuse,
	// so this is the room they would reach anyway, without the copies of
	// growing row by row; it matters when the mix of topics shifts (a fetch
	// is often one topic's).
	var sizes room
	gens := &generations{adm: kadm.NewClient(cl), events: topics.Events, rejected: topics.Rejected, ids: map[string]string{}, log: s.log}
	// send blocks while the queue is full (it never drops): the writer takes
	// batches until the queue closes, and when the writer has given up Run
	// empties the queue, so a send always ends.
	send := func() {
		sizes = sizes.max(cur.size())
		queue <- cur
		cur = nil
	}
	for {
		pctx, cancel := ctx, context.CancelFunc(func() {})
		if cur != nil {
			pctx, cancel = context.WithDeadline(ctx, deadline)
		}
		want := s.cfg.BatchRows
		if cur != nil {
			want -= cur.records
		}
		fs := cl.PollRecords(pctx, want)
		cancel()
		if ctx.Err() != nil {
			if cur != nil {
				send() // hand over what was read: the writer drains it
			}
			return
		}
		fetchErr := false
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				fetchErr = true
				s.cfg.Kafka.Faults.Fetch(s.log, t, p, err) // at most a line a minute per fault
			}
		})
		if fetchErr && fs.NumRecords() == 0 && !backoff.Sleep(ctx, s.cfg.RetryMin) {
			continue // ctx ended: the next round hands over and returns
		}
		gens.see(ctx, fs)
		for _, f := range fs {
			for _, ft := range f.Topics {
				id := topicIDString(ft.TopicID)
				for _, p := range ft.Partitions {
					for _, r := range p.Records {
						if cur == nil {
							select {
							case cur = <-free:
							default:
								cur = newBatch(topics)
							}
							cur.reserve(sizes)
							cur.topicIDs = gens.ids
							deadline = time.Now().Add(s.cfg.Linger)
						}
						cur.addGen(r, id)
					}
				}
			}
		}
		if cur != nil && (cur.records >= s.cfg.BatchRows || !time.Now().Before(deadline)) {
			send()
		}
	}
}

// write inserts each batch (retrying until it succeeds), then commits its
// offsets. When queue closes (ctx ended) it drains the rest within
// ShutdownTimeout.
func (s *Sink) write(ctx context.Context, conn driver.Conn, cl *kgo.Client, queue <-chan *batch, free chan<- *batch) error {
	var dctx context.Context
	var dcancel context.CancelFunc = func() {}
	defer func() { dcancel() }()
	// opCtx is ctx while it lives, then the drain context.
	opCtx := func() context.Context {
		if ctx.Err() == nil {
			return ctx
		}
		if dctx == nil {
			dctx, dcancel = context.WithTimeout(context.WithoutCancel(ctx), s.cfg.ShutdownTimeout)
		}
		return dctx
	}
	uncommitted := map[string]map[int32]kgo.EpochOffset{}
	for b := range queue {
		for {
			ictx := opCtx()
			err := s.insert(ictx, conn, b)
			if err == nil {
				break
			}
			if ictx == ctx && ctx.Err() != nil {
				continue // stopped mid-insert: go on under the drain deadline
			}
			return fmt.Errorf("analytics: sink: drain at shutdown: %d records not inserted (nor committed: the next sink reads them again): %w", b.records, err)
		}
		s.stats.records.Add(int64(b.records))
		s.stats.batches.Add(1)
		s.stats.lastInsertMS.Store(time.Now().UnixMilli())
		if s.cfg.afterInsert != nil {
			if err := s.cfg.afterInsert(b.records); err != nil {
				return err
			}
		}
		mergeOffsets(uncommitted, b.next)
		s.commit(opCtx(), cl, uncommitted)
		b.reset()
		select {
		case free <- b:
		default:
		}
	}
	if len(uncommitted) > 0 {
		s.commit(opCtx(), cl, uncommitted)
	}
	if dctx != nil {
		s.log.Info("sink drained and stopped")
	}
	return nil
}

func mergeOffsets(dst, src map[string]map[int32]kgo.EpochOffset) {
	for t, ps := range src {
		d := dst[t]
		if d == nil {
			d = map[int32]kgo.EpochOffset{}
			dst[t] = d
		}
		for p, o := range ps {
			if cur, ok := d[p]; !ok || o.Offset > cur.Offset {
				d[p] = o
			}
		}
	}
}

// commit commits the offsets of inserted records. A failed commit is not
// retried here: the offsets stay pending and go with the next commit; a
// crash before then makes the next sink re-insert rows that the ledger
// recognises by their Kafka location.
func (s *Sink) commit(ctx context.Context, cl *kgo.Client, offs map[string]map[int32]kgo.EpochOffset) {
	if len(offs) == 0 {
		return
	}
	var cerr error
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 && cerr == nil {
					cerr = fmt.Errorf("commit %s[%d]: error code %d", t.Topic, p.Partition, p.ErrorCode)
				}
			}
		}
	})
	if cerr != nil {
		s.log.Warn("kafka: offset commit failed; will commit with the next batch", "err", cerr)
		return
	}
	clear(offs)
	s.stats.committed.Add(1)
}

// insert writes every table of b, retrying with backoff until all are in
// or ctx ends. A table already written is not written again.
func (s *Sink) insert(ctx context.Context, conn driver.Conn, b *batch) error {
	ctx, span := s.tracer.Start(ctx, "sink.insert", trace.WithAttributes(attribute.Int("playpipe.sink.records", b.records)))
	defer span.End()
	// The tables are inserted concurrently: each insert writes a new part
	// (files synced to disk), so the waits overlap. A table already in is
	// not inserted again when another one failed.
	var mu sync.Mutex
	done := make(map[string]bool)
	for attempt := 1; ; attempt++ {
		var g errgroup.Group
		for _, t := range b.tables() {
			mu.Lock()
			skip := t.n() == 0 || done[t.name()]
			mu.Unlock()
			if skip {
				continue
			}
			g.Go(func() error {
				start := time.Now()
				if err := s.insertTable(ctx, conn, t); err != nil {
					return fmt.Errorf("insert %d rows into %s: %w", t.n(), s.cfg.ClickHouse.WriteTable(t.name()), err)
				}
				mu.Lock()
				done[t.name()] = true
				mu.Unlock()
				attr := metric.WithAttributes(attribute.String("table", t.name()))
				s.rows.Add(ctx, int64(t.n()), attr)
				s.insDur.Record(ctx, time.Since(start).Seconds(), attr)
				return nil
			})
		}
		err := g.Wait()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			span.RecordError(err)
			return err
		}
		s.retry.Add(ctx, 1)
		s.stats.retries.Add(1)
		wait := s.backoff(attempt)
		s.log.Warn("clickhouse: insert failed; retrying (nothing is committed until it succeeds)", "attempt", attempt, "in", wait.Round(time.Millisecond), "err", err)
		if errSchemaMissing(err) {
			if _, merr := s.cfg.ClickHouse.Migrate(ctx, conn); merr != nil {
				s.log.Warn("clickhouse: re-applying the ledger schema failed", "err", merr)
			}
		}
		if !backoff.Sleep(ctx, wait) {
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		}
	}
}

func (s *Sink) insertTable(ctx context.Context, conn driver.Conn, t table) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.InsertTimeout)
	// Cancelled a second after the insert, not at once: clickhouse-go's
	// batch.Send watches ctx in a goroutine that it stops, without waiting
	// for it, when Send returns; a ctx cancelled right then can still make
	// that goroutine close the connection, by then back in the pool, and
	// the next insert on it fails after the server took its rows (in doubt,
	// so inserted again: seen as a third row in TestLedgerSuite under -race).
	// clickhouse-go PR #2032 (open) fixes the watchdog.
	defer time.AfterFunc(time.Second, cancel)
	bt, err := conn.PrepareBatch(s.cfg.ClickHouse.insertContext(ctx), "INSERT INTO "+s.cfg.ClickHouse.WriteTable(t.name())+" ("+t.columns()+")")
	if err != nil {
		return err
	}
	if err := fillBatch(bt, t); err != nil {
		_ = bt.Abort()
		return err
	}
	return bt.Send()
}

// backoff is the wait before the next insert or migration attempt:
// exponential from RetryMin to RetryMax with ±25 % jitter.
func (s *Sink) backoff(attempt int) time.Duration {
	return backoff.Policy{Initial: s.cfg.RetryMin, Max: s.cfg.RetryMax, Jitter: backoff.Proportional}.Delay(attempt, 0)
}
