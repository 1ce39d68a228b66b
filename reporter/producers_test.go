package reporter

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Every record of one partition goes through one client (its order in the
// log is the order it was produced), and the partitions spread over all the
// clients.
func TestProducerOfKeepsEachPartitionOnOneClient(t *testing.T) {
	rn := &run{prod: []*kgo.Client{new(kgo.Client), new(kgo.Client), new(kgo.Client)}}
	first := map[int32]*kgo.Client{}
	used := map[*kgo.Client]int{}
	for round := range 3 {
		for p := range int32(12) {
			cl := rn.producerOf(p)
			if round == 0 {
				first[p] = cl
				used[cl]++
			} else if cl != first[p] {
				t.Fatalf("partition %d went through two clients", p)
			}
		}
	}
	if len(used) != len(rn.prod) {
		t.Fatalf("12 partitions used %d of %d clients", len(used), len(rn.prod))
	}
	for cl, n := range used {
		if n != 4 {
			t.Fatalf("a client got %d of 12 partitions, want 4 (%p)", n, cl)
		}
	}
}
