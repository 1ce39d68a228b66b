package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// The slow lane holds no bodies: a parked report's body is in its newest
// entry in <prefix>.parked (compaction keeps it: the newest record of its
// key), and the lane reads it back by offset when the report is due.

// entryMeta is a parked entry without its report body: what recovery
// keeps of each entry it reads (json skips the body without copying it).
type entryMeta struct {
	ReportID string         `json:"report_id"`
	Source   schemas.Source `json:"source"`
	Attempts int            `json:"attempts"`
	Stage    int            `json:"stage"`
	Due      int64          `json:"due"`
	InDoubt  bool           `json:"in_doubt,omitempty"`
	Posting  bool           `json:"posting,omitempty"`
	Doubt    string         `json:"doubt,omitempty"`
}

// newParkedItem is the slow lane's item of the entry e of ps's report,
// written at offset off of partition pp of <prefix>.parked.
func newParkedItem(ps *partState, e *schemas.Parked, pp int32, off int64) *parkedItem {
	it := &parkedItem{ps: ps, id: e.ReportID, pp: pp, off: off}
	it.keep(e)
	return it
}

// keep notes what the lane keeps of e after a slow retry: its due time,
// attempts, stage and doubt (the entry written may lag them: a write of
// its next state can fail).
func (it *parkedItem) keep(e *schemas.Parked) {
	it.due, it.attempts, it.stage, it.inDoubt = e.Due, e.Attempts, e.Stage, e.InDoubt
}

// readBackWait bounds one read-back of due entries; a read that fails or
// runs out puts them back, due again after readBackRetry.
const (
	readBackWait  = 30 * time.Second
	readBackRetry = 5 * time.Second
)

// readBack reads the newest entries of items (slow lane items due, popped
// by take) from <prefix>.parked at their offsets, and returns them with
// what the lane knows better (attempts, stage, doubt, due) applied. An item
// whose entry is gone (removed by a later tombstone: compacted away) is let
// go; on a failed read every item is put back, due again after
// readBackRetry. Never a reason to stop the run.
func (rn *run) readBack(ctx context.Context, items []*parkedItem) map[*parkedItem]*schemas.Parked {
	at := map[int32]map[int64]*parkedItem{}
	from := map[int32]int64{}
	until := map[int32]int64{}
	for _, it := range items {
		if at[it.pp] == nil {
			at[it.pp] = map[int64]*parkedItem{}
			from[it.pp] = it.off
		}
		at[it.pp][it.off] = it
		from[it.pp] = min(from[it.pp], it.off)
		until[it.pp] = max(until[it.pp], it.off+1)
	}
	out := make(map[*parkedItem]*schemas.Parked, len(items))
	ctx, cancel := context.WithTimeout(ctx, readBackWait)
	defer cancel()
	go func() { // owned by readBack: ends with ctx (cancelled on return)
		select {
		case <-rn.coordDone: // the run ends: no read holds the lane's end up
			cancel()
		case <-ctx.Done():
		}
	}()
	err := rn.readRange(ctx, from, until, func(r *kgo.Record) {
		it := at[r.Partition][r.Offset]
		if it == nil || string(r.Key) != it.id || len(r.Value) == 0 {
			return
		}
		var e schemas.Parked
		if err := json.Unmarshal(r.Value, &e); err != nil {
			rn.log.Warn("unreadable parked entry read back", "report_id", it.id, "partition", r.Partition, "offset", r.Offset, "err", err)
			return
		}
		e.Due, e.Attempts, e.Stage, e.InDoubt = it.due, max(e.Attempts, it.attempts), max(e.Stage, it.stage), e.InDoubt || it.inDoubt
		out[it] = &e
	})
	if err != nil {
		select {
		case <-rn.coordDone: // the run ends: nothing to say
		default:
			rn.log.Warn("parked reports' entries could not be read back: due again in a while", "reports", len(items), "err", err)
		}
		for _, it := range items {
			rn.slowAgain(it, readBackRetry, false)
		}
		return nil
	}
	for _, it := range items {
		if out[it] == nil {
			rn.log.Warn("parked report's entry not found where it was written (removed meanwhile): no more slow retries", "report_id", it.id, "partition", it.pp, "offset", it.off)
			rn.slow.done(it)
		}
	}
	return out
}

// readRange reads each partition pp of <prefix>.parked in from, from its
// offset up to until[pp] (exclusive), and hands every record to fn.
func (rn *run) readRange(ctx context.Context, from, until map[int32]int64, fn func(*kgo.Record)) error {
	start := make(map[int32]kgo.Offset, len(from))
	for pp, o := range from {
		start[pp] = kgo.NewOffset().At(o)
	}
	cl, err := rn.parkedReader(start, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer cl.Close()
	left := make(map[int32]int64, len(until))
	for pp, o := range until {
		left[pp] = o
	}
	// How long the broker has given nothing: real time on purpose, it
	// waits on the broker, not on a timer of the reporter (clock.go).
	last := time.Now()
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("reading %s back: %w", rn.topics.Parked, err)
		}
		for _, fe := range fs.Errors() {
			return fmt.Errorf("reading %s partition %d back: %w", fe.Topic, fe.Partition, fe.Err)
		}
		moved := false
		fs.EachRecord(func(r *kgo.Record) {
			end, ok := left[r.Partition]
			if !ok {
				return
			}
			moved = true
			if r.Offset < end {
				fn(r)
			}
			if r.Offset+1 >= end {
				delete(left, r.Partition)
			}
		})
		if moved {
			last = time.Now()
		} else if time.Since(last) > 2*time.Second {
			break // compacted away: nothing more to read
		}
	}
	return nil
}
