package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names: the one list every role uses. The Prometheus names (as
// scraped from /metrics) are in docs/operating.md: dots become underscores,
// counters get _total and seconds histograms _seconds.
const (
	MetricEventsIn           = "playpipe.events.in"            // counter {event}
	MetricEventsRejected     = "playpipe.events.rejected"      // counter {event}, reason
	MetricPlaysDerived       = "playpipe.plays.derived"        // counter {play}
	MetricPlaysBelowMin      = "playpipe.plays.below_minimum"  // counter {play}
	MetricDeliveries         = "playpipe.deliveries"           // counter {report}, outcome
	MetricDeliveryRetries    = "playpipe.delivery.retries"     // counter {retry}, reason
	MetricDeliveryLatency    = "playpipe.delivery.latency"     // histogram s, outcome
	MetricStandbyActive      = "playpipe.standby.active"       // up-down counter 0/1
	MetricStandbyEpisodes    = "playpipe.standby.episodes"     // counter {episode}
	MetricMixCacheHits       = "playpipe.mixcache.hits"        // counter {lookup}
	MetricMixCacheMisses     = "playpipe.mixcache.misses"      // counter {lookup}
	MetricSinkRows           = "playpipe.sink.rows"            // counter {row}, table
	MetricSinkInsertDuration = "playpipe.sink.insert.duration" // histogram s, table
	MetricConsumerLag        = "playpipe.consumer.lag"         // gauge {record}, group, topic, partition
)

// Attribute keys of the playpipe metrics.
const (
	AttrReason    = attribute.Key("reason")
	AttrOutcome   = attribute.Key("outcome")
	AttrTable     = attribute.Key("table")
	AttrGroup     = attribute.Key("group")
	AttrTopic     = attribute.Key("topic")
	AttrPartition = attribute.Key("partition")
)

// LatencyBuckets are the bucket boundaries (seconds) of the delivery latency
// and sink insert histograms: 1 ms to 30 s. Setup's meter provider applies
// them to every playpipe.* histogram in seconds, so an instrument created
// without explicit boundaries does not get the SDK's millisecond defaults.
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Metrics holds the playpipe instruments. Create one per role with
// NewMetrics(otel.Meter("github.com/playpipe/playpipe/<pkg>")); every role
// gets the same names, units and buckets. All methods are safe for concurrent
// use, allocate nothing after a label value's first use, and are no-ops on a
// nil *Metrics (so tests may pass nil).
type Metrics struct {
	eventsIn        metric.Int64Counter
	eventsRejected  metric.Int64Counter
	playsDerived    metric.Int64Counter
	playsBelowMin   metric.Int64Counter
	deliveries      metric.Int64Counter
	retries         metric.Int64Counter
	deliveryLatency metric.Float64Histogram
	standbyActive   metric.Int64UpDownCounter
	standbyEpisodes metric.Int64Counter
	mixHits         metric.Int64Counter
	mixMisses       metric.Int64Counter
	sinkRows        metric.Int64Counter
	sinkInsert      metric.Float64Histogram

	attrMu sync.Mutex                             // serialises writers of attrs
	attrs  atomic.Pointer[map[attrKey]attrOption] // copy on write: readers take no lock
}

type attrKey struct {
	k attribute.Key
	v string
}

// attrOption is a cached measurement option, also as a one-element slice so
// the variadic call does not allocate.
type attrOption struct {
	opt  metric.MeasurementOption
	opts []metric.AddOption
	recs []metric.RecordOption
}

// NewMetrics creates the instruments on m.
func NewMetrics(m metric.Meter) (*Metrics, error) {
	var errs []error
	c := func(name, unit, desc string) metric.Int64Counter {
		x, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return x
	}
	h := func(name, desc string) metric.Float64Histogram {
		x, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(LatencyBuckets...))
		errs = append(errs, err)
		return x
	}
	ms := &Metrics{
		eventsIn:        c(MetricEventsIn, "{event}", "Player events read from the events topic or accepted by the ingest gateway."),
		eventsRejected:  c(MetricEventsRejected, "{event}", "Events sent to the rejected topic, by machine-readable reason."),
		playsDerived:    c(MetricPlaysDerived, "{play}", "Track plays derived from events and written to the reports topic."),
		playsBelowMin:   c(MetricPlaysBelowMin, "{play}", "Track plays shorter than the minimum play length: counted, not reported."),
		deliveries:      c(MetricDeliveries, "{report}", "Answers of the partner API to play reports, by outcome: delivered, rejected, standby, retry, blocked."),
		retries:         c(MetricDeliveryRetries, "{retry}", "Report posts to be retried, by reason: http_500, http_503, timeout, connection, unauthorized."),
		deliveryLatency: h(MetricDeliveryLatency, "Latency of one delivery attempt (POST royalty-tracking), by outcome."),
		standbyEpisodes: c(MetricStandbyEpisodes, "{episode}", "Times the reporter entered standby mode (a report answered by standby)."),
		mixHits:         c(MetricMixCacheHits, "{lookup}", "Mix look-ups served from the mix cache."),
		mixMisses:       c(MetricMixCacheMisses, "{lookup}", "Mix look-ups fetched from the partner API."),
		sinkRows:        c(MetricSinkRows, "{row}", "Rows inserted into ClickHouse by the sink, by table."),
		sinkInsert:      h(MetricSinkInsertDuration, "Duration of one ClickHouse batch insert, by table."),
	}
	g, err := m.Int64UpDownCounter(MetricStandbyActive,
		metric.WithDescription("1 while the reporter is in standby mode (not dispatching, probing the API), else 0."))
	errs = append(errs, err)
	ms.standbyActive = g
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("telemetry: create instruments: %w", err)
	}
	return ms, nil
}

