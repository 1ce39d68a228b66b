//go:build !benchstub

package reporter

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// produce hands rec (a Delivery record or a lease marker) to Kafka; cb runs
// once the broker acknowledged it or it failed. The one way records leave
// the reporter (the benchstub build swaps it: produce_benchstub.go).
func (rn *run) produce(rec *kgo.Record, cb func(*kgo.Record, error)) {
	rn.producerOf(rec.Partition).Produce(context.Background(), rec, cb)
}
