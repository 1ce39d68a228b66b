package reporter

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// producerLinger is how long a produce request of the run's records waits
// for more records (see producerOpts).
const producerLinger = 1500 * time.Microsecond

// producerOpts are the produce settings of every client that writes the
// run's records (the group's client and the extra producers).
func (rn *run) producerOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.DefaultProduceTopic(rn.topics.Deliveries),
		// Every record names its deliveries partition: the one of its report's partition.
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		// A linger: the Delivery records and lease markers of 1.5 ms share
		// a produce request. With none, at 30k reports/s nearly every
		// record was a request of its own, and the broker spent 10–11 µs
		// of CPU per report (bench-report: 4.6–5.8 µs with 500 µs). With
		// 500 µs, an Apache Kafka broker still took half its request
		// threads' work per play in the reporter's produce requests (~26
		// records each); 1.5 ms halved them (0.016–0.022 per play against
		// 0.034–0.053) and the broker's CPU per play (9.0–10.7 µs against
		// 10.1–18.3) without a lower rate (docs/performance.md, 2026-11-29).
		// It once cost throughput (1 ms: 61–70 % of the plain client's
		// rate), when the unrecorded answers were capped at Concurrency
		// and the lease room did not follow the markers' round trip; both
		// now grow with the limit and the round trips (dispatch.go, lease.go).
		kgo.ProducerLinger(producerLinger),
		// Small records, many small requests: compression costs more CPU than it saves.
		kgo.ProducerBatchCompression(kgo.NoCompression()),
	}
}

// connectProducers makes the run's Producers-1 clients beside the group's
// (rn.cl, which is rn.prod[0]). They only produce: no group, no fetch.
func (rn *run) connectProducers() error {
	rn.prod = []*kgo.Client{rn.cl}
	if rn.cfg.Producers <= 1 {
		return nil
	}
	base, err := rn.cfg.Kafka.ClientOpts()
	if err != nil {
		return fmt.Errorf("reporter: %w", err)
	}
	opts := append(append(base, rn.producerOpts()...), rn.kgoOpts...)
	for range rn.cfg.Producers - 1 {
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			rn.closeProducers()
			return fmt.Errorf("reporter: kafka producer client: %w", err)
		}
		rn.prod = append(rn.prod, cl)
	}
	return nil
}

// producerOf is the client that writes every record of partition p of any
// topic (a deliveries partition, a parked one): always the same, so the
// partition's records reach its log in the order they were produced.
func (rn *run) producerOf(p int32) *kgo.Client {
	return rn.prod[int(p)%len(rn.prod)]
}

// flushProducers waits until every client has every record produced so far
// acknowledged (or failed), within ctx.
func (rn *run) flushProducers(ctx context.Context) error {
	for _, cl := range rn.prod {
		if err := cl.Flush(ctx); err != nil {
			return err
		}
	}
	return nil
}

// closeProducers closes the extra producers (not rn.cl, the group's, which
// serve closes with its bounded leave): a record still buffered fails with
// kgo.ErrClientClosed.
func (rn *run) closeProducers() {
	for _, cl := range rn.prod[min(1, len(rn.prod)):] {
		cl.Close()
	}
}
