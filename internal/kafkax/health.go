package kafkax

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// Defaults of HealthOptions.
const (
	DefaultProbeInterval = time.Second
	DefaultProbeTimeout  = 800 * time.Millisecond
)

// HealthOptions tunes NewHealth; zero values take the defaults.
type HealthOptions struct {
	// Interval is the time between two probes (DefaultProbeInterval);
	// Timeout bounds each (DefaultProbeTimeout).
	Interval, Timeout time.Duration
	// Logger says the faults (at most once per LogEvery each, through a
	// FaultLog); defaults to slog.Default().
	Logger   *slog.Logger
	LogEvery time.Duration
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// MeterProvider makes playpipe.kafka.faults and playpipe.kafka.broker.up;
	// nil: not measured.
	MeterProvider metric.MeterProvider
	// Writes are the topics the role writes with acks=all: a probe also
	// finds each of their partitions with a leader and at least
	// min.insync.replicas in-sync replicas (the topic's setting, read at
	// most every minIsrEvery), else the role is not ready: its writes
	// fail (NOT_ENOUGH_REPLICAS) until the brokers are back.
	Writes []string
}

// Health probes a role's Kafka in the background — one metadata request
// for the pipeline's topics every Interval, bounded by Timeout — and keeps
// the last answer, so that a readiness check answers at once from it and
// never waits on the broker (Check). It notices a broker that comes back
// different: a topic with a new id (deleted and re-created, or a broker
// restarted empty), another cluster id, or a role's fetch failing with
// UNKNOWN_TOPIC_ID (told through Faults().Fetch). franz-go never adopts a
// re-created topic's new id (its clients fail that topic until purged), and
// a role's offsets, transactions and commit metadata belong to the old
// topic: Changed is closed then, and the commands exit for their supervisor
// to restart them with fresh clients (docs/operating.md).
type Health struct {
	cfg      Config
	o        HealthOptions
	log      *slog.Logger
	faults   *FaultLog
	cl       *kgo.Client
	topics   []string
	upGauge  metric.Int64ObservableGauge
	unreg    metric.Registration
	wire     *Wire
	unwire   func()
	changed  chan struct{}
	stopOnce sync.Once
	// metadata sends one probe (a seam for tests; kmsg over cl); describe
	// reads topic configs (min.insync.replicas of Writes).
	metadata func(context.Context, *kmsg.MetadataRequest) (*kmsg.MetadataResponse, error)
	describe func(context.Context, *kmsg.DescribeConfigsRequest) (*kmsg.DescribeConfigsResponse, error)

	mu        sync.Mutex
	probed    time.Time // when the last probe ended
	lastOK    time.Time // when the broker last answered
	fails     int       // probes in a row without an answer
	err       error     // the last probe's fault, nil when ready
	cluster   string
	ids       map[string][16]byte
	changedBy string // why changed was closed
	// unknownID is, per topic, the span of the fetch errors
	// UNKNOWN_TOPIC_ID seen without a gap longer than UnknownTopicIDGrace.
	unknownID map[string][2]time.Time
	// minISR is min.insync.replicas of each topic of Writes, read at minISRAt.
	minISR   map[string]int
	minISRAt time.Time
}

// minIsrEvery is how often at most the probe reads the min.insync.replicas
// of the topics a role writes.
const minIsrEvery = time.Minute

// UnknownTopicIDGrace is how long a role's fetches of a topic must keep
// failing with UNKNOWN_TOPIC_ID before the Health takes it for a topic that
// came back different: right after a topic is created, a busy cluster may
// answer it for a moment while the new partition's leader learns of it
// (franz-go hides the first five). The probe notices a re-created topic's
// new id within a second anyway; this catches a client that holds an id the
// probe never saw.
const UnknownTopicIDGrace = 10 * time.Second

