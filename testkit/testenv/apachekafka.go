package testenv

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// ApacheKafka says which Apache Kafka to start for a test.
type ApacheKafka struct {
	// Nodes: 1 (the default) is one combined broker+controller; 3 is a
	// cluster with replication factor 3 and min.insync.replicas=2.
	Nodes int
	// Controllers adds dedicated controller-only nodes to the quorum
	// (kafkanode.Config.Controllers): 2 beside 3 nodes keep a controller
	// through two nodes down.
	Controllers int
	// Partitions of the four topics, created before the test starts; 0
	// means 3.
	Partitions int
	// Props are broker settings added to kafkanode's defaults.
	Props map[string]string
	// NodeAddr and Prefix are kafkanode.Config's: a node on an address of
	// its own, run under a command (a network namespace). NodeAddr nil:
	// every listener on a free loopback port.
	NodeAddr func(id int) (string, error)
	Prefix   map[int][]string
}

// StartApacheKafka starts Apache Kafka itself (KRaft, JVM processes from the
// jars `make kafka` resolved; testkit/kafkanode) for one test, creates the
// four topics (prefix "plays") replicated over every node (at most 3), and
// kills the nodes when the test ends. The release is PLAYPIPE_KAFKA_VERSION
// (kafkanode.DefaultVersion when unset). Without the jars or a java binary
// the test is skipped, saying how to install them, unless
// PLAYPIPE_REQUIRE_KAFKA=1 (make test, CI) makes that a failure; a broker
// that does not start fails the test with the tail of each node's log.
//
// The returned Kafka has no Embedded broker: Apache is set instead, with
// the nodes to stop, kill, freeze and restart.
func StartApacheKafka(t testing.TB, opts ApacheKafka) *Kafka {
	t.Helper()
	if opts.Partitions <= 0 {
		opts.Partitions = 3
	}
	in, err := kafkanode.FindInstall(os.Getenv("PLAYPIPE_KAFKA_VERSION"))
	if errors.Is(err, kafkanode.ErrNotInstalled) && os.Getenv("PLAYPIPE_REQUIRE_KAFKA") != "1" {
		t.Skipf("testenv: %v", err)
	}
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	started := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := kafkanode.Start(ctx, kafkanode.Config{
		Dir:         t.TempDir(),
		Nodes:       opts.Nodes,
		Controllers: opts.Controllers,
		Install:     in,
		Heap:        "512m",
		Props:       opts.Props,
		Addr:        func() (string, error) { return FreeAddr(t), nil },
		NodeAddr:    opts.NodeAddr,
		Prefix:      opts.Prefix,
	})
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(c.Close)
	k := apacheTopics(t, ctx, c, kafkax.DefaultTopicPrefix, opts.Partitions)
	t.Logf("testenv: Apache Kafka %s, %d broker(s) at %s, ready with the topics in %s", in.Version, len(c.Brokers()), strings.Join(c.Addrs(), ","), time.Since(started).Round(time.Millisecond))
	return k
}

func findKafka(t testing.TB) kafkanode.Install {
	t.Helper()
	in, err := kafkanode.FindInstall(os.Getenv("PLAYPIPE_KAFKA_VERSION"))
	if errors.Is(err, kafkanode.ErrNotInstalled) && os.Getenv("PLAYPIPE_REQUIRE_KAFKA") != "1" {
		t.Skipf("testenv: %v", err)
	}
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return in
}

// apacheTopics creates the four topics of prefix on c, replicated over
// every broker (at most 3), and waits until they are led and in sync.
func apacheTopics(t testing.TB, ctx context.Context, c *kafkanode.Cluster, prefix string, partitions int) *Kafka {
	t.Helper()
	rf := min(3, len(c.Brokers()))
	k := &Kafka{Apache: c, Config: kafkax.Config{Brokers: c.Addrs(), TopicPrefix: prefix, Partitions: partitions, ReplicationFactor: rf}}
	if err := kafkax.EnsureTopics(ctx, k.Config); err != nil {
		t.Fatalf("testenv: topics %s.* on Apache Kafka %s: %v", prefix, c.Version(), err)
	}
	k.waitTopicsLed(t, ctx)
	return k
}

