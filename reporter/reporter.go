package reporter

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/backoff"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/reporter/delivery"
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
	backoff backoff.Policy
	// kgoOpts are appended to the Kafka client options (tests tune group
	// timeouts with them).
	kgoOpts []kgo.Opt
	// cur is the run under way (Ready), nil before and after.
	cur atomic.Pointer[run]
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
	met, err := newMetrics(cfg.MeterProvider, cfg.TracerProvider)
	if err != nil {
		return nil, fmt.Errorf("reporter: metrics: %w", err)
	}
	r := &Reporter{
		cfg: cfg, api: api, log: cfg.Logger, met: met,
		backoff: retryPolicy(cfg),
	}
	if cfg.Rate > 0 {
		r.limiter = rate.NewLimiter(rate.Limit(cfg.Rate), cfg.Burst)
	}
	return r, nil
}

// job is one report record on its way to a final outcome. Its fields
// follow the concern that uses them: leasedOnly, unacked and inDoubt (what
// makes it unsure) under its partition's lock, followers under run.idMu,
// the rest under run.mu while it is queued and the worker's while it is
// posted.
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
	// skip: final without a post (below the minimum play length), held at
	// intake because it lay past its partition's progress window.
	skip bool
	gen  uint64 // standby generation when last sent
	// postNo numbers its last post among the run's (limiter.started): the
	// limit judges a failure by the posts started after it (limiter.judge).
	postNo uint64
	// retrySlot: it failed before and holds one of the slots retries may
	// take (run.retrySlots), from its lease until its post is back.
	retrySlot bool
	// track is its body's trackid (trackKey; 0: none): the key of the
	// suspect-track rule (suspect.go). suspect: it was leased while its
	// track was suspect, holding one of the slots of suspect tracks' fresh
	// reports (run.suspectSlots) until its post is back (suspectSlot);
	// its failure is judged like a retry's (limiter.judge).
	track       int64
	suspect     bool
	suspectSlot bool
	readyAt     time.Time

	// leasedOnly: its lease marker is written, its post not started. The
	// job is unsure (a crash right after a post could start) until the
	// post starts or the lease is given up.
	leasedOnly bool
	// inDoubt: an earlier post may have reached the partner without its
	// answer being recorded (crash, abandoned post, no answer). Every later
	// Delivery record of the report says so.
	inDoubt bool
	// ctx, when set, is the context of its posts instead of the run's (a
	// slow retry's: cancelled when its partition is revoked).
	ctx context.Context
	// redrive is the operator's request a slow retry serves (its Delivery
	// record carries the redrive's id and reason).
	redrive *schemas.RedriveRequest
	// carried is the doubt cause of an earlier attempt that left no
	// Delivery record (schemas.DoubtCancelled, DoubtCrash): the next record
	// of the report carries it, so the audit counts that attempt's copy.
	carried string
	// unacked counts posts started whose answer's Delivery record is not
	// acknowledged yet. While it is non-zero (or the job is in doubt), the
	// job is in its partition's unsure set, which commits carry.
	unacked int

	// Set by the worker for the coordinator.
	dec     delivery.Decision
	latency time.Duration
	// held is how long the post held its slot: latency plus the wait for
	// the rate limit (--rate). It feeds the in-flight limit, so that a
	// rate-limited reporter does not grow posts waiting on its own limit.
	held    time.Duration
	traceID string

	// followers are later records with the same report id that wait for
	// this one's final outcome instead of being posted again.
	followers []*job

	// The retry budget (park.go), under run.mu: failures and time counted
	// while other reports got answers, the last failure, and the run's
	// success count then. pressured: parked early, its partition full
	// behind it; trackHangs: parked early, its suspect track's budget spent
	// by another report (suspect.go). parking: the budget is spent, the
	// worker parks it. unposted: parked without another post, its track
	// hanging (parkhang.go).
	healthyFails int
	// pressureFails: failures not in an outage (the pressure rule);
	// failedAt: the run's failed posts after its last failure.
	pressureFails int
	failedAt      uint64
	budgetUsed    time.Duration
	lastFailAt    time.Time
	succAt        uint64
	warned        bool
	pressured     bool
	trackHangs    bool
	parking       bool
	unposted      bool
	// payloadFailed: a failure of it was judged its payload's (outcome.go):
	// its later failures never move the limit. partnerFailedAt: the run's
	// partnerFailed after its last failure (the pressure rule).
	payloadFailed   bool
	partnerFailedAt uint64
}