// NewHealth returns the Health of cfg's brokers (validated, with brokers);
// Run probes.
func NewHealth(cfg Config, o HealthOptions) (*Health, error) {
	if o.Interval <= 0 {
		o.Interval = DefaultProbeInterval
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultProbeTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	opts, err := cfg.ClientOpts()
	if err != nil {
		return nil, err
	}
	// Dial and request bounds under the probe's timeout: a frozen broker
	// costs one timeout per probe, never more.
	opts = append(opts, kgo.DialTimeout(o.Timeout), kgo.RequestTimeoutOverhead(o.Timeout), kgo.RequestRetries(0))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("kafka: health probe client: %w", err)
	}
	h := &Health{cfg: cfg, o: o, log: o.Logger, cl: cl, topics: cfg.Topics().All(),
		ids: map[string][16]byte{}, unknownID: map[string][2]time.Time{}, changed: make(chan struct{}), err: errors.New("not probed yet")}
	h.metadata = func(ctx context.Context, req *kmsg.MetadataRequest) (*kmsg.MetadataResponse, error) {
		return req.RequestWith(ctx, cl)
	}
	h.describe = func(ctx context.Context, req *kmsg.DescribeConfigsRequest) (*kmsg.DescribeConfigsResponse, error) {
		return req.RequestWith(ctx, cl)
	}
	h.faults = NewFaultLog(FaultLogOptions{Every: o.LogEvery, Now: o.Now, MeterProvider: o.MeterProvider})
	h.faults.onFetch = h.fetchFault
	h.wire, h.unwire, err = NewWire(o.MeterProvider)
	if err != nil {
		o.Logger.Warn("kafka: request metrics not registered", "err", err)
	}
	mp := o.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	m := mp.Meter("github.com/playpipe/playpipe/internal/kafkax")
	if h.upGauge, err = m.Int64ObservableGauge("playpipe.kafka.broker.up",
		metric.WithDescription("1 while the last probe of Kafka (every second) found the broker answering with every topic of the pipeline as first seen; 0 otherwise.")); err == nil {
		h.unreg, _ = m.RegisterCallback(func(_ context.Context, obs metric.Observer) error {
			v := int64(0)
			if h.Check(context.Background()) == nil {
				v = 1
			}
			obs.ObserveInt64(h.upGauge, v)
			return nil
		}, h.upGauge)
	}
	return h, nil
}

// Faults is the FaultLog of the role: its poll loops report fetch errors
// through it (Config.Faults), rate-limited, and Health learns from them.
func (h *Health) Faults() *FaultLog { return h.faults }

// Wire counts the role's Kafka requests, batches and records
// (Config.Wire): the probe's own metadata requests are not among them.
func (h *Health) Wire() *Wire { return h.wire }

// Changed is closed once the broker came back different (see Health).
func (h *Health) Changed() <-chan struct{} { return h.changed }

// ChangedBy says why Changed was closed ("" while it is not).
func (h *Health) ChangedBy() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changedBy
}

// Check returns the last verdict at once: nil when the broker answered the
// last probes with every topic as first seen, else an error naming the
// broker and the cause (unreachable once unreachableAfter probes in a row
// went unanswered). It never waits on the broker.
func (h *Health) Check(context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.changedBy != "" {
		return fmt.Errorf("%s; this process exits for its supervisor to restart it with fresh clients", h.changedBy)
	}
	if stale := h.o.Now().Sub(h.probed); !h.probed.IsZero() && stale > 3*(h.o.Interval+h.o.Timeout) {
		return fmt.Errorf("no probe of %s for %s", h.brokers(), stale.Round(time.Second))
	}
	return h.err
}

func (h *Health) brokers() string { return strings.Join(h.cfg.Brokers, ",") }

