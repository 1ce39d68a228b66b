package reporter

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// recoverParked reads the parked reports of the partitions first seen by
// this run from <prefix>.parked (recoverNew, before anything of them is
// leased) and returns them by reports partition. It reads every partition
// of the topic: an entry stays in the partition it was first written to
// when partitions are added (kafkax.ParkedPartition), and a tombstone
// removes only the entry of its own partition. An entry whose offset the
// recovered progress does not settle (below the commit point or final) is
// an orphan — its writer died before the parked Delivery record — and is
// removed: the report is posted from <prefix>.reports again. It keeps no
// body: each entry is read without its report (entryMeta), and the lane
// reads the body back when the report is due (readBack).
func (rn *run) recoverParked(ctx context.Context, parts []int32, got *recovered) (map[int32][]*parkedItem, error) {
	want := map[int32]bool{}
	for _, p := range parts {
		want[p] = true
	}
	from := make(map[int32]int64, rn.parkedParts)
	for pp := range rn.parkedParts {
		from[pp] = 0
	}
	type found struct {
		e   entryMeta
		pp  int32
		off int64
	}
	latest := map[string]*found{}
	reqs := map[string]foundRequest{}
	ends, err := rn.readParked(ctx, from, func(r *kgo.Record) {
		if q, isReq := rn.parseRequest(r); isReq {
			id := strings.TrimPrefix(string(r.Key), schemas.RedriveKeyPrefix)
			switch {
			case q != nil && want[q.Partition]:
				reqs[id] = foundRequest{q, r.Partition}
			case len(r.Value) == 0 && reqs[id].pp == r.Partition:
				delete(reqs, id)
			}
			return
		}
		if len(r.Value) == 0 {
			if it := latest[string(r.Key)]; it != nil && it.pp == r.Partition {
				delete(latest, string(r.Key))
			}
			return
		}
		var e entryMeta
		if err := json.Unmarshal(r.Value, &e); err != nil || e.ReportID == "" {
			rn.log.Warn("unreadable parked entry", "partition", r.Partition, "offset", r.Offset, "err", err)
			return
		}
		if want[e.Source.Partition] {
			latest[e.ReportID] = &found{e, r.Partition, r.Offset}
		}
	})
	if err != nil {
		return nil, err
	}
	rn.slow.readFrom(ends)
	final := make(map[string]bool, len(got.answeredIDs))
	for _, id := range got.answeredIDs {
		final[id] = true
	}
	out := map[int32][]*parkedItem{}
	for id, f := range latest {
		it := &parkedItem{id: id, due: f.e.Due, pp: f.pp, off: f.off, attempts: f.e.Attempts, stage: f.e.Stage, inDoubt: f.e.InDoubt}
		p, o := f.e.Source.Partition, f.e.Source.Offset // p's fence was claimed before the read (recoverFirst)
		if final[id] {
			// Its final answer is on record (a slow retry's, its owner gone
			// before the tombstone): never posted again.
			if _, err := rn.parkWrite(p, rn.parkRecord(it.pp, id, nil)); err != nil {
				return nil, fmt.Errorf("remove the parked entry of final report %s: %w", id, err)
			}
			continue
		}
		base, committed := got.base[p]
		if !(committed && o < base) && got.state[p][o] != recFinal {
			rn.log.Warn("parked entry without its parked record (its writer stopped in between): removed; the report is posted from its topic again",
				"report_id", id, "partition", p, "offset", o)
			if _, err := rn.parkWrite(p, rn.parkRecord(it.pp, id, nil)); err != nil {
				return nil, fmt.Errorf("remove orphan parked entry %s: %w", id, err)
			}
			continue
		}
		switch {
		case f.e.Posting:
			// Its last owner stopped mid-retry: the post may have reached the
			// partner unrecorded.
			it.inDoubt, it.carried = true, schemas.DoubtCrash
		case f.e.Doubt != "":
			// Its last owner's post was cancelled after it left (slowCancelled).
			it.inDoubt, it.carried = true, f.e.Doubt
		}
		if q, ok := reqs[id]; ok {
			// An operator's redrive asks for it: due at once.
			it.redrive, it.rpp = q.q, q.pp
			it.due = rn.cfg.Now().UnixMilli()
			delete(reqs, id)
		}
		out[p] = append(out[p], it)
	}
	for _, f := range reqs {
		rn.unrequest(f, "the report is not parked (final already)")
	}
	return out, nil
}

