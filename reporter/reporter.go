package reporter

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/kafkax"
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

// job is one report record on its way to a final outcome. The run owns it
// (under run.mu), except while a worker posts it.
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

	// leasedOnly: its lease marker is written, its post not started. The
	// job is unsure (a crash right after a post could start) until the
	// post starts or the lease is given up.
	leasedOnly bool
	// inDoubt: an earlier post may have reached the partner without its
	// answer being recorded (crash, abandoned post, no answer). Every later
	// Delivery record of the report says so.
	inDoubt bool
	// unacked counts posts started whose answer's Delivery record is not
	// acknowledged yet. While it is non-zero (or the job is in doubt), the
	// job is in its partition's unsure set, which commits carry.
	unacked int

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

// partState is the run's state of one assigned partition.
type partState struct {
	key      tpKey
	wm       watermark
	inflight int  // jobs being posted or waiting for their Delivery record to persist
	revoking bool // revocation asked: dispatch nothing more of it
	dropped  bool // revoked/lost: late events are ignored
	dirty    bool // progress changed since the last commit
	// logPart is the partition of <prefix>.deliveries that holds this
	// partition's lease markers and Delivery records.
	logPart int32
	// unsure are the jobs whose report may be at the partner without a
	// recorded answer (see job.unacked and job.inDoubt).
	unsure map[*job]struct{}
	// recovered is what the previous owner left of offsets not fetched yet
	// (see recover.go): consumed by intake.
	recovered map[int64]recState
	// start is the offset the partition was first fetched from: its commit
	// point until the tracker has seen a record.
	start int64
}

// fetched is a record with its decoded track play.
type fetched struct {
	rec *kgo.Record
	tp  wireTrackPlay
	err error
}

// wireTrackPlay is the part of schemas.TrackPlay the reporter reads; the
// report body stays raw so that the exact bytes are posted.
type wireTrackPlay struct {
	ReportID     string          `json:"report_id"`
	EventID      string          `json:"event_id"`
	BelowMinimum bool            `json:"below_minimum"`
	Report       json.RawMessage `json:"report"`
}

// run is the state of one Run. The fields below mu are guarded by it;
// workers apply their own answers and take their next report under it, so
// a report costs no goroutine hand-off; idle workers wait on cond.
type run struct {
	*Reporter
	cl     *kgo.Client
	adm    *kadm.Client
	topics kafkax.Topics
	// reportsID is the topic id of <prefix>.reports (offset commits v10+);
	// logParts is the partition count of <prefix>.deliveries.
	reportsID [16]byte
	logParts  int32

	postCtx     context.Context // cancelled to abandon posts in flight
	cancelPosts context.CancelFunc

	revokeCh  chan revokeReq
	wake      chan struct{} // capacity 1: the housekeeper has something to look at
	room      chan struct{} // capacity 1: pending dropped, the poller may fetch
	leaseWake chan struct{} // capacity 1: the leaser may lease more reports
	pending   atomic.Int64  // records held by the partition trackers
	coordDone chan struct{}
	bg        sync.WaitGroup // prober goroutines
	commitWG  sync.WaitGroup // the periodic commit in flight
	// publishing counts answers applied whose Delivery record is not handed
	// to the Kafka client yet.
	publishing sync.WaitGroup

	mu      sync.Mutex
	cond    *sync.Cond
	idle    int  // workers waiting on cond
	exiting bool // workers return
	retryAt time.Time
	parts   map[tpKey]*partState
	fresh   fifo
	ready   fifo // retries and replays: leased before fresh records
	delayed delayQueue
	// leased are reports whose lease marker is acknowledged: posted next.
	leased fifo
	// leasing counts reports in leases whose marker is not acknowledged.
	leasing int
	// logEnd is, per deliveries partition, the offset after the last
	// record of ours acknowledged there (or its end when the run started).
	logEnd      map[int32]int64
	held        []*job // answered by standby during the current episode
	active      map[string]*job
	recent      *recentSet
	inflight    int // jobs handed to workers whose post has not come back
	unrecorded  int // answers handed to Kafka by workers, not acknowledged yet
	persisting  int // final jobs waiting for their Delivery record
	standby     *episode
	gen         uint64
	stopping    bool
	noCommit    bool
	fatal       error
	revocations []*revocation
	commits     commitState
	thr         *throttle
}

