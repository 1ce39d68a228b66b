package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// Kafka is an embedded broker for one test.
type Kafka struct {
	*kafkax.Embedded
	Config kafkax.Config
}

// StartKafka starts an embedded Kafka-protocol broker on loopback with the
// four topics (prefix "plays", the given partitions; 0 means 3) and stops it
// when the test ends.
func StartKafka(t testing.TB, partitions int) *Kafka {
	t.Helper()
	if partitions <= 0 {
		partitions = 3
	}
	e, err := kafkax.StartEmbedded(kafkax.DefaultTopicPrefix, partitions)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(e.Close)
	return &Kafka{Embedded: e, Config: kafkax.Config{Brokers: e.Addrs(), TopicPrefix: kafkax.DefaultTopicPrefix, Partitions: partitions, ReplicationFactor: -1}}
}

// Client returns a franz-go client on the broker with extra options, closed
// when the test ends.
func (k *Kafka) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	base, err := k.Config.ClientOpts()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	cl, err := kgo.NewClient(append(base, opts...)...)
	if err != nil {
		t.Fatalf("testenv: kafka client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// ReadAll reads every committed record of topic from the start
// (read_committed) and returns them in fetch order. It waits up to 30 s for
// the first record when the topic is not empty, then reads until no new
// record arrives for quiet: a slow first fetch on a loaded machine is not
// mistaken for an empty topic.
func (k *Kafka) ReadAll(t testing.TB, topic string, quiet time.Duration) []*kgo.Record {
	t.Helper()
	cl := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topic)
	cancel()
	if err != nil {
		t.Fatalf("testenv: end offsets of %s: %v", topic, err)
	}
	empty := true
	ends.Each(func(o kadm.ListedOffset) { empty = empty && o.Offset <= 0 })
	if empty {
		return nil
	}
	var out []*kgo.Record
	firstBy := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), quiet)
		fs := cl.PollFetches(ctx)
		cancel()
		n := 0
		fs.EachRecord(func(r *kgo.Record) { out = append(out, r); n++ })
		if n == 0 && (len(out) > 0 || time.Now().After(firstBy)) {
			return out
		}
	}
}
