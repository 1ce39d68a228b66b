package replay

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// metaPrefix starts the offset-commit metadata of a run's group:
// "pp-replay1:<start ms>:<state>[:crash]". The state is running (a run is
// posting, or was killed while it was), stopped (a run ended early, every
// post it made on record) or done; ":crash" marks an id one run of which
// ended while running: a post of it may be at the partner without a
// record.
const metaPrefix = "pp-replay1:"

// Run states in the metadata.
const (
	stateRunning = "running"
	stateStopped = "stopped"
	stateDone    = "done"
)

// prior is what the earlier runs of an id recorded.
type prior struct {
	startMS int64
	found   bool
	// crashed: an earlier run ended while posting (killed, or Kafka failed
	// it): a report it may have posted has no record.
	crashed bool
}

// runStart returns what the earlier runs of this id recorded.
func runStart(ctx context.Context, adm *kadm.Client, group, topic string) (prior, error) {
	var pr prior
	resp, err := adm.FetchOffsets(ctx, group)
	if errors.Is(err, kerr.GroupIDNotFound) {
		return pr, nil // a first run
	}
	if err != nil {
		return pr, fmt.Errorf("replay: read the progress of %s: %w", group, err)
	}
	resp.Each(func(o kadm.OffsetResponse) {
		if o.Err != nil || o.Topic != topic || !strings.HasPrefix(o.Metadata, metaPrefix) {
			return
		}
		f := strings.Split(strings.TrimPrefix(o.Metadata, metaPrefix), ":")
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return
		}
		if !pr.found || v < pr.startMS {
			pr.startMS, pr.found = v, true
		}
		// An older version wrote running/done only: running is a crash.
		pr.crashed = pr.crashed || len(f) < 2 || f[1] == stateRunning || (len(f) > 2 && f[2] == "crash")
	})
	return pr, nil
}

// commitRanges records the run in its own group: each partition's range
// start (end when done), with the run's start time, its state and whether
// an earlier run of the id crashed in the metadata.
func commitRanges(ctx context.Context, adm *kadm.Client, group, topic string, ranges map[int32][2]int64, startMS int64, state string, crashed bool) error {
	meta := metaPrefix + strconv.FormatInt(startMS, 10) + ":" + state
	if crashed {
		meta += ":crash"
	}
	var os kadm.Offsets
	for p, rg := range ranges {
		at := rg[0]
		if state == stateDone {
			at = rg[1]
		}
		os.Add(kadm.Offset{Topic: topic, Partition: p, At: at, LeaderEpoch: -1, Metadata: meta})
	}
	resp, err := adm.CommitOffsets(ctx, group, os)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return fmt.Errorf("replay: record the run in group %s: %w", group, err)
	}
	return nil
}

// offsetRanges returns, per partition of the reports topic, the offsets
// [start, end) holding the selected records: ListOffsets by the records'
// timestamps, widened to the ledger's offsets.
func offsetRanges(ctx context.Context, adm *kadm.Client, topic string, items []item) (map[int32][2]int64, error) {
	minT, maxT := items[0].timeMS, items[0].timeMS
	type span struct{ lo, hi int64 }
	parts := map[int32]*span{}
	for _, it := range items {
		minT, maxT = min(minT, it.timeMS), max(maxT, it.timeMS)
		s := parts[it.partition]
		if s == nil {
			parts[it.partition] = &span{it.offset, it.offset}
			continue
		}
		s.lo, s.hi = min(s.lo, it.offset), max(s.hi, it.offset)
	}
	lo, err := adm.ListOffsetsAfterMilli(ctx, minT, topic)
	if err == nil {
		err = lo.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list offsets of %s at %d: %w", topic, minT, err)
	}
	hi, err := adm.ListOffsetsAfterMilli(ctx, maxT+1, topic)
	if err == nil {
		err = hi.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("replay: list offsets of %s at %d: %w", topic, maxT+1, err)
	}
	out := map[int32][2]int64{}
	for p, s := range parts {
		start, end := s.lo, s.hi+1
		if o, ok := lo.Lookup(topic, p); ok && o.Offset >= 0 {
			start = min(start, o.Offset)
		}
		if o, ok := hi.Lookup(topic, p); ok && o.Offset >= 0 {
			end = max(end, o.Offset)
		}
		out[p] = [2]int64{start, end}
	}
	return out, nil
}

// readRanges reads the records of topic in ranges (read_committed) and
// calls fn for each: kafkax.ReadRanges, the one reader of a log up to the
// end offsets the broker lists at the start, which the reporter's recovery
// uses too. Silence is never the end: a broker that answers nothing for
// the run's --kafka-timeout ends the read with a *KafkaTimeoutError.
func readRanges(ctx context.Context, w waits, opts []kgo.Opt, topic string, ranges map[int32][2]int64, fn func(*kgo.Record) error) error {
	return kafkax.ReadRanges(ctx, w.kafka(), opts, topic, ranges, fn)
}

// alreadyDone returns the report ids replayID already got a final answer
// for, read from the deliveries log since the run's start.
func alreadyDone(ctx context.Context, w waits, opts []kgo.Opt, adm *kadm.Client, topic, replayID string, startMS int64) (map[string]bool, error) {
	done := map[string]bool{}
	err := readRun(ctx, w, opts, adm, topic, replayID, startMS, func(d *schemas.Delivery) {
		if d.Outcome == schemas.OutcomeDelivered || d.Outcome == schemas.OutcomeRejected {
			done[d.ReportID] = true
		}
	})
	return done, err
}

// readRun calls fn for each Delivery record of replayID in the deliveries
// log (topic) since startMS, in log order per partition.
func readRun(ctx context.Context, w waits, opts []kgo.Opt, adm *kadm.Client, topic, replayID string, startMS int64, fn func(*schemas.Delivery)) error {
	var from, ends kadm.ListedOffsets
	err := w.do(ctx, "listing the offsets of "+topic, func(ctx context.Context) (err error) {
		from, err = adm.ListOffsetsAfterMilli(ctx, startMS, topic)
		if err == nil {
			err = from.Error()
		}
		if err != nil {
			return fmt.Errorf("replay: list offsets of %s: %w", topic, err)
		}
		ends, err = adm.ListEndOffsets(ctx, topic)
		if err == nil {
			err = ends.Error()
		}
		if err != nil {
			return fmt.Errorf("replay: list end offsets of %s: %w", topic, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	ranges := map[int32][2]int64{}
	from.Each(func(o kadm.ListedOffset) {
		if e, ok := ends.Lookup(topic, o.Partition); ok && o.Offset >= 0 && o.Offset < e.Offset {
			ranges[o.Partition] = [2]int64{o.Offset, e.Offset}
		}
	})
	return readRanges(ctx, w, opts, topic, ranges, func(r *kgo.Record) error {
		if kafkax.HasHeader(r, schemas.HeaderLease) {
			return nil
		}
		var d schemas.Delivery
		if schemas.DecodeDelivery(r.Value, &d) == nil && d.ReplayID == replayID {
			fn(&d)
		}
		return nil
	})
}
