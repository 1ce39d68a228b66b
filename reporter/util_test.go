package reporter

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

type atomicDuration struct{ v atomic.Int64 }

func (a *atomicDuration) Load() time.Duration   { return time.Duration(a.v.Load()) }
func (a *atomicDuration) Store(d time.Duration) { a.v.Store(int64(d)) }

func waitFor(t testing.TB, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", timeout)
		}
		time.Sleep(20 * time.Millisecond) // polls a condition on the real parts (ledger, Kafka)
	}
}

func cloneRecords(recs []*kgo.Record) []*kgo.Record {
	out := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		out[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value}
	}
	return out
}
