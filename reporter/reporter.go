package reporter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
)

// API is what the reporter needs of the partner API client
// (*partnerapi.Client implements it).
type API interface {
	// ReportPlayJSON makes exactly one POST /partners/royalty-tracking of
	// body. On 401 the client drops its token; the next call takes a new
	// session, one at a time for all callers.
	ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error)
	// Session forces a new session and reports how it was served: the live
	// probe of a standby episode.
	Session(ctx context.Context) (partnerapi.Meta, error)
}

// ErrConfiguration is wrapped by the error Run returns when the partner API
// answered in a way no retry can fix (edge 403/1010, credentials rejected,
// endpoint not found). The reporter stopped and committed nothing more.
var ErrConfiguration = errors.New("reporter: configuration error")

// Reporter delivers the track plays of <prefix>.reports to the partner API
// and publishes every answer to <prefix>.deliveries. Build it with New, run
// it with Run (once).
type Reporter struct {
	cfg     Config
	api     API
	log     *slog.Logger
	met     *metrics
	limiter *rate.Limiter
	backoff retryPolicy
	// kgoOpts are appended to the Kafka client options (tests tune group
	// timeouts with them).
	kgoOpts []kgo.Opt
}

// New validates cfg and returns a Reporter posting through api.
func New(cfg Config, api API) (*Reporter, error) {
	if api == nil {
		return nil, fmt.Errorf("%w: no partner API client", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	met, err := newMetrics()
	if err != nil {
		return nil, fmt.Errorf("reporter: metrics: %w", err)
	}
	r := &Reporter{
		cfg: cfg, api: api, log: cfg.Logger, met: met,
		backoff: retryPolicy{Initial: cfg.BackoffInitial, Max: cfg.BackoffMax, RetryAfterMax: cfg.RetryAfterMax},
	}
	if cfg.Rate > 0 {
		r.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst)
	}
	return r, nil
}

// job is one report record on its way to a final outcome. The coordinator
// owns it, except while a worker posts it.
type job struct {
	ps   *partState
	seq  uint64
	rec  *kgo.Record
	id   string
	evID string
	body []byte

	attempt  int // posts made by this reporter
	failures int // consecutive retryable failures (backoff exponent)
	renews   int // consecutive 401s
	replay   bool
	gen      uint64 // standby generation when last sent
	readyAt  time.Time

	// Set by the worker for the coordinator.
	dec     Decision
	latency time.Duration
	traceID string

	// followers are later records with the same report id that wait for
	// this one's final outcome instead of being posted again.
	followers []*job
}

type tpKey struct {
	topic     string
	partition int32
}

// partState is the coordinator's state of one assigned partition.
type partState struct {
	key      tpKey
	wm       watermark
	inflight int  // jobs being posted or waiting for their Delivery record to persist
	revoking bool // revocation asked: dispatch nothing more of it
	dropped  bool // revoked/lost: late events are ignored
	dirty    bool // commit point moved since the last commit
}

type revocation struct {
	parts    []*partState
	lost     bool
	deadline time.Time
	reply    chan map[string]map[int32]kgo.EpochOffset
}

type revokeReq struct {
	parts map[string][]int32
	lost  bool
	reply chan map[string]map[int32]kgo.EpochOffset
}

// episode is one standby episode: from the first standby answer to a live probe.
type episode struct {
	start   time.Time
	span    trace.Span
	first   *job
	answers int
	probes  atomic.Int64
}

type (
	kmsgCommitReq  = kmsg.OffsetCommitRequest
	kmsgCommitResp = kmsg.OffsetCommitResponse
)

// run is the state of one Run.
type run struct {
	*Reporter
	cl     *kgo.Client
	topics kafkax.Topics

	postCtx     context.Context // cancelled to abandon posts in flight
	cancelPosts context.CancelFunc

	revokeCh  chan revokeReq
	wake      chan struct{} // capacity 1: the housekeeper has something to look at
	room      chan struct{} // capacity 1: pending dropped, the poller may fetch
	pending   atomic.Int64  // records held by the partition trackers
	coordDone chan struct{}
	bg        sync.WaitGroup // prober goroutines
	// publishing counts answers applied whose Delivery record is not handed
	// to the Kafka client yet.
	publishing sync.WaitGroup

	// The state below is guarded by mu. Workers apply their own answers and
	// take their next report under it, so a report costs no goroutine
	// hand-off; idle workers wait on cond.
	mu             sync.Mutex
	cond           *sync.Cond
	idle           int  // workers waiting on cond
	exiting        bool // workers return
	retryAt        time.Time
	parts          map[tpKey]*partState
	fresh          fifo
	ready          fifo // retries and replays: dispatched before fresh records
	delayed        delayQueue
	held           []*job // answered by standby during the current episode
	active         map[string]*job
	recent         *recentSet
	inflight       int // jobs handed to workers whose post has not come back
	persisting     int // final jobs waiting for their Delivery record
	standby        *episode
	gen            uint64
	stopping       bool
	noCommit       bool
	fatal          error
	revocations    []*revocation
	commitInFlight bool
	lastCommit     time.Time
}

// Run consumes <prefix>.reports and delivers every report until ctx ends
// (graceful shutdown: stop fetching, let posts in flight finish within
// ShutdownTimeout or abandon them, commit what is final, return nil) or the
// API answers with a configuration error (returns an error wrapping
// ErrConfiguration, having committed nothing more).
func (r *Reporter) Run(ctx context.Context) error {
	postCtx, cancelPosts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPosts()
	rn := &run{
		Reporter: r, topics: r.cfg.Kafka.Topics(),
		postCtx: postCtx, cancelPosts: cancelPosts,
		revokeCh:  make(chan revokeReq),
		wake:      make(chan struct{}, 1),
		room:      make(chan struct{}, 1),
		coordDone: make(chan struct{}),
		parts:     map[tpKey]*partState{},
		active:    map[string]*job{},
		recent:    newRecentSet(r.cfg.RecentWindow),
	}
	rn.cond = sync.NewCond(&rn.mu)
	base, err := r.cfg.Kafka.ClientOpts()
	if err != nil {
		return fmt.Errorf("reporter: %w", err)
	}
	opts := append(append(base, r.cfg.Kafka.GroupOpts(r.cfg.Group)...),
		kgo.ConsumeTopics(rn.topics.Reports),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { rn.onRevoked(ctx, cl, m, false) }),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { rn.onRevoked(ctx, cl, m, true) }),
		// Bounded fetch buffers: at most ~2 MiB (compressed) fetched ahead, whatever the backlog.
		kgo.FetchMaxBytes(2<<20),
		kgo.FetchMaxPartitionBytes(512<<10),
		kgo.DefaultProduceTopic(rn.topics.Deliveries),
		kgo.ProducerLinger(2*time.Millisecond),
	)
	opts = append(opts, r.kgoOpts...)
	rn.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("reporter: kafka client: %w", err)
	}
	r.log.Info("reporter starting", "topic", rn.topics.Reports, "deliveries", rn.topics.Deliveries, "group", r.cfg.Group,
		"concurrency", r.cfg.Concurrency, "rate", r.cfg.Rate, "max_pending", r.cfg.MaxPending)

	var workers sync.WaitGroup
	for range r.cfg.Concurrency {
		workers.Go(rn.worker)
	}
	pollCtx, stopPoll := context.WithCancel(ctx)
	var poller sync.WaitGroup
	poller.Go(func() { rn.poll(pollCtx) })

	runErr := rn.coordinate(ctx)
	close(rn.coordDone)

	stopPoll()
	poller.Wait()
	rn.mu.Lock()
	rn.exiting = true
	rn.cond.Broadcast()
	rn.mu.Unlock()
	workers.Wait()
	cancelPosts()
	rn.bg.Wait()
	rn.cl.CloseAllowingRebalance()
	if runErr != nil {
		r.log.Error("reporter stopped", "err", runErr)
	} else {
		r.log.Info("reporter stopped")
	}
	return runErr
}

