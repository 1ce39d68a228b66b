package reporter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// Recovery: when a partition is first fetched by this run, the reporter
// reads what its previous owner (this instance before a restart, or another
// instance) left: the progress in the committed offset's metadata, then the
// deliveries log from the progress's LogOffset to its end — the lease
// markers and answers written after that commit. Applied in log order:
//
//   - a lease marker names offsets that were about to be posted: in doubt;
//   - an answer with flag "f" makes its offset final (never posted again);
//   - an answer with flag "d" keeps it in doubt, "-" clears the doubt (the
//     post was answered and the answer is on record).
//
// Offsets final at the end are skipped; offsets in doubt are posted again
// with Delivery.InDoubt set, which the audit counts as possibly delivered
// twice. Everything else is posted as usual. A commit without readable
// progress leaves nothing to read: every report past it within the window
// is taken as in doubt (doubtPastCommit), loudly.

// recState is what recovery learnt of one offset.
type recState uint8

const (
	recDoubt recState = iota + 1 // may have reached the partner unrecorded
	recFinal                     // final outcome on record
)

// recoverTimeout bounds one recovery (offset fetch and log read).
const recoverTimeout = 30 * time.Second

// recoverNew creates the state of the partitions first seen in recs, with
// what their previous owner left. An error means the previous state could
// not be read: posting those partitions could repeat final reports, so the
// run stops (and commits nothing more).
func (rn *run) recoverNew(ctx context.Context, recs []*kgo.Record) error {
	rn.recoverMu.Lock()
	defer rn.recoverMu.Unlock()
	// The partitions seen for the first time, and the offset each is first
	// fetched from (its commit point until it has a record).
	first := map[int32]int64{}
	rn.partsMu.Lock()
	for _, r := range recs {
		if rn.parts[tpKey{r.Topic, r.Partition}] != nil {
			continue
		}
		if o, ok := first[r.Partition]; !ok || r.Offset < o {
			first[r.Partition] = r.Offset
		}
	}
	rn.partsMu.Unlock()
	if len(first) == 0 {
		return nil
	}
	return rn.recoverFirst(ctx, first)
}

// fromCommit, as the first offset of a partition to recover, stands for its
// committed offset (recoverAssigned: no record fetched yet).
const fromCommit = -1

// recoverAssigned recovers the partitions just assigned to this run that
// have a committed offset, before any of their records is fetched (the
// group's assigned callback), so that their parked reports are retried even
// while no new report comes. A partition without a commit has no parked
// report yet: it is recovered with its first record (recoverNew). An error
// is logged: the first record tries again.
func (rn *run) recoverAssigned(ctx context.Context, parts []int32) {
	// The group may assign partitions before connect has learnt the topics.
	select {
	case <-rn.described:
	case <-rn.coordDone:
		return
	case <-ctx.Done():
		return
	}
	rn.recoverMu.Lock()
	defer rn.recoverMu.Unlock()
	first := map[int32]int64{}
	for _, p := range parts {
		if rn.part(tpKey{rn.topics.Reports, p}) == nil {
			first[p] = fromCommit
		}
	}
	if len(first) == 0 {
		return
	}
	if err := rn.recoverFirst(ctx, first); err != nil {
		rn.log.Warn("recovering assigned partitions failed: retried when their first record comes", "partitions", parts, "err", err)
	}
}

// untilRecovered runs step until it succeeds or ctx ends (a recovery's
// recoverTimeout), warning and waiting a little longer after each failure:
// a broker that just died or moved a leader fails a read for seconds.
func (rn *run) untilRecovered(ctx context.Context, warn string, parts []int32, step func() error) error {
	for attempt := 1; ; attempt++ {
		err := step()
		if err == nil || ctx.Err() != nil {
			return err
		}
		rn.log.Warn(warn, "partitions", parts, "attempt", attempt, "err", err)
		time.Sleep(min(time.Duration(attempt)*200*time.Millisecond, 2*time.Second)) // waits on the broker: the real clock (clock.go)
	}
}