func (m *Metrics) attr(k attribute.Key, v string) attrOption {
	key := attrKey{k, v}
	if cur := m.attrs.Load(); cur != nil {
		if o, ok := (*cur)[key]; ok {
			return o
		}
	}
	m.attrMu.Lock()
	defer m.attrMu.Unlock()
	cur := m.attrs.Load()
	if cur != nil {
		if o, ok := (*cur)[key]; ok {
			return o
		}
	}
	next := make(map[attrKey]attrOption, 1)
	if cur != nil {
		for kk, vv := range *cur {
			next[kk] = vv
		}
	}
	opt := metric.WithAttributeSet(attribute.NewSet(k.String(v)))
	o := attrOption{opt: opt, opts: []metric.AddOption{opt}, recs: []metric.RecordOption{opt}}
	next[key] = o
	m.attrs.Store(&next)
	return o
}

// EventsIn counts n events received.
func (m *Metrics) EventsIn(ctx context.Context, n int) {
	if m != nil {
		m.eventsIn.Add(ctx, int64(n))
	}
}

// Rejected counts one event rejected for reason (a schemas reason code).
func (m *Metrics) Rejected(ctx context.Context, reason string) {
	if m != nil {
		m.eventsRejected.Add(ctx, 1, m.attr(AttrReason, reason).opts...)
	}
}

// PlaysDerived counts n track plays written to the reports topic.
func (m *Metrics) PlaysDerived(ctx context.Context, n int) {
	if m != nil {
		m.playsDerived.Add(ctx, int64(n))
	}
}

// PlaysBelowMinimum counts n track plays under the minimum length.
func (m *Metrics) PlaysBelowMinimum(ctx context.Context, n int) {
	if m != nil {
		m.playsBelowMin.Add(ctx, int64(n))
	}
}

// Delivery records one delivery answer: its outcome (schemas.Outcome*:
// delivered, rejected, standby, retry, blocked) and the attempt's latency.
func (m *Metrics) Delivery(ctx context.Context, outcome string, latency time.Duration) {
	if m != nil {
		o := m.attr(AttrOutcome, outcome)
		m.deliveries.Add(ctx, 1, o.opts...)
		m.deliveryLatency.Record(ctx, latency.Seconds(), o.recs...)
	}
}