type tpKey struct {
	topic     string
	partition int32
}

// partState is the run's state of one assigned partition: the one lock a
// report's way from intake to commit needs (see "State and locks" in
// doc.go). Its fields are guarded by mu, except key, logPart (fixed) and
// the flags revoking and dropped, which are written under mu and may be
// read without it where a stale value only costs a check later.
type partState struct {
	key tpKey
	// logPart is the partition of <prefix>.deliveries that holds this
	// partition's lease markers and Delivery records.
	logPart int32

	mu       sync.Mutex
	revoking atomic.Bool // revocation asked: dispatch nothing more of it
	dropped  atomic.Bool // revoked/lost: late events are ignored

	wm       watermark
	inflight int  // jobs being posted or waiting for their Delivery record to persist
	dirty    bool // progress changed since the last commit
	// logEnd is the offset after the last record of this partition (lease
	// marker or Delivery record) acknowledged in its deliveries partition,
	// or where that partition ended when this run took it: a progress
	// snapshot's LogOffset. It moves together with what the record changes
	// (noteLog), so a snapshot never says a record is behind it without
	// its change. Only this partition's records move it: a recovery reads
	// the others of the log partition and passes them.
	logEnd int64
	// unsure are the jobs whose report may be at the partner without a
	// recorded answer (see job.unacked and job.inDoubt).
	unsure map[*job]struct{}
	// recovered is what the previous owner left of offsets not fetched yet
	// (see recover.go): consumed by intake.
	recovered map[int64]recState
	// start is the offset the partition was first fetched from: its commit
	// point until the tracker has seen a record.
	start int64
	// pastWindow are reports past the progress window (lease.go), in offset
	// order: requeued when the commit point moves.
	pastWindow fifo
	// paused: fetching of this partition is paused, its pending records at
	// MaxPending (intake.go).
	paused bool
	// slow is the partition's slow retries under way (slowlane.go).
	slow slowPart
}

// run is the state of one Run. Its state is split by concern, each with
// its own lock or goroutine (see "State and locks" in doc.go): the
// partitions (partState.mu, the report's way from intake to commit), the
// dispatch (mu), the report ids (idMu), the partition map (partsMu), the
// commits' memory (commitState.mu), the stop (atomics and fatalMu), and the
// coordinator's own.
type run struct {
	*Reporter
	cl  *kgo.Client
	adm *kadm.Client
	// prod are the clients that write the run's records (producers.go):
	// prod[0] is cl.
	prod   []*kgo.Client
	topics kafkax.Topics
	// reportsID is the topic id of <prefix>.reports (offset commits v10+);
	// logParts is the partition count of <prefix>.deliveries; logStart is,
	// per deliveries partition, its end when the run started. Fixed once
	// connected.
	reportsID [16]byte
	logParts  int32
	logStart  map[int32]int64
	// parkedParts is the partition count of <prefix>.parked; slow holds the
	// parked reports of the partitions this run owns (park.go).
	parkedParts int32
	slow        *slowLane
	// window is how far past its commit point a partition may lease
	// (progressWindow of MetadataMaxBytes).
	window int64
	// Fixed for the run, built once instead of per post or lease: the
	// lease markers' header value (the group) and the consumer span name.
	groupHdr    []byte // never modified: shared by every lease marker
	processSpan string // "process <prefix>.reports"

	postCtx context.Context // cancelled to abandon posts in flight
	paused  *pauseWatch     // this process's pauses (pausefence.go)
	// fences are the parked-state fences of the partitions this run
	// recovered (parkfence.go), by reports partition; fencesClosed once the
	// run closed them. endCtx ends with the run (coordDone): the fences'
	// transactions never outlive it.
	fenceMu      sync.Mutex
	fences       map[int32]*parkFence
	fencesClosed bool
	endCtx       context.Context
	endRun       context.CancelFunc
	cancelPosts  context.CancelFunc

	revokeCh  chan revokeReq
	wake      chan struct{} // capacity 1: the housekeeper has something to look at
	room      chan struct{} // capacity 1: pending dropped, the poller may fetch
	leaseWake chan struct{} // capacity 1: the leaser may lease more reports
	pending   atomic.Int64  // records held by the partition trackers
	coordDone chan struct{}
	bg        sync.WaitGroup // prober goroutines and parks' fenced writes (setAside)
	parking   atomic.Int64   // parks whose entry's fenced write is under way (setAside)
	commitWG  commitsOut     // the periodic commit in flight (revoke.go)
	// publishing counts answers applied whose Delivery record is not handed
	// to the Kafka client yet.
	publishing sync.WaitGroup

	// mu is the dispatch lock: it guards workerState, queueState and
	// standbyState, what decides which report is posted next and when.
	mu sync.Mutex
	workerState
	queueState
	standbyState

	// idMu guards answerState: the reports on their way by id and the ids
	// already final.
	idMu sync.Mutex
	answerState

	// partsMu guards parts, the assigned partitions by key (a leaf lock:
	// nothing else is locked while it is held).
	partsMu sync.Mutex
	parts   map[tpKey]*partState
	// recoverMu serialises the recoveries of new partitions (recover.go):
	// the poller's, on a partition's first record, and the group's, on
	// assignment.
	recoverMu sync.Mutex
	// described is closed once connect has learnt the topics (the group's
	// assigned callback may run before).
	described chan struct{}

	stopState
}