// recoverFirst recovers the partitions of first (recoverMu held): the
// offset each is first fetched from, or fromCommit.
func (rn *run) recoverFirst(ctx context.Context, first map[int32]int64) error {
	fresh := slices.Sorted(maps.Keys(first))
	ctx, cancel := context.WithTimeout(ctx, recoverTimeout)
	defer cancel()
	start := time.Now() // the recovery's duration for the log: a real-time measurement on purpose
	var (
		got *recovered
		err error
	)
	err = rn.untilRecovered(ctx, "recovering partitions failed, trying again", fresh, func() (err error) {
		got, err = rn.recoverParts(ctx, fresh)
		return err
	})
	if err != nil {
		return fmt.Errorf("reporter: recover partitions %v of %s: %w", fresh, rn.topics.Reports, err)
	}
	for p, o := range first {
		if o != fromCommit {
			continue
		}
		if b, ok := got.base[p]; ok {
			first[p] = b
		} else {
			delete(first, p) // no commit: recovered with its first record
		}
	}
	fresh = slices.Sorted(maps.Keys(first))
	if len(fresh) == 0 {
		return nil
	}
	// A broker just killed can still lead a partition of <prefix>.parked in
	// the client's metadata (CI: ListOffsets "unable to dial" stopped the
	// role): tried again within the same recoverTimeout.
	// Claim the partitions' parked-state fences before reading their
	// parked entries: no write of a previous owner lands after the read.
	var parked map[int32][]*parkedItem
	err = rn.untilRecovered(ctx, "recovering the parked reports failed, trying again", fresh, func() (err error) {
		if err := rn.claimFences(ctx, fresh); err != nil {
			return err
		}
		parked, err = rn.recoverParked(ctx, fresh, got)
		return err
	})
	if err != nil {
		return fmt.Errorf("reporter: recover the parked reports of partitions %v: %w", fresh, err)
	}
	var batch []commitEntry
	rn.idMu.Lock()
	for _, id := range got.finalIDs {
		rn.recent.add(id)
	}
	rn.idMu.Unlock()
	for _, p := range fresh {
		key := tpKey{rn.topics.Reports, p}
		lp := p % rn.logParts
		// The log position of its progress: every record of the partition
		// before it is in the recovered state. With progress, the tail was
		// read up to got.logEnd, past the log's end when the run started;
		// without, no owner wrote a record of the partition (each commits
		// its progress before its first lease, as below), so the log's end
		// when the run started will do (a later one would only shorten a
		// recovery's read).
		ps := &partState{key: key, logPart: lp, unsure: map[*job]struct{}{}, recovered: got.state[p], start: first[p],
			logEnd: max(rn.logStart[lp], got.logEnd[lp])}
		if b, ok := got.base[p]; ok && b < ps.start {
			ps.start = b
		}
		ps.mu.Lock()
		if e, ok := rn.progressOf(ps); ok {
			batch = append(batch, e)
		}
		ps.mu.Unlock()
		rn.partsMu.Lock()
		rn.parts[key] = ps
		rn.partsMu.Unlock()
		for _, it := range parked[p] {
			it.ps = ps
			rn.slow.addItem(it)
		}
		rn.requested(rn.slow.pendingOf(p)) // read by catchUp before the partition was this run's
	}
	// Commit the recovered progress before anything of these partitions is
	// leased: from now on the log position of every later marker and answer
	// is covered by a commit, whenever this process dies.
	for attempt := 1; ; attempt++ {
		failed := rn.commit(ctx, "assign", batch)
		if len(failed) == 0 {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("reporter: commit the progress of new partitions %v: %w", fresh, ctx.Err())
		}
		batch = slices.DeleteFunc(batch, func(e commitEntry) bool { return !slices.Contains(failed, e.ps) })
		time.Sleep(min(time.Duration(attempt)*100*time.Millisecond, time.Second)) // waits on the broker: the real clock
	}
	rn.log.Info("partitions recovered", "partitions", fresh, "with_progress", got.withProgress,
		"final_past_commit", got.final, "in_doubt", got.doubt, "log_records_read", got.read, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// recovered is the outcome of one recovery.
type recovered struct {
	state    map[int32]map[int64]recState
	base     map[int32]int64 // committed offsets
	logEnd   map[int32]int64 // deliveries partitions read, up to here
	finalIDs []string        // report ids final or parked in the log tail (duplicate window)
	// answeredIDs are the report ids with a final answer (delivered or
	// rejected, not parked) in the log tail: their parked entries are done.
	answeredIDs []string

	withProgress, final, doubt, read int
}

// recoverParts reads the progress and log tail of parts.
func (rn *run) recoverParts(ctx context.Context, parts []int32) (*recovered, error) {
	out := &recovered{state: map[int32]map[int64]recState{}, base: map[int32]int64{}, logEnd: map[int32]int64{}}
	offs, err := rn.adm.FetchOffsets(ctx, rn.cfg.Group)
	if err != nil {
		return nil, fmt.Errorf("fetch committed offsets: %w", err)
	}
	progs := map[int32]*progress{}
	blind := map[int32]string{} // committed without readable progress: why
	for _, p := range parts {
		o, ok := offs.Lookup(rn.topics.Reports, p)
		if !ok || o.At < 0 {
			continue // never committed
		}
		if o.Err != nil {
			return nil, fmt.Errorf("committed offset of partition %d: %w", p, o.Err)
		}
		out.base[p] = o.At
		pr, err := decodeProgress(o.Metadata, o.At)
		if err != nil {
			// Committed by another writer (an earlier version, an offset
			// reset) or corrupt: nothing is known past the offset.
			blind[p] = err.Error()
			continue
		}
		progs[p] = pr
		st := make(map[int64]recState, len(pr.Done)+len(pr.Doubt))
		for _, o := range pr.Doubt {
			st[o] = recDoubt
		}
		for _, o := range pr.Done {
			st[o] = recFinal
		}
		out.state[p] = st
	}
	out.withProgress = len(progs)
	if len(blind) > 0 {
		if err := rn.doubtPastCommit(ctx, blind, out); err != nil {
			return nil, err
		}
	}
	if len(progs) > 0 {
		if err := rn.readLogTail(ctx, progs, out); err != nil {
			return nil, err
		}
	}
	for _, st := range out.state {
		for _, s := range st {
			if s == recFinal {
				out.final++
			} else {
				out.doubt++
			}
		}
	}
	return out, nil
}

// doubtPastCommit is the fallback for partitions committed without
// readable progress (why, by partition): the previous owner may have posted
// any report past the committed offset, final or not, and no log position
// says where its records are. Each report it may have had, from the
// committed offset to the partition's end now, within the progress window
// (an owner of this version leases no further past its commit point, and a
// progress holds no more), is recovered in doubt: posted again labelled,
// so the audit over-counts doubles rather than missing one. Loud: a
// warning per partition and the playpipe.reporter.recovery_fallbacks
// metric.
func (rn *run) doubtPastCommit(ctx context.Context, blind map[int32]string, out *recovered) error {
	ends, err := rn.adm.ListEndOffsets(ctx, rn.topics.Reports)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", rn.topics.Reports, err)
	}
	for _, p := range slices.Sorted(maps.Keys(blind)) {
		base := out.base[p]
		end := base
		if e, ok := ends.Lookup(rn.topics.Reports, p); ok {
			end = max(base, min(e.Offset, base+rn.window))
		}
		st := make(map[int64]recState, end-base)
		for o := base; o < end; o++ {
			st[o] = recDoubt
		}
		out.state[p] = st
		rn.met.recoveryFallback(ctx)
		rn.log.Warn("no readable progress in the commit metadata: recovering from the committed offset, the reports past it that the previous owner may have posted labelled in doubt",
			"partition", p, "why", blind[p], "committed", base, "in_doubt_until", end)
	}
	return nil
}

// logWaitTimeout bounds each wait of a recovery's log read on the broker:
// listing the log's offsets, and each record of a range not read yet. Past
// it the read fails with a *kafkax.TimeoutError (and recoverNew tries again
// within recoverTimeout): a broker that is slow or frozen is never taken
// for the end of the log.
const logWaitTimeout = 10 * time.Second

// readLogTail applies the deliveries log from each progress's LogOffset to
// the log's end when the recovery began (kafkax.ReadRanges: the reader
// replay uses too).
func (rn *run) readLogTail(ctx context.Context, progs map[int32]*progress, out *recovered) error {
	starts := map[int32]int64{}
	for _, pr := range progs {
		if s, ok := starts[pr.LogPartition]; !ok || pr.LogOffset < s {
			starts[pr.LogPartition] = pr.LogOffset
		}
	}
	ends, err := rn.adm.ListEndOffsets(ctx, rn.topics.Deliveries)
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return fmt.Errorf("end offsets of %s: %w", rn.topics.Deliveries, err)
	}
	ranges := map[int32][2]int64{} // log partition → [from, end)
	for lp, s := range starts {
		e, ok := ends.Lookup(rn.topics.Deliveries, lp)
		if !ok {
			return fmt.Errorf("no end offset for %s partition %d", rn.topics.Deliveries, lp)
		}
		out.logEnd[lp] = e.Offset
		if s < e.Offset {
			ranges[lp] = [2]int64{s, e.Offset}
		}
	}
	if len(ranges) == 0 {
		return nil
	}
	base, err := rn.cfg.Kafka.ClientOpts()
	if err != nil {
		return err
	}
	w := kafkax.Waits{Timeout: logWaitTimeout, Brokers: rn.cfg.Kafka.Brokers, Role: "reporter"}
	return kafkax.ReadRanges(ctx, w, append(base, kgo.FetchMaxWait(200*time.Millisecond)), rn.topics.Deliveries, ranges, func(r *kgo.Record) error {
		out.read++
		rn.applyLog(r, progs, out)
		return nil
	})
}