// poll fetches records while the trackers have room and adds them to the
// state. With BlockRebalanceOnPoll, a rebalance cannot slip between a poll
// and the intake, so the state never holds a record of a partition that was
// already revoked.
func (rn *run) poll(ctx context.Context) {
	maxPending := int64(rn.cfg.MaxPending)
	for {
		n := maxPending - rn.pending.Load()
		if n <= 0 {
			select {
			case <-rn.room:
				continue
			case <-ctx.Done():
				return
			}
		}
		fs := rn.cl.PollRecords(ctx, int(n))
		if ctx.Err() != nil || fs.IsClientClosed() {
			rn.cl.AllowRebalance()
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				rn.log.Warn("kafka fetch error", "topic", t, "partition", p, "err", err)
			}
		})
		recs := fs.Records()
		if len(recs) > 0 {
			rn.pending.Add(int64(len(recs)))
			// Decode outside the lock.
			batch := make([]fetched, len(recs))
			for i, rec := range recs {
				batch[i].rec = rec
				batch[i].err = decodeTrackPlay(rec.Value, &batch[i].tp)
			}
			rn.mu.Lock()
			invalid := rn.intake(batch)
			rn.mu.Unlock()
			for _, j := range invalid {
				rn.cl.Produce(context.Background(), rn.deliveryRecord(context.Background(), j), func(_ *kgo.Record, err error) {
					rn.persistedLocked(j, err)
				})
			}
		}
		rn.cl.AllowRebalance()
	}
}

