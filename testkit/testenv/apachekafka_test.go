package testenv

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// TestApacheKafkaNode: one Apache Kafka node takes idempotent and
// transactional writes, keeps them through kill -9 and a restart on the same
// folder, refuses commit metadata over offset.metadata.max.bytes (what kfake
// never checks), and a frozen node answers nothing until thawed.
func TestApacheKafkaNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Apache Kafka")
	}
	k := StartApacheKafka(t, ApacheKafka{Partitions: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topic := k.Config.Topics().Events
	cl := k.Client(t, kgo.TransactionalID("testenv-apache"), kgo.DefaultProduceTopic(topic))
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		cl.Produce(ctx, &kgo.Record{Key: fmt.Appendf(nil, "k%d", i), Value: fmt.Appendf(nil, "v%d", i)}, nil)
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatalf("commit a transaction on Apache Kafka: %v", err)
	}
	if got := len(k.ReadAll(t, topic)); got != 100 {
		t.Fatalf("read %d records before the kill, want 100", got)
	}

	node := k.Apache.Nodes()[0]
	node.Kill()
	if node.Running() {
		t.Fatal("node still running after Kill")
	}
	if err := k.Apache.Restart(ctx, node); err != nil {
		t.Fatal(err)
	}
	if got := len(k.ReadAll(t, topic)); got != 100 {
		t.Fatalf("read %d records after kill -9 and restart, want 100 (the log is on disk)", got)
	}

	// Commit metadata: the broker's default limit is 4096 characters.
	adm := kadm.NewClient(k.Client(t))
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1, Metadata: strings.Repeat("x", 4097)})
	resp, err := adm.CommitOffsets(ctx, "testenv-meta", offs)
	if err == nil {
		err = resp.Error()
	}
	if !errors.Is(err, kerr.OffsetMetadataTooLarge) {
		t.Fatalf("commit with 4097 characters of metadata: %v, want OFFSET_METADATA_TOO_LARGE", err)
	}
	offs = kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 1, Metadata: strings.Repeat("x", 4096)})
	if resp, err = adm.CommitOffsets(ctx, "testenv-meta", offs); err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("commit with 4096 characters of metadata: %v", err)
	}

	if err := node.Freeze(); err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = kadm.NewClient(k.Client(t)).BrokerMetadata(pctx) // a new client: nothing cached
	pcancel()
	if err := node.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("a frozen node answered a metadata request")
	}
	if _, err := adm.BrokerMetadata(ctx); err != nil {
		t.Fatalf("metadata after thaw: %v", err)
	}
}

// TestApacheKafkaCluster: three brokers with replication factor 3 and
// min.insync.replicas=2 (and two controller-only nodes, so that the quorum
// outlives two brokers) take acks=all writes with one broker down and refuse
// them with NOT_ENOUGH_REPLICAS with two down (the refusal kfake cannot
// give), then take them again when one returns; the active controller is
// one of the nodes.
func TestApacheKafkaCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node Apache Kafka cluster")
	}
	k := StartApacheKafka(t, ApacheKafka{Nodes: 3, Controllers: 2, Partitions: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	ctl, err := k.Apache.ActiveController(ctx)
	if err != nil || k.Apache.Node(ctl) == nil {
		t.Fatalf("active controller: %d, %v", ctl, err)
	}
	t.Logf("active controller: node %d (broker: %v)", ctl, k.Apache.Node(ctl).Broker != "")
	topic := k.Config.Topics().Reports
	// NOT_ENOUGH_REPLICAS is retriable: an idempotent producer retries it
	// until its delivery timeout and reports the timeout. This one retries a
	// few times and reports the broker's own answer.
	produce := func(tag string, timeout time.Duration) error {
		cl := k.Client(t, kgo.DefaultProduceTopic(topic), kgo.RecordDeliveryTimeout(timeout),
			kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.RecordRetries(2))
		pctx, pcancel := context.WithTimeout(ctx, timeout+5*time.Second)
		defer pcancel()
		return cl.ProduceSync(pctx, &kgo.Record{Value: []byte(tag)}).FirstErr()
	}
	partition := func() kadm.PartitionDetail {
		td, err := kadm.NewClient(k.Client(t)).ListTopics(ctx, topic)
		if err != nil {
			t.Fatal(err)
		}
		return td[topic].Partitions[0]
	}
	// Two followers down; once the controller has fenced them the ISR is
	// the leader alone, below min.insync.replicas.
	p := partition()
	var down []*kafkanode.Node
	for _, id := range p.Replicas {
		if id != p.Leader && len(down) < 2 {
			n := k.Apache.Node(int(id))
			n.Kill()
			down = append(down, n)
		}
	}
	for by := time.Now().Add(90 * time.Second); len(partition().ISR) > 1; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(by) {
			t.Fatalf("ISR still %v 90 s after nodes %d and %d were killed", partition().ISR, down[0].ID, down[1].ID)
		}
	}
	// Refused whichever node is the active controller: a controller-only
	// node without min.insync.replicas let the leader take this write (two
	// CI rehearsals, node 4 active; kafkanode.Cluster.ServerProps).
	err = produce("two-down", 20*time.Second)
	if !errors.Is(err, kerr.NotEnoughReplicas) && !errors.Is(err, kerr.NotEnoughReplicasAfterAppend) {
		t.Fatalf("produce with nodes %d and %d down (partition %+v): %v, want NOT_ENOUGH_REPLICAS", down[0].ID, down[1].ID, partition(), err)
	}
	if err := k.Apache.Restart(ctx, down[0]); err != nil {
		t.Fatal(err)
	}
	if err := produce("back", 60*time.Second); err != nil {
		t.Fatalf("produce after node %d returned: %v", down[0].ID, err)
	}
	var got []string
	for _, r := range k.ReadAll(t, topic) {
		got = append(got, string(r.Value))
	}
	if strings.Join(got, ",") != "back" {
		t.Fatalf("records %v, want back alone (the refused write must not be there)", got)
	}
}
