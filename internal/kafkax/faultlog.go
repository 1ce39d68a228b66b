package kafkax

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// DefaultFaultLogEvery is how often a FaultLog says the same Kafka fault:
// once a minute, with the number of repeats it kept quiet about.
const DefaultFaultLogEvery = time.Minute

// Kinds of Kafka faults (the kind attribute of playpipe.kafka.faults).
const (
	FaultUnreachable    = "unreachable"      // the broker does not answer (down, frozen, cut off)
	FaultTopicMissing   = "topic_missing"    // a topic of the pipeline does not exist
	FaultUnderMinISR    = "under_min_isr"    // a topic the role writes has partitions without a leader or below min.insync.replicas
	FaultTopicRecreated = "topic_recreated"  // a topic came back with a new id, or the cluster is another one
	FaultUnknownTopicID = "unknown_topic_id" // a fetch named a topic id the broker no longer knows
	FaultFetch          = "fetch_error"      // any other fetch error
	FaultProduceTimeout = "produce_timeout"  // a produce not acknowledged by its deadline (the gateway's 503 kafka_timeout)
	FaultProduce        = "produce_error"    // records Kafka failed (the gateway's 503 kafka_unavailable)
	FaultCommit         = "commit_error"     // an offset commit refused (UNKNOWN_MEMBER_ID while the group moves) or unanswered
)

// MetricKafkaFaults is the counter of Kafka faults a role met, by kind
// (scraped as playpipe_kafka_faults_total).
const MetricKafkaFaults = "playpipe.kafka.faults"

// FaultLog says Kafka faults on a role's log without flooding it: the
// first occurrence of a fault (its kind and topic) is logged at once, the
// repeats within Every are counted and said in one line when the fault is
// seen again after Every. A broker that answers every fetch with an error
// within microseconds (9 000 times a second) thus costs one log line a
// minute. Every fault is counted in playpipe.kafka.faults{kind}.
//
// A nil *FaultLog is usable: it logs through a process-wide FaultLog
// without a meter. Safe for concurrent use.
type FaultLog struct {
	every   time.Duration
	now     func() time.Time
	counter metric.Int64Counter
	// onFetch is told the kind and topic of every fetch fault (Health marks
	// the broker changed on unknown_topic_id).
	onFetch func(kind, topic string, err error)

	mu   sync.Mutex
	seen map[string]*faultSeen
}

type faultSeen struct {
	said       time.Time // when it was last logged
	suppressed int       // repeats since then
}

// FaultLogOptions tunes NewFaultLog; zero values take the defaults.
type FaultLogOptions struct {
	// Every is the least time between two lines about one fault;
	// defaults to DefaultFaultLogEvery.
	Every time.Duration
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// MeterProvider makes playpipe.kafka.faults; nil: not measured.
	MeterProvider metric.MeterProvider
}

// NewFaultLog returns a FaultLog.
func NewFaultLog(o FaultLogOptions) *FaultLog {
	if o.Every <= 0 {
		o.Every = DefaultFaultLogEvery
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	mp := o.MeterProvider
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	c, _ := mp.Meter("github.com/playpipe/playpipe/internal/kafkax").Int64Counter(MetricKafkaFaults,
		metric.WithDescription("Kafka faults a role met, by kind: unreachable, topic_missing, topic_recreated, unknown_topic_id, fetch_error, produce_timeout, produce_error (each logged at most once a minute)."))
	return &FaultLog{every: o.Every, now: o.Now, counter: c, seen: map[string]*faultSeen{}}
}

var processFaults = NewFaultLog(FaultLogOptions{})

func (f *FaultLog) orProcess() *FaultLog {
	if f == nil {
		return processFaults
	}
	return f
}

// Say logs msg at level on log unless the fault named by kind and subject
// was logged less than Every ago (then it only counts it); a line after a
// quiet spell carries suppressed, the repeats it kept quiet about. It
// reports whether it logged.
func (f *FaultLog) Say(log *slog.Logger, level slog.Level, kind, subject, msg string, args ...any) bool {
	f = f.orProcess()
	f.counter.Add(context.Background(), 1, metric.WithAttributes(attribute.String("kind", kind)))
	key := kind + "\x00" + subject
	now := f.now()
	f.mu.Lock()
	s := f.seen[key]
	if s == nil {
		s = &faultSeen{}
		f.seen[key] = s
	} else if now.Sub(s.said) < f.every {
		s.suppressed++
		f.mu.Unlock()
		return false
	}
	suppressed := s.suppressed
	s.said, s.suppressed = now, 0
	f.mu.Unlock()
	if log == nil {
		log = slog.Default()
	}
	args = append(args, "fault", kind)
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed, "suppressed_over", f.every.String())
	}
	log.Log(context.Background(), level, msg, args...)
	return true
}

// Fetch says one fetch error of a role's poll loop (kgo.Fetches.EachError):
// at most once per Every per kind of error and topic, whatever the
// partition. Context errors are not faults and are ignored.
func (f *FaultLog) Fetch(log *slog.Logger, topic string, partition int32, err error) {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return
	}
	f = f.orProcess()
	kind := FetchFaultKind(err)
	if f.onFetch != nil {
		f.onFetch(kind, topic, err)
	}
	msg := "kafka: fetch error"
	if kind == FaultUnknownTopicID {
		msg = "kafka: fetch error: the broker no longer knows this topic's id (the topic was deleted and re-created, or the broker restarted empty)"
	}
	f.Say(log, slog.LevelWarn, kind, topic+"\x00"+errClass(err), msg, "topic", topic, "partition", partition, "err", err)
}

// FetchFaultKind classifies a fetch error into one of the fault kinds.
func FetchFaultKind(err error) string {
	switch {
	case errors.Is(err, kerr.UnknownTopicID), errors.Is(err, kerr.InconsistentTopicID):
		return FaultUnknownTopicID
	case errors.Is(err, kerr.UnknownTopicOrPartition):
		return FaultTopicMissing
	case isNetErr(err):
		return FaultUnreachable
	}
	return FaultFetch
}

// errClass is what tells two errors of a kind apart for deduplication: the
// Kafka error code's name, else the error's type.
func errClass(err error) string {
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Message
	}
	return fmt.Sprintf("%T", err)
}

func isNetErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