// onRevoked runs in the Kafka client's group goroutine: it asks the
// coordinator to stop dispatching the partitions, waits until their posts in
// flight are back (bounded by ShutdownTimeout), and commits their final
// offsets (not for lost partitions, not after a configuration error).
func (rn *run) onRevoked(ctx context.Context, cl *kgo.Client, m map[string][]int32, lost bool) {
	if len(m) == 0 {
		return
	}
	req := revokeReq{parts: m, lost: lost, reply: make(chan map[string]map[int32]kgo.EpochOffset, 1)}
	select {
	case rn.revokeCh <- req:
	case <-rn.coordDone:
		return // the coordinator committed what was final before it returned
	}
	var offs map[string]map[int32]kgo.EpochOffset
	select {
	case offs = <-req.reply:
	case <-rn.coordDone:
		return
	}
	if len(offs) == 0 {
		return
	}
	cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsgCommitReq, resp *kmsgCommitResp, err error) {
		_ = rn.logCommit("revoke", offs, resp, err)
	})
}

// coordinate does the housekeeping that no worker does: retry timers,
// commits, revocations, shutdown. It returns once the run is over and every
// final offset that may be committed is committed.
func (rn *run) coordinate(ctx context.Context) error {
	commitTick := time.NewTicker(rn.cfg.CommitInterval)
	defer commitTick.Stop()
	retryTimer := time.NewTimer(time.Hour)
	retryTimer.Stop()
	var deadline <-chan time.Time
	done := ctx.Done()

	for {
		rn.mu.Lock()
		rn.checkRevocations(time.Now())
		if rn.stopping && rn.inflight == 0 {
			rn.mu.Unlock()
			return rn.finish()
		}
		if next := rn.delayed.next(); !next.IsZero() && !next.Equal(rn.retryAt) {
			rn.retryAt = next
			retryTimer.Reset(max(time.Until(next), 0))
		}
		var offs map[string]map[int32]kgo.EpochOffset
		if !rn.stopping {
			offs = rn.commitOffsets()
		}
		rn.mu.Unlock()
		if offs != nil {
			rn.cl.CommitOffsets(ctx, offs, func(_ *kgo.Client, _ *kmsgCommitReq, resp *kmsgCommitResp, err error) {
				failed := rn.logCommit("periodic", offs, resp, err)
				rn.mu.Lock()
				rn.committed(failed)
				rn.mu.Unlock()
			})
		}

		select {
		case <-rn.wake:
		case req := <-rn.revokeCh:
			rn.mu.Lock()
			rn.startRevocation(req)
			rn.mu.Unlock()
		case <-retryTimer.C:
			rn.mu.Lock()
			rn.retryAt = time.Time{}
			rn.delayed.due(time.Now(), &rn.ready)
			rn.jobsReady()
			rn.mu.Unlock()
		case <-commitTick.C:
		case <-done:
			done = nil
			deadline = time.After(rn.cfg.ShutdownTimeout)
			rn.mu.Lock()
			rn.stopping = true
			rn.log.Info("reporter shutting down: no new posts; waiting for posts in flight",
				"in_flight", rn.inflight, "timeout", rn.cfg.ShutdownTimeout)
			rn.mu.Unlock()
		case <-deadline:
			deadline = nil
			rn.mu.Lock()
			rn.log.Warn("shutdown timeout: abandoning posts in flight (their reports stay uncommitted and are posted again on restart)",
				"in_flight", rn.inflight)
			rn.mu.Unlock()
			rn.cancelPosts()
		}
	}
}

// poke wakes the housekeeper (never blocks).
func (rn *run) poke() {
	select {
	case rn.wake <- struct{}{}:
	default:
	}
}

// jobsReady wakes idle workers after jobs were queued (mu held).
func (rn *run) jobsReady() {
	if rn.idle > 0 {
		rn.cond.Broadcast()
	}
}

// finish runs once every post is back: it waits for the Delivery records to
// reach Kafka, then commits every final offset (unless a configuration error
// forbids committing).
func (rn *run) finish() error {
	rn.publishing.Wait()
	flushCtx, cancel := context.WithTimeout(context.Background(), rn.cfg.ShutdownTimeout)
	err := rn.cl.Flush(flushCtx)
	cancel()
	if err != nil {
		rn.log.Warn("flushing delivery records", "err", err)
	}
	rn.mu.Lock()
	if rn.standby != nil {
		rn.log.Warn("reporter stopped during a standby episode: the reports standby answered stay uncommitted and are replayed on restart",
			"held", len(rn.held))
		rn.endEpisode(len(rn.held), "reporter stopped during standby")
	}
	var offs map[string]map[int32]kgo.EpochOffset
	if !rn.noCommit {
		for _, ps := range rn.parts {
			ps.dirty = true // all of them: a periodic commit in flight may fail
		}
		offs = rn.dirtyOffsets()
	}
	fatal := rn.fatal
	rn.mu.Unlock()
	if len(offs) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), rn.cfg.ShutdownTimeout)
		rn.cl.CommitOffsetsSync(ctx, offs, func(_ *kgo.Client, _ *kmsgCommitReq, resp *kmsgCommitResp, err error) {
			if failed := rn.logCommit("shutdown", offs, resp, err); failed == nil {
				rn.log.Info("final offsets committed", "offsets", offs)
			}
		})
		cancel()
	}
	return fatal
}