// The states of the dispatch, by concern: each guarded by run.mu (the field
// comments say where one is not).

// workerState is the workers and what they have out (dispatch.go).
type workerState struct {
	cond       *sync.Cond // on run.mu: idle workers wait on it
	idle       int        // workers waiting on cond
	exiting    bool       // workers return
	inflight   int        // jobs handed to workers whose post has not come back
	unrecorded int        // answers handed to Kafka by workers, not acknowledged yet
	thr        *throttle  // the retry budget and the in-flight limit
	// successes counts final answers (park.go: a report's budget moves only
	// while others succeed); warnLimit bounds the stuck-report warnings.
	successes      uint64
	failed         uint64 // transient failures counted by the retry budget (park.go)
	partnerFailed  uint64 // failures the limiter took for the partner's (outcome.go)
	warnLimit      *rate.Limiter
	warnSuppressed int
	// stall is the reports failing repeatedly and the stall warning's state
	// (stall.go).
	stall stallState
}

// queueState is the queues and the leases on their way (intake.go,
// lease.go, outcome.go).
type queueState struct {
	fresh fifo
	ready fifo // retries and replays: leased in turn with fresh records
	// tookRetry: the last report leased came from ready (take).
	tookRetry bool
	delayed   delayQueue
	retryAt   time.Time // when the coordinator's retry timer fires
	// leased are reports whose lease marker is acknowledged: posted next.
	leased fifo
	// leasing counts reports in leases whose marker is not acknowledged.
	leasing int
	// markerRTT is the lease markers' round trip (a moving mean: taken
	// to acknowledged), which sizes the lease room (lease.go).
	markerRTT time.Duration
	// retrySlots counts the reports that failed before, leased or in
	// flight: at most retryCap (lease.go).
	retrySlots int
	// aside are fresh reports of suspect tracks waiting for one of their
	// slots; suspectSlots counts those leased or in flight: at most
	// suspectCap (suspect.go).
	aside        fifo
	suspectSlots int
	// hangPark are reports of hanging tracks queued for parking without a
	// post; hangSweep: a track started to hang, the queues are swept
	// (parkhang.go).
	hangPark  []*job
	hangSweep bool
}

// standbyState is the standby episode under way (standby.go): it holds the
// dispatch, so it is the dispatch's.
type standbyState struct {
	held    []*job // answered by standby during the current episode
	standby *episode
	gen     uint64
}

// answerState is what the answers left, guarded by run.idMu: the reports on
// their way by id (and each one's followers) and the ids already final
// (outcome.go, dedupe.go).
type answerState struct {
	active map[string]*job
	recent *recentSet
}