// Run consumes <prefix>.reports and delivers every report until ctx ends
// (graceful shutdown: stop posting, let posts in flight finish within
// ShutdownTimeout or abandon them, commit what is final, return nil) or the
// API answers with a configuration error (returns an error wrapping
// ErrInvalidConfig, having committed nothing more).
func (r *Reporter) Run(ctx context.Context) error {
	postCtx, cancelPosts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPosts()
	rn := &run{
		Reporter: r, topics: r.cfg.Kafka.Topics(),
		postCtx: postCtx, cancelPosts: cancelPosts,
		revokeCh:  make(chan revokeReq),
		wake:      make(chan struct{}, 1),
		room:      make(chan struct{}, 1),
		leaseWake: make(chan struct{}, 1),
		coordDone: make(chan struct{}),
		parts:     map[tpKey]*partState{},
		active:    map[string]*job{},
		logEnd:    map[int32]int64{},
		recent:    newRecentSet(r.cfg.RecentWindow),
	}
	rn.cond = sync.NewCond(&rn.mu)
	rn.thr = newThrottle(r.cfg.Concurrency, r.cfg.BudgetFloor, r.cfg.BudgetRatio, time.Now())
	unreg, err := r.met.observeThrottle(func() (float64, float64, int64) {
		rn.mu.Lock()
		defer rn.mu.Unlock()
		return rn.thr.limit, rn.thr.tokens, rn.thr.shed
	})
	if err != nil {
		r.log.Warn("reporter throttle metrics not registered", "err", err)
	} else {
		defer unreg()
	}
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
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { rn.onRevoked(ctx, m, false) }),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { rn.onRevoked(ctx, m, true) }),
		// Bounded fetch buffers: at most ~2 MiB (compressed) fetched ahead, whatever the backlog.
		kgo.FetchMaxBytes(2<<20),
		kgo.FetchMaxPartitionBytes(512<<10),
		kgo.DefaultProduceTopic(rn.topics.Deliveries),
		// Every record names its deliveries partition: the one of its report's partition.
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		// No linger: a lease marker's acknowledgement gates posts. Records
		// produced while a request is in flight still batch together.
		kgo.ProducerLinger(0),
		// Small records, many small requests: compression costs more CPU than it saves.
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	)
	opts = append(opts, r.kgoOpts...)
	rn.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("reporter: kafka client: %w", err)
	}
	rn.adm = kadm.NewClient(rn.cl)
	if err := rn.describeTopics(ctx); err != nil {
		// No coordinator will run: the revoke callback that closing a
		// client already in the group calls must not wait for one.
		close(rn.coordDone)
		rn.cl.Close()
		return err
	}
	r.log.Info("reporter starting", "topic", rn.topics.Reports, "deliveries", rn.topics.Deliveries, "group", r.cfg.Group,
		"instance_id", r.cfg.Kafka.InstanceID, "concurrency", r.cfg.Concurrency, "rate", r.cfg.Rate, "max_pending", r.cfg.MaxPending)

	var workers sync.WaitGroup
	for range r.cfg.Concurrency {
		workers.Go(rn.worker)
	}
	var leaser sync.WaitGroup
	leaser.Go(rn.leaser)
	pollCtx, stopPoll := context.WithCancel(ctx)
	var poller sync.WaitGroup
	poller.Go(func() { rn.poll(pollCtx) })

	runErr := rn.coordinate(ctx)
	close(rn.coordDone)

	stopPoll()
	poller.Wait()
	leaser.Wait()
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

// describeTopics learns the reports topic's id (for offset commits) and the
// deliveries topic's partitions and their end offsets (where the records of
// this run will start).
func (rn *run) describeTopics(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	for attempt := 0; ; attempt++ {
		var tds kadm.TopicDetails
		tds, err = rn.adm.ListTopics(ctx, rn.topics.Reports, rn.topics.Deliveries)
		if err == nil {
			err = tds.Error()
		}
		if err == nil {
			rn.reportsID = tds[rn.topics.Reports].ID
			rn.logParts = int32(len(tds[rn.topics.Deliveries].Partitions))
			var ends kadm.ListedOffsets
			if ends, err = rn.adm.ListEndOffsets(ctx, rn.topics.Deliveries); err == nil {
				err = ends.Error()
			}
			if err == nil {
				ends.Each(func(o kadm.ListedOffset) { rn.logEnd[o.Partition] = o.Offset })
				if rn.logParts > 0 {
					return nil
				}
				err = errors.New("no partitions")
			}
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond) // topics still being created
	}
	return fmt.Errorf("reporter: describe topics %s and %s: %w", rn.topics.Reports, rn.topics.Deliveries, err)
}

// poll fetches records while the trackers have room and adds them to the
// state. With BlockRebalanceOnPoll, a rebalance cannot slip between a poll
// and the intake, so the state never holds a record of a partition that was
// already revoked. A partition seen for the first time is recovered first:
// what its previous owner left in the commit metadata and the deliveries
// log (recover.go).
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
			if err := rn.recoverNew(ctx, recs); err != nil {
				rn.cl.AllowRebalance()
				if ctx.Err() == nil {
					rn.mu.Lock()
					rn.stop(err, true)
					rn.mu.Unlock()
				}
				return
			}
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
				rn.cl.Produce(context.Background(), rn.deliveryRecord(context.Background(), j), func(r *kgo.Record, err error) {
					rn.persistedLocked(j, r, err)
				})
			}
		}
		rn.cl.AllowRebalance()
	}
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
			ps = rn.parts[key] // created by recoverNew
		}
		seq := ps.wm.add(rec.Offset, rec.LeaderEpoch)
		st, known := ps.recovered[rec.Offset]
		if known {
			delete(ps.recovered, rec.Offset)
			if st == recFinal {
				// Its final outcome is in the deliveries log already (a stop or
				// crash before the commit point passed it): never posted again.
				rn.met.skip(context.Background(), "final_before_restart")
				rn.markDone(ps, seq)
				continue
			}
		}
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
			j := &job{ps: ps, seq: seq, rec: rec, id: tp.ReportID, evID: tp.EventID, body: tp.Report}
			if known && st == recDoubt {
				// The previous owner may have posted it without recording the
				// answer: post it again, labelled, so the audit counts it.
				j.inDoubt = true
				ps.unsure[j] = struct{}{}
			}
			rn.fresh.push(j)
		}
	}
	return invalid
}