// wireTrackPlay is the part of schemas.TrackPlay the reporter reads; the
// report body stays raw so that the exact bytes are posted.
type wireTrackPlay struct {
	ReportID     string          `json:"report_id"`
	EventID      string          `json:"event_id"`
	BelowMinimum bool            `json:"below_minimum"`
	Report       json.RawMessage `json:"report"`
}

// slimRecord copies what the reporter keeps of a fetched record: where it
// came from and its headers (trace context), not its key and value.
func slimRecord(r *kgo.Record) *kgo.Record {
	c := &kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, LeaderEpoch: r.LeaderEpoch}
	if len(r.Headers) > 0 {
		c.Headers = make([]kgo.RecordHeader, len(r.Headers))
		for i, h := range r.Headers {
			c.Headers[i] = kgo.RecordHeader{Key: strings.Clone(h.Key), Value: bytes.Clone(h.Value)}
		}
	}
	return c
}

// fetched is a record with its decoded track play.
type fetched struct {
	rec *kgo.Record
	tp  wireTrackPlay
	err error
}

// intake adds fetched records to their partitions' trackers and queues them
// (mu held). It returns the records that cannot be posted, whose rejected
// Delivery record the caller publishes outside the lock.
func (rn *run) intake(batch []fetched) (invalid []*job) {
	defer rn.jobsReady()
	var ps *partState
	for i := range batch {
		rec, tp, err := batch[i].rec, &batch[i].tp, batch[i].err
		key := tpKey{rec.Topic, rec.Partition}
		if ps == nil || ps.key != key {
			if ps = rn.parts[key]; ps == nil {
				ps = &partState{key: key}
				rn.parts[key] = ps
			}
		}
		seq := ps.wm.add(rec.Offset, rec.LeaderEpoch)
		// Keep a small copy of the record: the fetched one shares its memory
		// with the whole fetched batch, which a pending report would pin.
		rec = slimRecord(rec)
		switch {
		case err == nil && tp.ReportID != "" && tp.BelowMinimum:
			// Shorter than the minimum play length: counted in the ledger,
			// never posted. Final at once.
			rn.met.skip(context.Background(), "below_minimum")
			rn.markDone(ps, seq)
		case err != nil || tp.ReportID == "" || len(tp.Report) == 0 || tp.Report[0] != '{':
			// A record the reporter cannot post. It is published as rejected
			// with the reason, so it is never lost silently.
			msg := "invalid track play record: no report_id or report object"
			if err != nil {
				msg = "invalid track play record: " + err.Error()
			}
			rn.log.Error("invalid record on the reports topic", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "err", msg)
			rn.met.skip(context.Background(), "invalid")
			j := &job{ps: ps, seq: seq, rec: rec, id: tp.ReportID, evID: tp.EventID}
			j.dec = Decision{Action: ActRejected, Outcome: schemas.OutcomeRejected, Message: msg}
			ps.inflight++
			rn.persisting++
			invalid = append(invalid, j)
		default:
			rn.fresh.push(&job{ps: ps, seq: seq, rec: rec, id: tp.ReportID, evID: tp.EventID, body: tp.Report})
		}
	}
	return invalid
}

// next takes the next report to post (mu held), or nil while there is none
// or a standby episode or a shutdown holds dispatching.
func (rn *run) next() *job {
	for rn.inflight < rn.cfg.Concurrency && !rn.stopping && rn.standby == nil {
		j := rn.ready.pop()
		if j == nil {
			if j = rn.fresh.pop(); j == nil {
				return nil
			}
		}
		if j.ps.revoking || j.ps.dropped {
			continue
		}
		if rn.recent.has(j.id) && rn.active[j.id] != j {
			// Already delivered or rejected within the window (re-published
			// event): final without a post.
			rn.met.skip(context.Background(), "duplicate")
			rn.log.Debug("skipping report already final", "report_id", j.id)
			rn.markDone(j.ps, j.seq)
			continue
		}
		if a := rn.active[j.id]; a != nil && a != j {
			// The same report is on its way: wait for its outcome.
			a.followers = append(a.followers, j)
			continue
		}
		rn.active[j.id] = j
		j.gen = rn.gen
		rn.inflight++
		j.ps.inflight++
		return j
	}
	return nil
}