// Run probes until ctx ends, then closes the probe's client.
func (h *Health) Run(ctx context.Context) {
	defer h.cl.Close()
	defer func() {
		if h.unreg != nil {
			_ = h.unreg.Unregister()
		}
		h.unwire()
	}()
	t := time.NewTicker(h.o.Interval)
	defer t.Stop()
	for {
		h.probe(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probe asks for the metadata of the pipeline's topics, bounded by Timeout,
// and records the verdict.
func (h *Health) probe(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, h.o.Timeout)
	defer cancel()
	start := h.o.Now()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false // a probe never creates a missing topic
	for _, t := range h.topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := h.metadata(pctx, req)
	if ctx.Err() != nil {
		return
	}
	now := h.o.Now()
	if err != nil {
		h.mu.Lock()
		since := h.lastOK
		h.probed = now
		h.fails++
		fails := h.fails
		h.mu.Unlock()
		if fails < unreachableAfter && !since.IsZero() {
			return // one slow probe on a busy broker is not an outage: keep the verdict
		}
		why := fmt.Sprintf("broker %s does not answer (a metadata request got no answer within %s: %v)", h.brokers(), h.o.Timeout, err)
		if !since.IsZero() {
			why += fmt.Sprintf("; last answer %s ago", now.Sub(since).Round(time.Second))
		}
		h.setErr(now, errors.New(why), false)
		h.faults.Say(h.log, slog.LevelWarn, FaultUnreachable, h.brokers(), "kafka: broker unreachable: "+why, "brokers", h.brokers(), "probe_took", now.Sub(start).Round(time.Millisecond))
		return
	}
	h.readMinISR(pctx, now)
	h.verdict(now, resp)
}

// readMinISR reads min.insync.replicas of the topics the role writes, at
// most every minIsrEvery; a failed read keeps what it knew (1 when it
// never read it: a partition without a leader is still told).
func (h *Health) readMinISR(ctx context.Context, now time.Time) {
	h.mu.Lock()
	fresh := !h.minISRAt.IsZero() && now.Sub(h.minISRAt) < minIsrEvery
	h.mu.Unlock()
	if fresh || len(h.o.Writes) == 0 {
		return
	}
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range h.o.Writes {
		rr := kmsg.NewDescribeConfigsRequestResource()
		rr.ResourceType, rr.ResourceName, rr.ConfigNames = kmsg.ConfigResourceTypeTopic, t, []string{"min.insync.replicas"}
		req.Resources = append(req.Resources, rr)
	}
	resp, err := h.describe(ctx, req)
	if err != nil {
		return
	}
	got := map[string]int{}
	for _, r := range resp.Resources {
		for _, c := range r.Configs {
			if c.Name == "min.insync.replicas" && c.Value != nil {
				if n, err := strconv.Atoi(*c.Value); err == nil {
					got[r.ResourceName] = n
				}
			}
		}
	}
	h.mu.Lock()
	h.minISR, h.minISRAt = got, now
	h.mu.Unlock()
}

// unwritable says the partitions of the topics the role writes that take
// no write with acks=all now (no leader, or fewer in-sync replicas than
// min.insync.replicas); empty when all do.
func (h *Health) unwritable(resp *kmsg.MetadataResponse) []string {
	writes := map[string]bool{}
	for _, t := range h.o.Writes {
		writes[t] = true
	}
	h.mu.Lock()
	minISR := h.minISR
	h.mu.Unlock()
	var out []string
	for _, t := range resp.Topics {
		if t.Topic == nil || !writes[*t.Topic] || t.ErrorCode != 0 {
			continue
		}
		need := max(minISR[*t.Topic], 1)
		var bad []string
		for _, p := range t.Partitions {
			switch {
			case p.Leader < 0:
				bad = append(bad, fmt.Sprintf("%d (no leader)", p.Partition))
			case len(p.ISR) < need:
				bad = append(bad, fmt.Sprintf("%d (%d in-sync of %d replicas)", p.Partition, len(p.ISR), len(p.Replicas)))
			}
		}
		if len(bad) > 0 {
			sort.Strings(bad)
			if len(bad) > 3 {
				bad = append(bad[:3], fmt.Sprintf("and %d more", len(bad)-3))
			}
			out = append(out, fmt.Sprintf("%s partitions %s, min.insync.replicas %d", *t.Topic, strings.Join(bad, ", "), need))
		}
	}
	sort.Strings(out)
	return out
}

// verdict records an answered probe: missing topics, new ids, another cluster.
func (h *Health) verdict(now time.Time, resp *kmsg.MetadataResponse) {
	cluster := ""
	if resp.ClusterID != nil {
		cluster = *resp.ClusterID
	}
	var missing, recreated []string
	h.mu.Lock()
	if h.cluster == "" {
		h.cluster = cluster
	}
	otherCluster := cluster != "" && cluster != h.cluster
	for _, t := range resp.Topics {
		name := ""
		if t.Topic != nil {
			name = *t.Topic
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", name, err))
			continue
		}
		old, seen := h.ids[name]
		switch {
		case !seen:
			h.ids[name] = t.TopicID
		case t.TopicID != [16]byte{} && old != [16]byte{} && t.TopicID != old:
			recreated = append(recreated, name)
		}
	}
	oldCluster := h.cluster
	h.mu.Unlock()
	sort.Strings(missing)
	sort.Strings(recreated)
	switch {
	case otherCluster:
		h.markChanged(fmt.Sprintf("broker %s came back as another cluster (id %s, was %s): its topics, offsets and transactions are not the ones this process holds", h.brokers(), cluster, oldCluster))
	case len(recreated) > 0:
		h.markChanged(fmt.Sprintf("topic %s was re-created (new topic id; deleted and created again, or the broker restarted empty): the clients of this process hold the old id", strings.Join(recreated, ", ")))
	}
	if len(missing) > 0 {
		why := fmt.Sprintf("broker %s answers but topic %s does not exist", h.brokers(), strings.Join(missing, ", "))
		h.setErr(now, errors.New(why), true)
		h.faults.Say(h.log, slog.LevelWarn, FaultTopicMissing, strings.Join(missing, ","), "kafka: "+why, "brokers", h.brokers())
		return
	}
	if bad := h.unwritable(resp); len(bad) > 0 {
		why := fmt.Sprintf("broker %s answers but writes with acks=all fail (NOT_ENOUGH_REPLICAS: brokers down): %s", h.brokers(), strings.Join(bad, "; "))
		h.setErr(now, errors.New(why), true)
		h.faults.Say(h.log, slog.LevelWarn, FaultUnderMinISR, strings.Join(h.o.Writes, ","), "kafka: "+why, "brokers", h.brokers())
		return
	}
	h.setErr(now, nil, true)
}

func (h *Health) setErr(now time.Time, err error, answered bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probed, h.err = now, err
	if answered {
		h.lastOK, h.fails = now, 0
	}
}

// unreachableAfter is how many probes in a row must go unanswered before
// the broker is reported unreachable (one slow probe is not an outage): a
// frozen broker is named within about two probe intervals.
const unreachableAfter = 2

// fetchFault is told every fetch fault of the role (FaultLog.onFetch).
func (h *Health) fetchFault(kind, topic string, err error) {
	if kind != FaultUnknownTopicID {
		return
	}
	now := h.o.Now()
	h.mu.Lock()
	span, seen := h.unknownID[topic]
	if !seen || now.Sub(span[1]) > UnknownTopicIDGrace {
		span[0] = now // a new run of errors
	}
	span[1] = now
	h.unknownID[topic] = span
	h.mu.Unlock()
	if d := now.Sub(span[0]); d >= UnknownTopicIDGrace {
		h.markChanged(fmt.Sprintf("fetching topic %s has failed with %v for %s: the broker no longer knows the topic id this process holds (the topic was deleted or re-created, or the broker restarted empty)", topic, err, d.Round(time.Second)))
	}
}

// markChanged closes Changed once, saying why (logged once, at error level).
func (h *Health) markChanged(why string) {
	h.stopOnce.Do(func() {
		h.mu.Lock()
		h.changedBy = why
		h.mu.Unlock()
		h.faults.Say(h.log, slog.LevelError, FaultTopicRecreated, "", "kafka: the broker came back different: "+why, "brokers", h.brokers())
		close(h.changed)
	})
}