// applyLog applies one record of the deliveries log to the recovery.
func (rn *run) applyLog(r *kgo.Record, progs map[int32]*progress, out *recovered) {
	for _, h := range r.Headers {
		switch h.Key {
		case schemas.HeaderLease:
			if string(h.Value) != rn.cfg.Group {
				return
			}
			var l schemas.Lease
			if err := json.Unmarshal(r.Value, &l); err != nil {
				rn.log.Warn("unreadable lease marker in the deliveries log", "partition", r.Partition, "offset", r.Offset, "err", err)
				return
			}
			pr := progs[l.Partition]
			if pr == nil || pr.LogPartition != r.Partition || r.Offset < pr.LogOffset {
				return
			}
			st := out.state[l.Partition]
			for _, rg := range l.Offsets {
				for o := max(rg[0], pr.Base); o <= rg[1]; o++ {
					if st[o] != recFinal {
						st[o] = recDoubt
					}
				}
			}
			return
		case schemas.HeaderSource:
			p, o, flags, ok := parseSource(h.Value)
			if !ok {
				return
			}
			pr := progs[p]
			if pr == nil || pr.LogPartition != r.Partition || r.Offset < pr.LogOffset {
				return
			}
			if o < pr.Base {
				// The answer of a parked report's slow retry (slowlane.go): a
				// final one ("f", not re-parked "fp") settles its entry.
				if bytes.IndexByte(flags, 'f') >= 0 && bytes.IndexByte(flags, 'p') < 0 {
					out.finalIDs = append(out.finalIDs, string(r.Key))
					out.answeredIDs = append(out.answeredIDs, string(r.Key))
				}
				return
			}
			st := out.state[p]
			switch {
			case bytes.IndexByte(flags, 'f') >= 0:
				st[o] = recFinal
				out.finalIDs = append(out.finalIDs, string(r.Key))
				if bytes.IndexByte(flags, 'p') < 0 {
					out.answeredIDs = append(out.answeredIDs, string(r.Key))
				}
			case st[o] == recFinal:
			case bytes.IndexByte(flags, 'd') >= 0:
				st[o] = recDoubt
			default:
				delete(st, o) // answered, on record, not final
			}
			return
		}
	}
}

// parseSource parses a HeaderSource value "<partition>:<offset>:<flags>".
func parseSource(v []byte) (p int32, o int64, flags []byte, ok bool) {
	i := bytes.IndexByte(v, ':')
	if i < 0 {
		return 0, 0, nil, false
	}
	j := bytes.IndexByte(v[i+1:], ':')
	if j < 0 {
		return 0, 0, nil, false
	}
	j += i + 1
	pp, err1 := strconv.ParseInt(string(v[:i]), 10, 32)
	oo, err2 := strconv.ParseInt(string(v[i+1:j]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, nil, false
	}
	return int32(pp), oo, v[j+1:], true
}