// worker posts reports one at a time: it applies the answer to the state
// and takes the next report under one lock, then publishes the answer's
// Delivery record and posts the next report outside it.
func (rn *run) worker() {
	var last *job
	var rec *kgo.Record
	for {
		rn.mu.Lock()
		if last != nil {
			rn.inflight--
			rn.posted(last)
			if rec != nil {
				rn.publishing.Add(1) // before inflight can be seen at 0: finish waits for it
			}
		}
		j := rn.next()
		rn.mu.Unlock()
		if rec != nil {
			rn.publish(last, rec)
			rn.publishing.Done()
		}
		last, rec = nil, nil
		if j == nil {
			rn.mu.Lock()
			for j = rn.next(); j == nil && !rn.exiting; j = rn.next() {
				rn.idle++
				rn.cond.Wait()
				rn.idle--
			}
			rn.mu.Unlock()
			if j == nil {
				return
			}
		}
		last, rec = j, rn.post(j)
	}
}

// publish sends the Delivery record of j's last answer. A final answer's
// offset may be committed only once its record is in Kafka: the ledger
// never misses the outcome of a committed report.
func (rn *run) publish(j *job, rec *kgo.Record) {
	if j.dec.Action.Final() {
		rn.cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) { rn.persistedLocked(j, err) })
		return
	}
	rn.cl.Produce(context.Background(), rec, func(_ *kgo.Record, err error) {
		if err != nil && !errors.Is(err, kgo.ErrClientClosed) {
			rn.mu.Lock()
			rn.stop(fmt.Errorf("reporter: publish delivery record: %w", err), false)
			rn.mu.Unlock()
		}
	})
}

func (rn *run) persistedLocked(j *job, err error) {
	rn.mu.Lock()
	rn.persisted(j, err)
	if len(rn.revocations) > 0 {
		rn.poke()
	}
	rn.mu.Unlock()
}

// post runs in a worker, outside the lock: one POST, classified. It returns
// the Delivery record to publish (nil for an abandoned post).
func (rn *run) post(j *job) *kgo.Record {
	if rn.limiter != nil {
		if err := rn.limiter.Wait(rn.postCtx); err != nil {
			j.dec = Decision{Action: ActAbandon, Err: err}
			return nil
		}
	}
	j.attempt++
	// A consumer span per attempt ("process <topic>", messaging semantic
	// conventions) continues the trace the record carries (or starts one);
	// the delivery span and the partner API's HTTP span are inside it.
	ctx, proc := tracer.Start(telemetry.Extract(rn.postCtx, j.rec), "process "+j.rec.Topic, trace.WithSpanKind(trace.SpanKindConsumer))
	defer proc.End()
	if proc.IsRecording() {
		proc.SetAttributes(attribute.String("messaging.system", "kafka"), attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", j.rec.Topic), attribute.Int("messaging.destination.partition.id", int(j.rec.Partition)),
			attribute.Int64("messaging.kafka.offset", j.rec.Offset), attribute.String("messaging.kafka.message.key", j.id))
	}
	ctx, span := tracer.Start(ctx, "playpipe.report.deliver")
	start := time.Now()
	res, err := rn.api.ReportPlayJSON(ctx, j.body)
	lat := res.Latency
	if lat <= 0 {
		lat = time.Since(start)
	}
	d := Classify(res, err, !rn.cfg.LiveBypassNotDelivered)
	if span.IsRecording() {
		span.SetAttributes(
			attribute.String("playpipe.report_id", j.id),
			attribute.Int("playpipe.delivery.attempt", j.attempt),
			attribute.Bool("playpipe.delivery.replay", j.replay),
			attribute.Int("http.response.status_code", d.Status),
			attribute.String("playpipe.served_by", string(d.ServedBy)),
			attribute.String("playpipe.delivery.outcome", d.Outcome),
		)
		if d.Reason != "" {
			span.SetAttributes(attribute.String("playpipe.delivery.retry_reason", d.Reason))
		}
		if d.Err != nil && d.Action != ActRejected {
			span.SetStatus(codes.Error, d.Action.String())
			span.RecordError(d.Err)
		}
	}
	span.End()
	j.dec, j.latency = d, lat
	if sc := span.SpanContext(); sc.HasTraceID() {
		j.traceID = sc.TraceID().String()
	}
	if d.Action == ActAbandon {
		return nil
	}
	rn.met.record(ctx, d, lat.Seconds())
	return rn.deliveryRecord(ctx, j)
}

