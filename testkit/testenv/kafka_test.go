package testenv

import (
	"context"
	"fmt"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestReadAllToTheEnd: ReadAll returns every committed record of every
// partition and nothing of an aborted transaction, also when a partition's
// last entry is an abort marker; ReadAllUncommitted also returns the aborted
// records. Neither returns the markers themselves.
func TestReadAllToTheEnd(t *testing.T) {
	k := StartKafka(t, 3)
	topic := k.Config.Topics().Rejected
	cl := k.Client(t, kgo.TransactionalID("testenv-readall"), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	ctx := context.Background()
	txn := func(commit bool, tag string, perPartition int) {
		t.Helper()
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for p := int32(0); p < 3; p++ {
			for i := range perPartition {
				cl.Produce(ctx, &kgo.Record{Partition: p, Value: fmt.Appendf(nil, "%s-%d-%d", tag, p, i)}, nil)
			}
		}
		if err := cl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
			t.Fatal(err)
		}
	}
	txn(true, "a", 40)
	txn(false, "b", 5)
	txn(true, "c", 7)
	txn(false, "d", 3) // the last entry of every partition is an abort marker

	got := map[string]int{}
	for _, r := range k.ReadAll(t, topic) {
		got[string(r.Value[:1])]++
	}
	if want := map[string]int{"a": 120, "c": 21}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("committed read: %v, want %v", got, want)
	}
	got = map[string]int{}
	for _, r := range k.ReadAllUncommitted(t, topic) {
		got[string(r.Value[:1])]++
	}
	if want := map[string]int{"a": 120, "b": 15, "c": 21, "d": 9}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("uncommitted read: %v, want %v", got, want)
	}
}