// stopState is rebalances, commits and shutdown (revoke.go, commit.go,
// lifecycle.go): no lock of run.mu's.
type stopState struct {
	// revocations are the coordinator goroutine's (startRevocation,
	// checkRevocations); the others read only revoking.
	revocations []*revocation
	// revoking is len(revocations), stored by the coordinator: an answer
	// that comes back while one is under way wakes it.
	revoking atomic.Int32
	commits  commitState
	// stopping: no post starts any more (a shutdown or a fatal error);
	// noCommit: no offset is committed any more (a configuration error).
	// Set once, never cleared.
	stopping atomic.Bool
	noCommit atomic.Bool
	fatalMu  sync.Mutex
	fatal    error // the first fatal error (fatalMu)
}

// Run consumes <prefix>.reports and delivers every report until ctx ends
// (graceful shutdown: stop posting, let posts in flight finish within
// ShutdownTimeout or abandon them, commit what is final, return nil) or the
// API answers with a configuration error (returns an error wrapping
// ErrInvalidConfig, having committed nothing more).
func (r *Reporter) Run(ctx context.Context) error {
	postCtx, cancelPosts := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelPosts()
	rn := r.newRun(postCtx, cancelPosts)
	r.cur.Store(rn)
	defer r.cur.Store(nil)
	unreg, err := r.met.observeState(rn.gauges)
	if err != nil {
		r.log.Warn("reporter throttle metrics not registered", "err", err)
	} else {
		defer unreg()
	}
	if err := rn.connect(ctx); err != nil {
		return err
	}
	r.log.Info("reporter starting", "topic", rn.topics.Reports, "deliveries", rn.topics.Deliveries, "group", r.cfg.Group,
		"instance_id", r.cfg.Kafka.InstanceID, "concurrency", r.cfg.Concurrency, "max_concurrency", r.cfg.MaxConcurrency, "progress_window", rn.window, "rate", r.cfg.Rate, "max_pending", r.cfg.MaxPending)
	runErr := rn.serve(ctx)
	if runErr != nil {
		r.log.Error("reporter stopped", "err", runErr)
	} else {
		r.log.Info("reporter stopped")
	}
	return runErr
}

// gauges reads the state the reporter's gauges show (metrics.go).
func (rn *run) gauges() gauges {
	rn.mu.Lock()
	now := rn.cfg.Now()
	rn.thr.refill(now) // allows refills only when short: the gauge shows what the floor earned since
	g := gauges{limit: rn.thr.lim.limit, tokens: rn.thr.tokens, shed: rn.thr.shed, inFlight: rn.inflight, atStake: rn.atStake(),
		rttMin: rn.thr.lim.baseline, rttRecent: rn.thr.lim.recent, failing: rn.failingNow(), stalled: rn.thr.lim.stalledOut(),
		suspect: rn.thr.lim.sus.count(), aside: rn.aside.len(),
		queued: rn.fresh.len() + rn.ready.len(), leasing: rn.leasing, leased: rn.leased.len(), idleWorkers: rn.idle}
	rn.mu.Unlock()
	oldest := int64(math.MaxInt64)
	for _, ps := range rn.partList() {
		ps.mu.Lock()
		if at, ok := ps.wm.oldest(); ok && !ps.dropped.Load() {
			oldest = min(oldest, at)
		}
		ps.mu.Unlock()
	}
	if oldest != math.MaxInt64 {
		g.oldestPending = max(0, time.Duration(now.UnixNano()-oldest))
	}
	g.parked = rn.slow.stats()
	return g
}

// part is the state of an assigned partition (nil when not assigned).
func (rn *run) part(key tpKey) *partState {
	rn.partsMu.Lock()
	defer rn.partsMu.Unlock()
	return rn.parts[key]
}

// partList is the assigned partitions now.
func (rn *run) partList() []*partState {
	rn.partsMu.Lock()
	defer rn.partsMu.Unlock()
	out := make([]*partState, 0, len(rn.parts))
	for _, ps := range rn.parts {
		out = append(out, ps)
	}
	return out
}