// deliveryRecord builds the <prefix>.deliveries record of j's last answer.
// It reads only fields the worker owns while posting.
func (rn *run) deliveryRecord(ctx context.Context, j *job) *kgo.Record {
	d := j.dec
	del := schemas.Delivery{
		V: schemas.DeliveryVersion, ReportID: j.id, EventID: j.evID, Outcome: d.Outcome, Attempt: j.attempt,
		HTTPStatus: d.Status, ServedBy: string(d.ServedBy), Message: d.Message, Fields: d.Fields,
		Reason: d.Reason, LatencyUS: j.latency.Microseconds(), TraceID: j.traceID, Replay: j.replay,
		At: time.Now().UnixMilli(),
	}
	if del.Message == "" && d.Err != nil && d.Action != ActDelivered {
		del.Message = d.Err.Error()
	}
	rec := &kgo.Record{Key: []byte(j.id), Value: appendDelivery(make([]byte, 0, 256), &del)}
	telemetry.Inject(ctx, rec)
	return rec
}

// posted applies the answer of j's post to the state (mu held).
func (rn *run) posted(j *job) {
	ps, d := j.ps, j.dec
	if d.Action.Final() {
		rn.persisting++
		rn.recent.add(j.id)
		if d.Action == ActRejected {
			rn.log.Warn("report rejected by the partner API", "report_id", j.id, "status", d.Status, "message", d.Message, "fields", d.Fields)
		}
		if rn.stopping {
			rn.poke()
		}
		return // ps.inflight drops when the Delivery record is persisted
	}
	ps.inflight--
	if ps.dropped || ps.revoking {
		rn.release(j)
		return
	}
	switch d.Action {
	case ActStandby:
		rn.standbyAnswer(j)
	case ActRetry:
		j.failures++
		delay := time.Duration(0)
		if d.Renew {
			j.renews++
			// The first 401 retries at once (the client takes a new
			// session); repeated ones back off like transient failures.
			if j.renews > 1 {
				delay = rn.backoff.delay(j.renews-1, 0)
			}
		} else {
			j.renews = 0
			delay = rn.backoff.delay(j.failures, d.RetryAfter)
		}
		rn.log.Debug("report post to be retried", "report_id", j.id, "attempt", j.attempt, "reason", d.Reason, "status", d.Status, "delay", delay)
		if delay <= 0 {
			rn.ready.push(j)
		} else {
			j.readyAt = time.Now().Add(delay)
			rn.delayed.add(j)
			if rn.retryAt.IsZero() || j.readyAt.Before(rn.retryAt) {
				rn.poke() // the retry timer must fire earlier
			}
		}
	case ActStop:
		rn.release(j)
		rn.stop(rn.configError(j, d), true)
	case ActAbandon:
		rn.release(j)
		if !rn.stopping {
			// Cancelled without a shutdown (cannot happen today): post again.
			rn.active[j.id] = j
			rn.ready.push(j)
		}
	}
	if rn.stopping || len(rn.revocations) > 0 {
		rn.poke()
	}
}

// release forgets that j is on its way (not final), requeueing followers
// whose partition is still ours.
func (rn *run) release(j *job) {
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	for _, f := range j.followers {
		if !f.ps.dropped && !f.ps.revoking && f.ps != j.ps {
			rn.ready.push(f)
		}
	}
	j.followers = nil
	rn.jobsReady()
}

func (rn *run) persisted(j *job, err error) {
	rn.persisting--
	if err != nil {
		rn.stop(fmt.Errorf("reporter: publish delivery record of report %s: %w", j.id, err), false)
		return
	}
	j.ps.inflight--
	if rn.active[j.id] == j {
		delete(rn.active, j.id)
	}
	if j.ps.dropped {
		return
	}
	rn.markDone(j.ps, j.seq)
	for _, f := range j.followers {
		if !f.ps.dropped {
			rn.met.skip(context.Background(), "duplicate")
			rn.markDone(f.ps, f.seq)
		}
	}
	j.followers = nil
}

// markDone records a final outcome in the partition's tracker.
func (rn *run) markDone(ps *partState, seq uint64) {
	if n := ps.wm.markDone(seq); n > 0 {
		ps.dirty = true
		if rn.pending.Add(-int64(n)) < int64(rn.cfg.MaxPending) {
			select {
			case rn.room <- struct{}{}:
			default:
			}
		}
	}
}

func (rn *run) configError(j *job, d Decision) error {
	var hint string
	switch partnerapi.KindOf(d.Err) {
	case partnerapi.KindEdgeBlocked:
		hint = "the partner API's edge blocked our User-Agent (HTTP 403, edge error 1010): configure a distinctive product User-Agent"
	case partnerapi.KindNotFound:
		hint = "the report endpoint answered 404: check the partner API base URL"
	default:
		hint = "the partner API refused our credentials: check the client id and signature"
	}
	return fmt.Errorf("%w: %s (report %s): %w", ErrConfiguration, hint, j.id, d.Err)
}