// readParked reads the partitions of <prefix>.parked in from, each from its
// offset to its end now, and returns those ends. It reads committed records
// only (the fences' transactions: parkfence.go): a partition is read when
// its records below its end are, or when its last stable offset had
// reached the end before a poll that brought nothing (parkedQuiet): what
// is left are transaction markers, never handed out, or records compacted
// away or aborted. A transaction left open holds the read until it ends
// (parkTxnTimeout, or its partition's next claim): past parkedOpenWait it
// fails, and the caller tries again later.
func (rn *run) readParked(ctx context.Context, from map[int32]int64, fn func(*kgo.Record)) (map[int32]int64, error) {
	lo, err := rn.adm.ListEndOffsets(ctx, rn.topics.Parked)
	if err == nil {
		err = lo.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("end offsets of %s: %w", rn.topics.Parked, err)
	}
	ends := map[int32]int64{}
	start := map[int32]kgo.Offset{}
	left := map[int32]int64{}
	for pp, o := range from {
		e, ok := lo.Lookup(rn.topics.Parked, pp)
		if !ok {
			return nil, fmt.Errorf("no end offset for %s partition %d", rn.topics.Parked, pp)
		}
		ends[pp] = e.Offset
		if o < e.Offset {
			start[pp] = kgo.NewOffset().At(o)
			left[pp] = e.Offset
		}
	}
	if len(start) == 0 {
		return ends, nil
	}
	cl, err := rn.parkedReader(start, parkedQuiet/2)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	next := map[int32]int64{}
	var stable map[int32]int64 // last stable offsets, listed after a quiet poll
	// How long the broker has given nothing: real time on purpose, it
	// waits on the broker, not on a timer of the reporter (clock.go).
	last := time.Now()
	for len(left) > 0 {
		pctx, cancel := context.WithTimeout(ctx, parkedQuiet)
		fs := cl.PollFetches(pctx)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", rn.topics.Parked, err)
		}
		for _, fe := range fs.Errors() {
			if errors.Is(fe.Err, context.DeadlineExceeded) {
				continue // a quiet poll
			}
			return nil, fmt.Errorf("reading %s partition %d: %w", fe.Topic, fe.Partition, fe.Err)
		}
		moved := false
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= left[r.Partition] {
				return
			}
			moved = true
			next[r.Partition] = r.Offset + 1
			fn(r)
		})
		for pp, o := range left {
			if next[pp] >= o {
				delete(left, pp)
			}
		}
		if moved || len(left) == 0 {
			last, stable = time.Now(), nil
			continue
		}
		// Quiet: a partition whose last stable offset had reached its end
		// before this quiet poll is read (what is left is transaction
		// markers, or compacted away, or aborted).
		for pp, o := range left {
			if s, ok := stable[pp]; ok && s >= o {
				delete(left, pp)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Since(last) > parkedOpenWait {
			return nil, fmt.Errorf("reading %s: partitions %v held by an open transaction past %s", rn.topics.Parked, slices.Sorted(maps.Keys(left)), parkedOpenWait)
		}
		lso, err := rn.adm.ListCommittedOffsets(ctx, rn.topics.Parked)
		if err == nil {
			err = lso.Error()
		}
		if err != nil {
			return nil, fmt.Errorf("last stable offsets of %s: %w", rn.topics.Parked, err)
		}
		stable = map[int32]int64{}
		lso.Each(func(o kadm.ListedOffset) { stable[o.Partition] = o.Offset })
	}
	return ends, nil
}

// parkedReader is a client reading the partitions of <prefix>.parked in
// start from their offsets, committed records only (the fences'
// transactions: parkfence.go), each fetch waiting at most wait: the one
// reader of readParked and readRange.
func (rn *run) parkedReader(start map[int32]kgo.Offset, wait time.Duration) (*kgo.Client, error) {
	base, err := rn.cfg.Kafka.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(base,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{rn.topics.Parked: start}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(wait),
	)...)
	if err != nil {
		return nil, fmt.Errorf("parked reader: %w", err)
	}
	return cl, nil
}

// parkedQuiet is how long a parked-topic poll waits for records before it
// counts as quiet; parkedOpenWait how long
// it waits on an open transaction (its timeout, parkTxnTimeout, and the
// broker's check for timed-out transactions, every 10 s by default).
const (
	parkedQuiet    = 200 * time.Millisecond
	parkedOpenWait = 2*parkTxnTimeout + 5*time.Second
)

// readFrom notes where the lane has read <prefix>.parked up to.
func (s *slowLane) readFrom(ends map[int32]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.readTo == nil {
		s.readTo = map[int32]int64{}
	}
	for pp, o := range ends {
		s.readTo[pp] = max(s.readTo[pp], o)
	}
}

// catchUpInterval is how often at most the slow lane reads what others
// wrote to <prefix>.parked: redrive requests (redrive.go), and an older
// redrive's tombstones.
const catchUpInterval = 5 * time.Second

// catchUp reads what was written to <prefix>.parked since the lane last
// read it (every partition: a request lies in the partition its redrive
// computed) and applies it: redrive requests (requested), and tombstones of
// entries the lane holds written by others (an older redrive that posted
// itself). Its own records read back change nothing: the lane holds their
// newest state.
func (rn *run) catchUp(ctx context.Context) {
	s := rn.slow
	s.mu.Lock()
	if now := rn.cfg.Now(); !s.caughtUp.IsZero() && now.Sub(s.caughtUp) < catchUpInterval {
		s.mu.Unlock()
		return
	}
	s.caughtUp = rn.cfg.Now()
	from := make(map[int32]int64, rn.parkedParts)
	for pp := range rn.parkedParts {
		from[pp] = s.readTo[pp]
	}
	s.mu.Unlock()
	type gone struct {
		id string
		pp int32
	}
	var (
		tombs []gone
		reqs  []foundRequest
	)
	ends, err := rn.readParked(ctx, from, func(r *kgo.Record) {
		if q, isReq := rn.parseRequest(r); isReq {
			switch {
			case q != nil:
				reqs = append(reqs, foundRequest{q, r.Partition})
			case len(r.Value) == 0:
				s.unpend(strings.TrimPrefix(string(r.Key), schemas.RedriveKeyPrefix))
			}
			return
		}
		if len(r.Value) == 0 {
			tombs = append(tombs, gone{string(r.Key), r.Partition})
		}
	})
	if err != nil {
		rn.log.Warn("reading the parked topic for redrive requests failed (retried in a while)", "err", err)
		return
	}
	s.mu.Lock()
	for _, g := range tombs {
		// Not one a slow retry holds (its own tombstone comes after it is
		// done), nor of another partition.
		if it := s.byID[g.id]; it != nil && it.i >= 0 && it.pp == g.pp {
			heap.Remove(&s.due, it.i)
			delete(s.byID, g.id)
			rn.log.Info("parked report removed by an operator: no more slow retries", "report_id", g.id)
		}
	}
	s.count = int64(len(s.byID))
	s.mu.Unlock()
	s.readFrom(ends)
	rn.requested(reqs)
}
