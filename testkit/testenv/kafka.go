package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// Kafka is the broker of one test: the embedded broker (kfake, StartKafka)
// or Apache Kafka itself (StartApacheKafka). Config, Addrs, Client and the
// readers work on both.
type Kafka struct {
	// Embedded is the in-process broker; nil on Apache Kafka.
	*kafkax.Embedded
	// Apache is the Apache Kafka cluster; nil on the embedded broker.
	Apache *kafkanode.Cluster
	Config kafkax.Config
}

// Addrs returns the brokers' addresses, host:port.
func (k *Kafka) Addrs() []string { return append([]string(nil), k.Config.Brokers...) }

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
// (read_committed) at least up to the topic's last stable offsets when it is
// called (a record written since may come along in the same fetches), and
// returns them in fetch order, without transaction markers.
//
// It stops when every partition has been read to its end, not after a quiet
// spell: on a loaded machine one partition's fetch can lag the others by
// more than any quiet period, and a read that returned without it would lose
// records silently. A read that has not reached the end after a minute
// fails the test.
func (k *Kafka) ReadAll(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	return k.readToEnd(t, topic, kgo.ReadCommitted())
}

// settledEnds lists the end offsets a read must reach. At read_committed it
// is the last stable offsets, once they have caught up with the high
// watermarks or 15 s have passed: Apache Kafka completes a transaction
// after EndTransaction returns (the coordinator writes the markers
// afterwards), so a read right after a commit would stop short of it;
// kfake completes it at once. A transaction still open after 15 s is left
// out, as a read_committed consumer would.
func settledEnds(adm *kadm.Client, topic string, level kgo.IsolationLevel) (kadm.ListedOffsets, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	by := time.Now().Add(15 * time.Second)
	for {
		hw, err := adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = hw.Error()
		}
		if err != nil || level != kgo.ReadCommitted() {
			return hw, err
		}
		lso, err := adm.ListCommittedOffsets(ctx, topic)
		if err == nil {
			err = lso.Error()
		}
		if err != nil {
			return nil, err
		}
		settled := true
		lso.Each(func(o kadm.ListedOffset) {
			if h, ok := hw.Lookup(topic, o.Partition); !ok || h.Offset != o.Offset {
				settled = false
			}
		})
		if settled || time.Now().After(by) {
			return lso, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ReadAllUncommitted is ReadAll at read_uncommitted, up to the high
// watermarks: it also returns the records of aborted and open transactions.
func (k *Kafka) ReadAllUncommitted(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	return k.readToEnd(t, topic, kgo.ReadUncommitted())
}

func (k *Kafka) readToEnd(t testing.TB, topic string, level kgo.IsolationLevel) []*kgo.Record {
	t.Helper()
	// Transaction markers are kept so that a partition whose last entry is a
	// marker is seen to reach its end; they are not returned.
	cl := k.Client(t, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(level), kgo.KeepControlRecords())
	ends, err := settledEnds(kadm.NewClient(cl), topic, level)
	if err != nil {
		t.Fatalf("testenv: end offsets of %s: %v", topic, err)
	}
	left := map[int32]int64{} // partition -> end offset not reached yet
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[o.Partition] = o.Offset
		}
	})
	var out []*kgo.Record
	by := time.Now().Add(time.Minute)
	for len(left) > 0 {
		if time.Now().After(by) {
			t.Fatalf("testenv: reading %s: after a minute, partitions %v (partition: end offset) not read to their end; %d records read", topic, left, len(out))
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		fs := cl.PollFetches(ctx)
		cancel()
		fs.EachRecord(func(r *kgo.Record) {
			if end, ok := left[r.Partition]; ok && r.Offset+1 >= end {
				delete(left, r.Partition)
			}
			if !r.Attrs.IsControl() {
				out = append(out, r)
			}
		})
	}
	return out
}