// Retry counts one delivery retry for reason (reporter.Reason*: http_500,
// http_503, timeout, connection, unauthorized).
func (m *Metrics) Retry(ctx context.Context, reason string) {
	if m != nil {
		m.retries.Add(ctx, 1, m.attr(AttrReason, reason).opts...)
	}
}

// StandbyEntered raises the standby gauge by 1 and counts an episode; pair
// every call with one StandbyLeft.
func (m *Metrics) StandbyEntered(ctx context.Context) {
	if m != nil {
		m.standbyActive.Add(ctx, 1)
		m.standbyEpisodes.Add(ctx, 1)
	}
}

// StandbyLeft lowers the standby gauge by 1 (live service is back).
func (m *Metrics) StandbyLeft(ctx context.Context) {
	if m != nil {
		m.standbyActive.Add(ctx, -1)
	}
}

// MixCache counts one mix look-up, a hit or a miss (fetched from the API).
func (m *Metrics) MixCache(ctx context.Context, hit bool) {
	if m == nil {
		return
	}
	if hit {
		m.mixHits.Add(ctx, 1)
	} else {
		m.mixMisses.Add(ctx, 1)
	}
}

// SinkInsert records one ClickHouse batch insert of rows into table that took d.
func (m *Metrics) SinkInsert(ctx context.Context, table string, rows int, d time.Duration) {
	if m != nil {
		o := m.attr(AttrTable, table)
		m.sinkRows.Add(ctx, int64(rows), o.opts...)
		m.sinkInsert.Record(ctx, d.Seconds(), o.recs...)
	}
}

// ConsumerLagOptions tunes RegisterConsumerLag.
type ConsumerLagOptions struct {
	// Topics limits the reported partitions to these topics; empty: every
	// topic the group has offsets for or is assigned.
	Topics []string
	// Timeout bounds one lag query (describe group, list end offsets, fetch
	// commits); defaults to 5 s.
	Timeout time.Duration
	// MinInterval is the shortest time between two queries; collections
	// within it reuse the last answer. Defaults to 5 s.
	MinInterval time.Duration
	// Client is the client adm wraps. With it, a partition whose lag is
	// small and positive (at most SmallLag) is checked with a
	// read_committed fetch from the committed offset, and its lag is the
	// number of records actually there: the end offset of a topic written
	// in transactions counts the trailing commit marker (and aborted
	// records), so kadm.Lag reads 1 per idle partition. Nil: kadm.Lag as is.
	Client *kgo.Client
	// SmallLag bounds the lags checked (default 64): a larger lag is
	// reported as end − committed (a few markers do not matter there).
	SmallLag int64
}