// SharedApacheKafka is StartApacheKafka for the many tests of one test
// binary that need a broker but never stop it: one Apache Kafka node,
// started on first use and kept until the test binary exits (the node dies
// with it: a parent-death signal; its folder is left in the system's temp
// folder, playpipe-kafka-*), and for each call four topics of its own under
// a fresh prefix (t1, t2, …) with the given partitions (0 means 3). A
// test that stops, kills or freezes its broker uses StartApacheKafka.
// Groups and transactional ids are the caller's to keep apart.
func SharedApacheKafka(t testing.TB, partitions int) *Kafka {
	t.Helper()
	if partitions <= 0 {
		partitions = 3
	}
	in := findKafka(t)
	shared.once.Do(func() {
		started := time.Now()
		dir, err := os.MkdirTemp("", "playpipe-kafka-")
		if err != nil {
			shared.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.c, shared.err = kafkanode.Start(ctx, kafkanode.Config{Dir: dir, Install: in, Heap: "768m", Addr: func() (string, error) { return FreeAddr(t), nil }})
		if shared.err == nil {
			t.Logf("testenv: shared Apache Kafka %s at %s (for this test binary) ready in %s", in.Version, strings.Join(shared.c.Addrs(), ","), time.Since(started).Round(time.Millisecond))
		}
	})
	if shared.err != nil {
		t.Fatalf("testenv: shared Apache Kafka: %v", shared.err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return apacheTopics(t, ctx, shared.c, fmt.Sprintf("t%d", shared.next.Add(1)), partitions)
}

var shared struct {
	once sync.Once
	c    *kafkanode.Cluster
	err  error
	next atomic.Int64
}

// waitTopicsLed waits until every partition of the four topics has a leader
// and its full replica set in sync: a freshly created topic answers
// NOT_LEADER for a moment, and a test should start on a settled cluster.
func (k *Kafka) waitTopicsLed(t testing.TB, ctx context.Context) {
	t.Helper()
	cl := k.Client(t)
	adm := kadm.NewClient(cl)
	var last string
	for {
		td, err := adm.ListTopics(ctx, k.Config.Topics().All()...)
		if err == nil {
			last = ""
			for _, topic := range td.Sorted() {
				for _, p := range topic.Partitions.Sorted() {
					if topic.Err != nil || p.Err != nil || p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
						last = fmt.Sprintf("%s[%d]: leader %d, isr %v of %v, err %v %v", topic.Topic, p.Partition, p.Leader, p.ISR, p.Replicas, topic.Err, p.Err)
						break
					}
				}
				if len(topic.Partitions) == 0 {
					last = topic.Topic + ": no partitions yet"
				}
				if last != "" {
					break
				}
			}
			if last == "" && len(td) == len(k.Config.Topics().All()) {
				return
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: topics not settled on Apache Kafka: %s", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// WaitInSync waits up to d until every partition of every topic, the
// internal ones included (__consumer_offsets, __transaction_state), has a
// leader and its full replica set in sync again (after a node's restart),
// and fails the test otherwise. For Apache Kafka only.
func (k *Kafka) WaitInSync(t testing.TB, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	k.waitTopicsLed(t, ctx)
	adm := kadm.NewClient(k.Client(t))
	var last string
	for {
		td, err := adm.ListTopicsWithInternal(ctx)
		if err == nil {
			last = ""
		scan:
			for _, topic := range td.Sorted() {
				for _, p := range topic.Partitions.Sorted() {
					if topic.Err != nil || p.Err != nil || p.Leader < 0 || len(p.ISR) < len(p.Replicas) {
						last = fmt.Sprintf("%s[%d]: leader %d, isr %v of %v", topic.Topic, p.Partition, p.Leader, p.ISR, p.Replicas)
						break scan
					}
				}
			}
			if last == "" {
				return
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			t.Fatalf("testenv: Apache Kafka not in sync within %s: %s", d, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