// stop ends the run after a configuration or publishing error: posts in
// flight are abandoned and, when noCommit, no offset is committed any more.
func (rn *run) stop(err error, noCommit bool) {
	if rn.fatal == nil {
		rn.fatal = err
		rn.log.Error("reporter stopping", "err", err, "commit", !noCommit)
	}
	if noCommit {
		rn.noCommit = true
	}
	rn.stopping = true
	rn.cancelPosts()
	rn.poke()
}

// dirtyOffsets returns the commit points that moved since the last commit
// and clears their dirty marks.
func (rn *run) dirtyOffsets() map[string]map[int32]kgo.EpochOffset {
	var offs map[string]map[int32]kgo.EpochOffset
	for _, ps := range rn.parts {
		if !ps.dirty || ps.dropped {
			continue
		}
		if o, ep, ok := ps.wm.committable(); ok {
			if offs == nil {
				offs = map[string]map[int32]kgo.EpochOffset{}
			}
			if offs[ps.key.topic] == nil {
				offs[ps.key.topic] = map[int32]kgo.EpochOffset{}
			}
			offs[ps.key.topic][ps.key.partition] = kgo.EpochOffset{Epoch: ep, Offset: o}
		}
		ps.dirty = false
	}
	return offs
}

// commitOffsets returns the moved commit points to commit now (mu held):
// one commit in flight at a time, at most one per CommitInterval, so the
// commit point trails finality by about one commit round trip.
func (rn *run) commitOffsets() map[string]map[int32]kgo.EpochOffset {
	if rn.noCommit || rn.commitInFlight || time.Since(rn.lastCommit) < rn.cfg.CommitInterval {
		return nil
	}
	offs := rn.dirtyOffsets()
	if len(offs) > 0 {
		rn.commitInFlight, rn.lastCommit = true, time.Now()
	}
	return offs
}

// committed handles the end of a periodic commit: partitions whose commit
// failed are committed again with the next one.
func (rn *run) committed(failed map[string]map[int32]kgo.EpochOffset) {
	rn.commitInFlight = false
	for topic, ps := range failed {
		for p := range ps {
			if st := rn.parts[tpKey{topic, p}]; st != nil {
				st.dirty = true
			}
		}
	}
}

// logCommit logs a failed commit and returns the offsets that were not committed.
func (rn *run) logCommit(why string, offs map[string]map[int32]kgo.EpochOffset, resp *kmsgCommitResp, err error) map[string]map[int32]kgo.EpochOffset {
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			rn.log.Warn("offset commit failed (retried with the next commit; a crash before it re-sends those reports)", "why", why, "err", err)
		}
		return offs
	}
	var failed map[string]map[int32]kgo.EpochOffset
	if resp != nil {
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					rn.log.Warn("offset commit failed for a partition", "why", why, "topic", t.Topic, "partition", p.Partition, "error_code", p.ErrorCode)
					if failed == nil {
						failed = map[string]map[int32]kgo.EpochOffset{}
					}
					if failed[t.Topic] == nil {
						failed[t.Topic] = map[int32]kgo.EpochOffset{}
					}
					failed[t.Topic][p.Partition] = offs[t.Topic][p.Partition]
				}
			}
		}
	}
	return failed
}

// startRevocation marks the partitions revoked: nothing more of them is
// dispatched; the reply goes once their posts are back.
func (rn *run) startRevocation(req revokeReq) {
	rv := &revocation{lost: req.lost, reply: req.reply, deadline: time.Now().Add(rn.cfg.ShutdownTimeout)}
	for topic, ps := range req.parts {
		for _, p := range ps {
			if st := rn.parts[tpKey{topic, p}]; st != nil {
				st.revoking = true
				rv.parts = append(rv.parts, st)
			}
		}
	}
	rn.log.Info("partitions revoked: waiting for their posts in flight", "partitions", req.parts, "lost", req.lost)
	rn.revocations = append(rn.revocations, rv)
}

// checkRevocations completes the revocations whose posts are all back (or
// whose deadline passed): it replies with the final offsets to commit and
// drops the partitions' state.
func (rn *run) checkRevocations(now time.Time) {
	rn.revocations = slices.DeleteFunc(rn.revocations, func(rv *revocation) bool {
		busy := false
		for _, ps := range rv.parts {
			busy = busy || ps.inflight > 0
		}
		if busy && now.Before(rv.deadline) {
			return false
		}
		var offs map[string]map[int32]kgo.EpochOffset
		for _, ps := range rv.parts {
			if o, ep, ok := ps.wm.committable(); ok && ps.dirty && !rv.lost && !rn.noCommit {
				if offs == nil {
					offs = map[string]map[int32]kgo.EpochOffset{}
				}
				if offs[ps.key.topic] == nil {
					offs[ps.key.topic] = map[int32]kgo.EpochOffset{}
				}
				offs[ps.key.topic][ps.key.partition] = kgo.EpochOffset{Epoch: ep, Offset: o}
			}
			ps.dropped = true
			rn.pending.Add(-int64(ps.wm.pending()))
			if rn.parts[ps.key] == ps {
				delete(rn.parts, ps.key)
			}
			for id, j := range rn.active {
				if j.ps == ps {
					rn.release(j)
					delete(rn.active, id)
				}
			}
		}
		select {
		case rn.room <- struct{}{}:
		default:
		}
		rv.reply <- offs // capacity 1
		return true
	})
}

