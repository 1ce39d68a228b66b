package telemetry

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MetricConsumerLag is the gauge RegisterConsumerLag registers ({record};
// attributes group, topic, partition), scraped as playpipe_consumer_lag.
// The roles declare their own instruments (reporter/metrics.go,
// consumer/enricher.go, consumer/mixcache.go, analytics/sink.go,
// producer/publisher.go, partnerapi/client.go); their Prometheus names are
// listed in docs/operating.md: dots become underscores, counters get _total
// and seconds histograms _seconds.
const MetricConsumerLag = "playpipe.consumer.lag"

// Attribute keys of the consumer lag gauge.
const (
	AttrGroup     = attribute.Key("group")
	AttrTopic     = attribute.Key("topic")
	AttrPartition = attribute.Key("partition")
)

// LatencyBuckets are the bucket boundaries (seconds) of every playpipe.*
// histogram in seconds: 1 ms to 30 s. Setup's meter provider applies them
// by a view, so an instrument created without explicit boundaries does not
// get the SDK's millisecond defaults.
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

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
	g, err := m.Int64ObservableGauge(MetricConsumerLag, metric.WithUnit("{record}"),
		metric.WithDescription("Records not yet committed by the consumer group, per partition (end offset − committed offset)."))
	if err != nil {
		return nil, fmt.Errorf("telemetry: create %s: %w", MetricConsumerLag, err)
	}
	l := &lagGauge{adm: adm, group: group, o: o, want: map[string]bool{}, groupAttr: AttrGroup.String(group)}
	for _, t := range o.Topics {
		l.want[t] = true
	}
	return m.RegisterCallback(func(ctx context.Context, obs metric.Observer) error {
		pts, err := l.points(ctx)
		if err != nil {
			return err
		}
		for _, p := range pts {
			obs.ObserveInt64(g, p.lag, metric.WithAttributes(l.groupAttr, AttrTopic.String(p.topic),
				AttrPartition.String(strconv.Itoa(int(p.partition)))))
		}
		return nil
	}, g)
}

// lagGauge is the state of one consumer lag gauge: the last answer, reused
// for MinInterval.
type lagGauge struct {
	adm       *kadm.Client
	group     string
	o         ConsumerLagOptions
	want      map[string]bool // empty: every topic
	groupAttr attribute.KeyValue

	mu     sync.Mutex
	last   []lagPoint // nil until the first answer
	lastAt time.Time
}

type lagPoint struct {
	topic     string
	partition int32
	lag       int64
}

// points returns the last answer, or a new one when it is older than
// MinInterval.
func (l *lagGauge) points(ctx context.Context) ([]lagPoint, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil || time.Since(l.lastAt) >= l.o.MinInterval {
		pts, err := l.query(ctx)
		if err != nil {
			return nil, err
		}
		l.last, l.lastAt = pts, time.Now()
		if l.last == nil {
			l.last = []lagPoint{}
		}
	}
	return l.last, nil
}

// query asks the cluster for the group's lag, bounded by Timeout.
func (l *lagGauge) query(ctx context.Context) ([]lagPoint, error) {
	ctx, cancel := context.WithTimeout(ctx, l.o.Timeout)
	defer cancel()
	lags, err := l.adm.Lag(ctx, l.group)
	if err != nil {
		return nil, fmt.Errorf("telemetry: consumer lag of %s: %w", l.group, err)
	}
	dl, ok := lags[l.group]
	if !ok {
		return nil, nil
	}
	if err := dl.Error(); err != nil {
		return nil, fmt.Errorf("telemetry: consumer lag of %s: %w", l.group, err)
	}
	var pts []lagPoint
	var details kadm.TopicDetails // topic ids and leaders, fetched once if a lag is checked
	for topic, ps := range dl.Lag {
		if len(l.want) > 0 && !l.want[topic] {
			continue
		}
		for p, ml := range ps {
			if ml.Err != nil {
				continue
			}
			lag := ml.Lag
			if l.o.Client != nil && lag > 0 && lag <= l.o.SmallLag && ml.Commit.At >= 0 {
				if details == nil {
					if details, err = l.adm.ListTopics(ctx); err != nil {
						details = kadm.TopicDetails{}
					}
				}
				lag = l.checked(ctx, details, ml, lag)
			}
			pts = append(pts, lagPoint{topic, p, lag})
		}
	}
	return pts, nil
}

// checked returns the records a read_committed consumer would read of
// partition ml, or estimate when that cannot be told.
func (l *lagGauge) checked(ctx context.Context, details kadm.TopicDetails, ml kadm.GroupMemberLag, estimate int64) int64 {
	td, ok := details[ml.Topic]
	if !ok {
		return estimate
	}
	pd, ok := td.Partitions[ml.Partition]
	if !ok || pd.Err != nil {
		return estimate
	}
	if n, ok := recordsBetween(ctx, l.o.Client, ml.Topic, td.ID, ml.Partition, pd.Leader, ml.Commit.At, ml.End.Offset); ok {
		return n
	}
	return estimate
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