// RegisterConsumerLag registers the observable gauge playpipe.consumer.lag
// {group, topic, partition}: records between the group's committed offset and
// the partition's end (high watermark; for transactional topics the last
// stable offset), as computed by kadm.Client.Lag on each collection (at most
// once per MinInterval). A partition without a commit counts from its start.
// Unregister the returned registration before closing adm's client.
func RegisterConsumerLag(m metric.Meter, adm *kadm.Client, group string, o ConsumerLagOptions) (metric.Registration, error) {
	if adm == nil || group == "" {
		return nil, fmt.Errorf("%w: RegisterConsumerLag needs a kadm client and a group", ErrInvalidConfig)
	}
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Second
	}
	if o.MinInterval <= 0 {
		o.MinInterval = 5 * time.Second
	}
	if o.SmallLag <= 0 {
		o.SmallLag = 64
	}
	want := map[string]bool{}
	for _, t := range o.Topics {
		want[t] = true
	}
	g, err := m.Int64ObservableGauge(MetricConsumerLag, metric.WithUnit("{record}"),
		metric.WithDescription("Records not yet committed by the consumer group, per partition (end offset − committed offset)."))
	if err != nil {
		return nil, fmt.Errorf("telemetry: create %s: %w", MetricConsumerLag, err)
	}
	type point struct {
		topic     string
		partition int32
		lag       int64
	}
	var (
		mu     sync.Mutex
		last   []point
		lastAt time.Time
	)
	groupAttr := AttrGroup.String(group)
	query := func(ctx context.Context) ([]point, error) {
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		lags, err := adm.Lag(ctx, group)
		if err != nil {
			return nil, fmt.Errorf("telemetry: consumer lag of %s: %w", group, err)
		}
		dl, ok := lags[group]
		if !ok {
			return nil, nil
		}
		if err := dl.Error(); err != nil {
			return nil, fmt.Errorf("telemetry: consumer lag of %s: %w", group, err)
		}
		var pts []point
		var details kadm.TopicDetails // topic ids and leaders, fetched once if a lag is checked
		for topic, ps := range dl.Lag {
			if len(want) > 0 && !want[topic] {
				continue
			}
			for p, l := range ps {
				if l.Err != nil {
					continue
				}
				lag := l.Lag
				if o.Client != nil && lag > 0 && lag <= o.SmallLag && l.Commit.At >= 0 {
					if details == nil {
						if details, err = adm.ListTopics(ctx); err != nil {
							details = kadm.TopicDetails{}
						}
					}
					if td, ok := details[topic]; ok {
						if pd, ok := td.Partitions[p]; ok && pd.Err == nil {
							if n, ok := recordsBetween(ctx, o.Client, topic, td.ID, p, pd.Leader, l.Commit.At, l.End.Offset); ok {
								lag = n
							}
						}
					}
				}
				pts = append(pts, point{topic, p, lag})
			}
		}
		return pts, nil
	}
	return m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		mu.Lock()
		defer mu.Unlock()
		if last == nil || time.Since(lastAt) >= o.MinInterval {
			pts, err := query(ctx)
			if err != nil {
				return err
			}
			last, lastAt = pts, time.Now()
			if last == nil {
				last = []point{}
			}
		}
		for _, p := range last {
			obs.ObserveInt64(g, p.lag, metric.WithAttributes(groupAttr, AttrTopic.String(p.topic),
				AttrPartition.String(strconv.Itoa(int(p.partition)))))
		}
		return nil
	}, g)
}

// recordsBetween counts the records a read_committed consumer would get
// from partition p of topic in [from, end): one fetch from the leader,
// parsed by kgo (control records and aborted transactions dropped). ok is
// false when the answer did not cover [from, end) (then the caller keeps
// its estimate).
func recordsBetween(ctx context.Context, cl *kgo.Client, topic string, id kadm.TopicID, p, leader int32, from, end int64) (int64, bool) {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID = -1
	req.MaxWaitMillis = 0
	req.MinBytes = 0
	req.MaxBytes = 1 << 20
	req.IsolationLevel = 1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, id
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, from, 1<<20
	rp.CurrentLeaderEpoch, rp.LogStartOffset = -1, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl.Broker(int(leader)))
	if err != nil || resp.ErrorCode != 0 || len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		return 0, false
	}
	part := &resp.Topics[0].Partitions[0]
	if part.ErrorCode != 0 {
		return 0, false
	}
	fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{Offset: from, IsolationLevel: kgo.ReadCommitted(), Topic: topic, Partition: p},
		part, kgo.DefaultDecompressor(), nil)
	if fp.Err != nil {
		return 0, false
	}
	var n int64
	for _, r := range fp.Records {
		if r.Offset < end {
			n++
		}
	}
	// The fetch must have covered the range: its next offset reached end,
	// or the records stop at the last stable offset (what is past it is
	// not readable yet and stays counted by the estimate).
	if next < end && fp.LastStableOffset > next {
		return 0, false
	}
	return n, true
}