// standbyAnswer handles a 200 served by standby: the first one starts an
// episode (dispatch stops, the live prober starts); every one is held for
// replay.
func (rn *run) standbyAnswer(j *job) {
	if rn.standby == nil && j.gen == rn.gen {
		rn.startEpisode(j)
	}
	if rn.standby != nil {
		rn.standby.answers++
		rn.held = append(rn.held, j)
		return
	}
	// Sent before the last episode ended, answered by its tail: replay now.
	j.replay = true
	rn.ready.push(j)
}

func (rn *run) startEpisode(j *job) {
	ep := &episode{start: time.Now(), first: j}
	var link []trace.Link
	if sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), j.rec)); sc.IsValid() {
		link = append(link, trace.Link{SpanContext: sc})
	}
	_, ep.span = tracer.Start(context.Background(), "standby.episode", trace.WithLinks(link...), trace.WithAttributes(
		attribute.String("playpipe.first_report_id", j.id),
		attribute.String("messaging.destination.name", j.rec.Topic),
		attribute.Int("messaging.kafka.partition", int(j.rec.Partition)),
		attribute.Int64("messaging.kafka.offset", j.rec.Offset),
	))
	rn.standby = ep
	rn.met.standbyActive.Add(context.Background(), 1)
	rn.met.standbyEpisode.Add(context.Background(), 1)
	rn.log.Warn("standby episode started: the partner API answered from standby (not forwarded); dispatch paused, offsets held, probing for live service",
		"report_id", j.id, "topic", j.rec.Topic, "partition", j.rec.Partition, "offset", j.rec.Offset, "in_flight", rn.inflight)
	rn.bg.Go(func() { rn.probe(ep) })
}

// probe asks for a new session until one is served live (that session's
// token is the client's from then on), or the run ends.
func (rn *run) probe(ep *episode) {
	t := time.NewTimer(rn.cfg.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-rn.postCtx.Done():
			return
		}
		n := ep.probes.Add(1)
		meta, err := rn.api.Session(rn.postCtx)
		switch {
		case err == nil && !meta.Standby():
			rn.log.Info("standby probe: live service is back", "probes", n)
			rn.probedLocked(nil)
			return
		case err == nil:
			rn.log.Debug("standby probe: still standby", "probes", n)
		case errors.Is(err, context.Canceled):
			return
		default:
			switch partnerapi.KindOf(err) {
			case partnerapi.KindEdgeBlocked, partnerapi.KindRejected, partnerapi.KindNotFound:
				rn.probedLocked(err)
				return
			}
			rn.log.Debug("standby probe failed", "probes", n, "err", err)
		}
		t.Reset(rn.cfg.ProbeInterval)
	}
}

func (rn *run) probedLocked(err error) {
	rn.mu.Lock()
	rn.probed(err)
	rn.jobsReady()
	rn.mu.Unlock()
}

func (rn *run) probed(err error) {
	ep := rn.standby
	if ep == nil {
		return
	}
	if err != nil {
		rn.stop(fmt.Errorf("%w: standby probe: %w", ErrConfiguration, err), true)
		return
	}
	held := rn.held
	rn.held = nil
	slices.SortFunc(held, func(a, b *job) int {
		if a.ps != b.ps {
			return int(a.rec.Partition - b.rec.Partition)
		}
		return int(a.seq - b.seq)
	})
	for _, j := range held {
		j.replay = true
		rn.ready.push(j)
	}
	rn.gen++
	dur := time.Since(ep.start)
	rn.log.Warn("standby episode ended: live service is back with a new session; replaying the reports standby answered",
		"duration", dur.Round(time.Millisecond), "standby_answers", ep.answers, "replaying", len(held), "probes", ep.probes.Load())
	rn.endEpisode(len(held), "")
}

// endEpisode closes the episode's span and gauge.
func (rn *run) endEpisode(replayed int, note string) {
	ep := rn.standby
	ep.span.SetAttributes(
		attribute.Int("playpipe.standby.answers", ep.answers),
		attribute.Int("playpipe.standby.replayed", replayed),
		attribute.Int64("playpipe.standby.probes", ep.probes.Load()),
	)
	if note != "" {
		ep.span.SetStatus(codes.Error, note)
	}
	ep.span.End()
	rn.met.standbyActive.Add(context.Background(), -1)
	rn.standby = nil
}
