package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// DefaultOwnerWait is Config.OwnerWait's default.
const DefaultOwnerWait = 2 * time.Minute

// redriveParked is `redrive --parked`: the run asks the owner of each
// parked report to post it instead of posting it itself, so that a parked
// report has one poster whatever runs at the same time (the reporter's
// slow lane, a main lane, another redrive). For each report it writes a
// schemas.RedriveRequest to <prefix>.parked; the reporter that owns the
// report's partition posts it at once (its Delivery record carrying this
// run's replay id and reason) and then removes the request. The run waits
// until every request is removed or Config.OwnerWait passes, and counts
// the outcomes from <prefix>.deliveries. An interrupted run leaves its
// requests: each is still served once; a re-run of the id asks again for
// the reports not final.
func redriveParked(ctx context.Context, cfg *Config, w waits, opts []kgo.Opt, adm *kadm.Client, items []item, res *Result) error {
	topics := cfg.Kafka.Topics()
	var parts int32
	err := w.do(ctx, "describing "+topics.Parked, func(ctx context.Context) error {
		tds, err := adm.ListTopics(ctx, topics.Parked)
		if err == nil {
			err = tds.Error()
		}
		if err == nil {
			parts = int32(len(tds[topics.Parked].Partitions))
			if parts == 0 {
				err = fmt.Errorf("topic %s has no partitions", topics.Parked)
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("replay: redrive parked reports: %w", err)
	}
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return fmt.Errorf("replay: redrive parked reports: kafka client: %w", err)
	}
	defer kafkax.CloseClient(cl, 0)
	start := time.Now()
	recs := make([]*kgo.Record, len(items))
	for i, it := range items {
		v, _ := json.Marshal(schemas.RedriveRequest{V: 1, ReportID: it.reportID, Partition: it.partition,
			ReplayID: cfg.ReplayID, Reason: cfg.Reason, At: start.UnixMilli()}) // plain fields: cannot fail
		recs[i] = &kgo.Record{Topic: topics.Parked, Partition: kafkax.ParkedPartition(it.partition, parts),
			Key: []byte(schemas.RedriveKeyPrefix + it.reportID), Value: v}
	}
	err = w.do(ctx, "writing the redrive requests to "+topics.Parked, func(ctx context.Context) error {
		return cl.ProduceSync(ctx, recs...).FirstErr()
	})
	if err != nil {
		return fmt.Errorf("replay: redrive parked reports: write the requests: %w", err)
	}
	cfg.Logger.Info("redrive requests written: waiting for the reporter that owns each report to post it",
		"replay_id", cfg.ReplayID, "requests", len(recs), "owner_wait", cfg.OwnerWait)
	waiting := make(map[string]int64, len(recs)) // request key → its offset
	from := map[int32]int64{}
	for _, r := range recs {
		waiting[string(r.Key)] = r.Offset
		if o, ok := from[r.Partition]; !ok || r.Offset < o {
			from[r.Partition] = r.Offset
		}
	}
	waitErr := awaitAnswers(ctx, cfg, opts, topics.Parked, from, waiting)
	res.Queued = len(waiting)
	// The outcomes of this run's posts, from the deliveries log (clocks
	// of the reporter's host may lag this one's: a minute of margin).
	outs, err := outcomes(ctx, w, opts, adm, topics.Deliveries, cfg.ReplayID, start.Add(-time.Minute).UnixMilli())
	if err != nil {
		return err
	}
	for _, it := range items {
		o, posted := outs[it.reportID]
		res.Posts += o.posts
		_, queued := waiting[schemas.RedriveKeyPrefix+it.reportID]
		switch {
		case o.last == schemas.OutcomeDelivered:
			res.Delivered++
		case o.last == schemas.OutcomeRejected:
			res.Rejected++
		case queued:
		case posted:
			res.Unfinished++ // posted, not final: still parked
		default:
			res.AlreadyDone++ // not parked any more when its owner read the request
		}
	}
	var problems []string
	if res.Unfinished > 0 {
		problems = append(problems, fmt.Sprintf("%d reports posted without a final answer: still parked (the reporter retries them on its slow schedule)", res.Unfinished))
	}
	if res.Queued > 0 {
		why := fmt.Sprintf("no reporter owning their partitions answered within --owner-wait %v", cfg.OwnerWait)
		if waitErr != nil {
			why = waitErr.Error()
		}
		problems = append(problems, fmt.Sprintf("%d requests not answered yet (%s): they stay queued and the reporter serves each once; run again with --replay-id %s to wait for them",
			res.Queued, why, cfg.ReplayID))
	}
	if len(problems) > 0 {
		return fmt.Errorf("replay: %s", strings.Join(problems, "; "))
	}
	return nil
}

// awaitAnswers reads <prefix>.parked from the offsets in from until every
// request in waiting (key → its offset) is removed by a later tombstone
// (deleting it from waiting), ctx ends or cfg.OwnerWait passes.
func awaitAnswers(ctx context.Context, cfg *Config, opts []kgo.Opt, topic string, from map[int32]int64, waiting map[string]int64) error {
	start := map[int32]kgo.Offset{}
	for pp, o := range from {
		start[pp] = kgo.NewOffset().At(o)
	}
	cl, err := kgo.NewClient(append(opts, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: start}),
		kgo.FetchMaxWait(500*time.Millisecond))...)
	if err != nil {
		return fmt.Errorf("replay: read %s: %w", topic, err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, cfg.OwnerWait)
	defer cancel()
	for len(waiting) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		fs.EachRecord(func(r *kgo.Record) {
			if o, ok := waiting[string(r.Key)]; ok && len(r.Value) == 0 && r.Offset > o {
				delete(waiting, string(r.Key))
			}
		})
	}
	return nil
}

// outcome is what a run's records say of one report: its posts and the
// outcome of the last.
type outcome struct {
	posts int
	last  string
}

// outcomes reads the records of replayID in the deliveries log since
// startMS, by report id.
func outcomes(ctx context.Context, w waits, opts []kgo.Opt, adm *kadm.Client, topic, replayID string, startMS int64) (map[string]outcome, error) {
	out := map[string]outcome{}
	err := readRun(ctx, w, opts, adm, topic, replayID, startMS, func(d *schemas.Delivery) {
		o := out[d.ReportID]
		o.posts++
		if o.last != schemas.OutcomeDelivered && o.last != schemas.OutcomeRejected {
			o.last = d.Outcome
		}
		out[d.ReportID] = o
	})
	return out, err
}