// newRun is the state of one Run; cancelPosts abandons the posts of postCtx.
func (r *Reporter) newRun(postCtx context.Context, cancelPosts context.CancelFunc) *run {
	rn := &run{
		Reporter: r, topics: r.cfg.Kafka.Topics(),
		postCtx: postCtx, cancelPosts: cancelPosts,
		revokeCh:  make(chan revokeReq),
		wake:      make(chan struct{}, 1),
		room:      make(chan struct{}, 1),
		leaseWake: make(chan struct{}, 1),
		coordDone: make(chan struct{}),
		described: make(chan struct{}),
		paused:    newPauseWatch(cmp.Or(r.cfg.Kafka.SessionTimeout, kafkax.DefaultSessionTimeout)),
		parts:     map[tpKey]*partState{},
		logStart:  map[int32]int64{},
		answerState: answerState{
			active: map[string]*job{},
			recent: newRecentSet(r.cfg.RecentWindow),
		},
	}
	rn.window = progressWindow(r.cfg.MetadataMaxBytes)
	rn.groupHdr, rn.processSpan = []byte(r.cfg.Group), "process "+rn.topics.Reports
	rn.cond = sync.NewCond(&rn.mu)
	rn.slow = newSlowLane()
	rn.endCtx, rn.endRun = context.WithCancel(context.Background())
	rn.warnLimit = rate.NewLimiter(1, warnBurst)
	rn.thr = newThrottle(r.cfg, r.cfg.Now())
	return rn
}

// connect makes the run's Kafka client (joining the group) and learns the
// topics.
func (rn *run) connect(ctx context.Context) error {
	base, err := rn.cfg.Kafka.ClientOpts()
	if err != nil {
		return fmt.Errorf("reporter: %w", err)
	}
	opts := append(append(base, rn.cfg.Kafka.GroupOpts(rn.cfg.Group)...),
		kgo.ConsumeTopics(rn.topics.Reports),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { rn.onRevoked(ctx, m, false) }),
		kgo.OnPartitionsLost(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) { rn.onRevoked(ctx, m, true) }),
		kgo.OnPartitionsAssigned(func(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
			rn.recoverAssigned(ctx, m[rn.topics.Reports])
		}),
		// Bounded fetch buffers: at most ~2 MiB (compressed) fetched ahead, whatever the backlog.
		kgo.FetchMaxBytes(2<<20),
		kgo.FetchMaxPartitionBytes(512<<10),
		// A partition resumed after its pending cap (intake.go) is fetched
		// with the next fetch request: one long-polling for the other
		// partitions ends within this (franz-go's default, 5 s, made a
		// stuck partition drain 64 records per 5 s in
		// TestFullPartitionPausesAlone while the others were idle).
		kgo.FetchMaxWait(500*time.Millisecond),
	)
	opts = append(opts, rn.producerOpts()...)
	opts = append(opts, rn.kgoOpts...)
	rn.cl, err = kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("reporter: kafka client: %w", err)
	}
	rn.adm = kadm.NewClient(rn.cl)
	err = rn.describeTopics(ctx)
	if err == nil {
		err = rn.connectProducers()
	}
	if err == nil {
		close(rn.described)
	}
	if err != nil {
		// No coordinator will run: the revoke callback that closing a
		// client already in the group calls must not wait for one.
		close(rn.coordDone)
		rn.endRun()
		rn.cl.Close()
		return err
	}
	return nil
}

// serve runs the workers, the leaser and the poller under the coordinator
// until it returns, then stops them in order and closes the client.
func (rn *run) serve(ctx context.Context) error {
	var workers sync.WaitGroup
	// One worker per post the limit may ever allow (stalled ones included:
	// limit.go); those above the limit wait on cond (a few KiB of stack
	// each) until it grows.
	for range rn.cfg.MaxConcurrency {
		workers.Go(rn.worker)
	}
	var leaser sync.WaitGroup
	leaser.Go(rn.leaser)
	leaser.Go(rn.slowRetries)
	leaser.Go(rn.watchPauses)
	pollCtx, stopPoll := context.WithCancel(ctx)
	var poller sync.WaitGroup
	poller.Go(func() { rn.poll(pollCtx) })

	runErr := rn.coordinate(ctx)
	close(rn.coordDone)
	rn.endRun()

	stopPoll()
	poller.Wait()
	leaser.Wait()
	rn.mu.Lock()
	rn.exiting = true
	rn.idle = 0
	rn.cond.Broadcast()
	rn.mu.Unlock()
	workers.Wait()
	rn.cancelPosts()
	rn.bg.Wait()
	rn.closeFences()
	rn.cl.AllowRebalance()
	kafkax.CloseClient(rn.cl, 0) // bounded leave: never waits on a frozen broker
	rn.closeProducers()
	return runErr
}
