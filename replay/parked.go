package replay

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// settled notes that it got a final answer (redrive --parked: unpark).
func (r *runner) settled(it item) {
	if !r.parked {
		return
	}
	r.parkMu.Lock()
	r.final = append(r.final, it)
	r.parkMu.Unlock()
}

// finals returns the reports settled so far.
func (r *runner) finals() []item {
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	return append([]item(nil), r.final...)
}

// unpark removes the parked entries of items from the parked topic (a
// tombstone each, in the partition of the report's partition, as the
// reporter writes them): the live reporter, which reads the topic before
// each round of slow retries, retries them no more. A report that the
// reporter was posting at that very moment may still be posted once more
// by it (docs/replay.md, "Redriving parked reports").
func unpark(ctx context.Context, w waits, opts []kgo.Opt, adm *kadm.Client, topic string, items []item) error {
	if len(items) == 0 {
		return nil
	}
	var parts int32
	err := w.do(ctx, "describing "+topic, func(ctx context.Context) error {
		tds, err := adm.ListTopics(ctx, topic)
		if err == nil {
			err = tds.Error()
		}
		if err == nil {
			parts = int32(len(tds[topic].Partitions))
			if parts == 0 {
				err = fmt.Errorf("topic %s has no partitions", topic)
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("replay: unpark: %w", err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return fmt.Errorf("replay: unpark: kafka client: %w", err)
	}
	defer cl.Close()
	recs := make([]*kgo.Record, len(items))
	for i, it := range items {
		recs[i] = &kgo.Record{Topic: topic, Partition: it.partition % parts, Key: []byte(it.reportID)}
	}
	return w.do(ctx, "removing the parked entries of the reports made final", func(ctx context.Context) error {
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("replay: unpark: %w", err)
		}
		return nil
	})
}
