package reporter

import (
	"container/heap"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// slowLane holds the parked reports of the partitions this run owns and
// retries them, one at a time, when they are due (park.go). Its own lock
// (a leaf): the coordinator and the workers never wait on a slow retry.
type slowLane struct {
	mu    sync.Mutex
	due   parkedHeap
	byID  map[string]*parkedItem
	wake  chan struct{} // capacity 1
	count int64         // parked reports held (the gauge)
	// readTo is, per partition of <prefix>.parked, where the lane has read
	// it up to; caughtUp when it last read others' records (catchUp).
	readTo   map[int32]int64
	caughtUp time.Time
}

// parkedItem is one parked report in the slow lane.
type parkedItem struct {
	ps *partState
	e  *schemas.Parked
	// carried is a doubt cause to put on the next Delivery record (a
	// previous owner stopped mid-retry: schemas.DoubtCrash).
	carried string
	i       int // heap index
}

type parkedHeap []*parkedItem

func (h parkedHeap) Len() int           { return len(h) }
func (h parkedHeap) Less(i, j int) bool { return h[i].e.Due < h[j].e.Due }
func (h parkedHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i]; h[i].i = i; h[j].i = j }
func (h *parkedHeap) Push(x any)        { it := x.(*parkedItem); it.i = len(*h); *h = append(*h, it) }
func (h *parkedHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	it.i = -1
	return it
}

func newSlowLane() *slowLane {
	return &slowLane{byID: map[string]*parkedItem{}, wake: make(chan struct{}, 1)}
}

// add holds e, a parked report of partition ps, for its slow retries (a
// later entry of the same report replaces the earlier one).
func (s *slowLane) add(ps *partState, e *schemas.Parked) { s.addItem(&parkedItem{ps: ps, e: e}) }

func (s *slowLane) addItem(it *parkedItem) {
	s.mu.Lock()
	if old := s.byID[it.e.ReportID]; old != nil && old.i >= 0 {
		heap.Remove(&s.due, old.i)
	}
	s.byID[it.e.ReportID] = it
	heap.Push(&s.due, it)
	s.count = int64(len(s.byID))
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// forget drops what the lane holds of partition ps (revoked): its next
// owner reads the partition's parked reports from <prefix>.parked.
func (s *slowLane) forget(ps *partState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, it := range s.byID {
		if it.ps == ps {
			if it.i >= 0 {
				heap.Remove(&s.due, it.i)
			}
			delete(s.byID, id)
		}
	}
	s.count = int64(len(s.byID))
}

// take pops the first parked report due at now, or returns when the next
// one is due (zero: none held).
func (s *slowLane) take(now time.Time) (*parkedItem, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.due) == 0 {
		return nil, time.Time{}
	}
	if at := time.UnixMilli(s.due[0].e.Due); at.After(now) {
		return nil, at
	}
	return heap.Pop(&s.due).(*parkedItem), time.Time{}
}

// peek reports whether a parked report is due at now.
func (s *slowLane) peek(now time.Time) (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.due) == 0 {
		return false, time.Time{}
	}
	at := time.UnixMilli(s.due[0].e.Due)
	return !at.After(now), at
}

// done forgets it (delivered, rejected, its partition gone).
func (s *slowLane) done(it *parkedItem) {
	s.mu.Lock()
	if s.byID[it.e.ReportID] == it {
		delete(s.byID, it.e.ReportID)
	}
	s.count = int64(len(s.byID))
	s.mu.Unlock()
}

// stats returns how many parked reports the lane holds.
func (s *slowLane) stats() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// slowRetries runs the slow lane until the run ends (a goroutine of serve).
func (rn *run) slowRetries() {
	clk := rn.cfg.Clock
	timer := clk.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if rn.stopping.Load() {
			return
		}
		if it, _ := rn.slow.peek(rn.cfg.Now()); it {
			rn.catchUp(rn.postCtx) // an operator's redrive may have settled some
		}
		it, next := rn.slow.take(rn.cfg.Now())
		if it != nil {
			rn.slowRetry(it)
			continue
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(rn.cfg.Now()), time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-timer.C():
		case <-rn.slow.wake:
			timer.Stop()
		case <-rn.coordDone:
			return
		}
	}
}

// owned reports whether ps is still this run's and not on its way out.
func (rn *run) owned(ps *partState) bool {
	return rn.part(ps.key) == ps && !ps.revoking.Load() && !ps.dropped.Load()
}

// slowRetry posts one parked report once (the slow lane's; no lock held).
func (rn *run) slowRetry(it *parkedItem) {
	e := it.e
	if !rn.owned(it.ps) {
		rn.slow.done(it)
		return
	}
	later := func(d time.Duration) {
		e.Due = rn.cfg.Now().Add(d).UnixMilli()
		rn.slow.addItem(it)
	}
	rn.mu.Lock()
	standby := rn.standby != nil
	rn.mu.Unlock()
	if standby {
		later(rn.cfg.ProbeInterval * 4) // the dispatch is held: so is the lane
		return
	}
	ctx, cancel := context.WithTimeout(rn.postCtx, rn.cfg.ShutdownTimeout)
	defer cancel()
	// 1. The entry says a post is about to start: a reader that finds it so
	// (this process died mid-retry) posts again labelled in doubt.
	e.Posting = true
	if err := rn.cl.ProduceSync(ctx, rn.parkRecord(e.ReportID, e.Source.Partition, e)).FirstErr(); err != nil {
		e.Posting = false
		rn.log.Warn("slow retry of a parked report postponed: its entry could not be written", "report_id", e.ReportID, "err", err)
		later(time.Minute)
		return
	}
	// From here to the entry's next state, the next owner must read this
	// retry's answer: progress snapshots keep the log position before it.
	hold(it.ps, true)
	defer hold(it.ps, false)
	// 2. One post, classified like any other.
	j := &job{ps: it.ps, rec: &kgo.Record{Topic: e.Source.Topic, Partition: e.Source.Partition, Offset: e.Source.Offset},
		id: e.ReportID, evID: e.EventID, body: e.Report, attempt: e.Attempts, inDoubt: e.InDoubt, carried: it.carried}
	var rec *kgo.Record
	for range 2 { // a 401 renews the session: once more at once
		rec = rn.post(j)
		if j.dec.Action != ActRetry || !j.dec.Renew || rec == nil {
			break
		}
		rn.slowPublish(ctx, it.ps, rec)
		j.carried = ""
	}
	it.carried = ""
	if j.dec.Doubt != "" {
		j.inDoubt = true
	}
	d := j.dec
	e.Attempts, e.InDoubt = j.attempt, j.inDoubt
	switch {
	case d.Action == ActAbandon || rec == nil:
		// Shutdown: the entry keeps Posting (the post may have left), and the
		// next owner posts again labelled in doubt.
		rn.slow.done(it)
		return
	case d.Action == ActStop:
		rn.slow.done(it)
		rn.stop(rn.configError(j, d), true)
		return
	case d.Action.Final():
		// 3. The answer on record, then the entry gone.
		if err := rn.slowPublish(ctx, it.ps, rec); err != nil {
			rn.slow.done(it)
			return
		}
		if err := rn.cl.ProduceSync(ctx, rn.parkRecord(e.ReportID, e.Source.Partition, nil)).FirstErr(); err != nil {
			rn.log.Warn("parked report final, its entry not removed: its next owner posts it again, labelled in doubt", "report_id", e.ReportID, "err", err)
		}
		rn.slow.done(it)
		rn.met.unparked(context.Background(), d.Outcome)
		rn.log.Info("parked report final", "report_id", e.ReportID, "outcome", d.Outcome, "attempts", j.attempt, "in_doubt", j.inDoubt)
		rn.idMu.Lock()
		rn.recent.add(e.ReportID)
		rn.idMu.Unlock()
		return
	}
	// Not final (a transient failure, or standby): the answer on record as
	// parked, then the entry's next state, due on the slow schedule.
	if d.Action == ActRetry {
		asParked(rec)
		e.Stage++
	}
	e.Status, e.Reason, e.Message = d.Status, d.Reason, d.Message
	if e.Message == "" && d.Err != nil {
		e.Message = d.Err.Error()
	}
	if err := rn.slowPublish(ctx, it.ps, rec); err != nil {
		rn.slow.done(it)
		return
	}
	e.Posting = false
	e.Due = rn.cfg.Now().Add(rn.cfg.ParkRetries[min(e.Stage, len(rn.cfg.ParkRetries)-1)]).UnixMilli()
	if err := rn.cl.ProduceSync(ctx, rn.parkRecord(e.ReportID, e.Source.Partition, e)).FirstErr(); err != nil {
		rn.log.Warn("parked report's next state not written: its next owner posts it again, labelled in doubt", "report_id", e.ReportID, "err", err)
		e.InDoubt = true
	}
	rn.slow.addItem(it)
}

// hold sets or clears ps's slowHold at its log position now.
func hold(ps *partState, on bool) {
	ps.mu.Lock()
	if on {
		ps.slowHold = max(ps.logEnd, 1)
	} else {
		ps.slowHold = 0
		ps.dirty = true
	}
	ps.mu.Unlock()
}

// slowPublish publishes the Delivery record of a slow retry and waits for
// it; an error stops the run (the answer is not on record).
func (rn *run) slowPublish(ctx context.Context, ps *partState, rec *kgo.Record) error {
	res := rn.cl.ProduceSync(ctx, rec)
	r, err := res.First()
	if err != nil {
		if !errors.Is(err, kgo.ErrClientClosed) && !errors.Is(err, context.Canceled) {
			rn.stop(fmt.Errorf("reporter: publish delivery record of a parked report: %w", err), false)
		}
		return err
	}
	ps.mu.Lock()
	ps.noteLog(r)
	ps.mu.Unlock()
	return nil
}

// recoverParked reads the parked reports of the partitions first seen by
// this run from <prefix>.parked (recoverNew, before anything of them is
// leased) and returns them by reports partition. An entry whose offset the
// recovered progress does not settle (below the commit point or final) is
// an orphan — its writer died before the parked Delivery record — and is
// removed: the report is posted from <prefix>.reports again.
func (rn *run) recoverParked(ctx context.Context, parts []int32, got *recovered) (map[int32][]*parkedItem, error) {
	want := map[int32]bool{}
	from := map[int32]int64{}
	for _, p := range parts {
		want[p] = true
		from[rn.parkedPart(p)] = 0
	}
	latest := map[string]*schemas.Parked{}
	ends, err := rn.readParked(ctx, from, func(r *kgo.Record) {
		if len(r.Value) == 0 {
			delete(latest, string(r.Key))
			return
		}
		var e schemas.Parked
		if err := json.Unmarshal(r.Value, &e); err != nil || e.ReportID == "" {
			rn.log.Warn("unreadable parked entry", "partition", r.Partition, "offset", r.Offset, "err", err)
			return
		}
		if want[e.Source.Partition] {
			latest[e.ReportID] = &e
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
	for id, e := range latest {
		p, o := e.Source.Partition, e.Source.Offset
		if final[id] {
			// Its final answer is on record (a slow retry's, its owner gone
			// before the tombstone): never posted again.
			if err := rn.cl.ProduceSync(ctx, rn.parkRecord(id, p, nil)).FirstErr(); err != nil {
				return nil, fmt.Errorf("remove the parked entry of final report %s: %w", id, err)
			}
			continue
		}
		base, committed := got.base[p]
		if !(committed && o < base) && got.state[p][o] != recFinal {
			rn.log.Warn("parked entry without its parked record (its writer stopped in between): removed; the report is posted from its topic again",
				"report_id", id, "partition", p, "offset", o)
			if err := rn.cl.ProduceSync(ctx, rn.parkRecord(id, p, nil)).FirstErr(); err != nil {
				return nil, fmt.Errorf("remove orphan parked entry %s: %w", id, err)
			}
			continue
		}
		it := &parkedItem{e: e}
		if e.Posting {
			// Its last owner stopped mid-retry: the post may have reached the
			// partner unrecorded.
			e.InDoubt, it.carried = true, schemas.DoubtCrash
		}
		out[p] = append(out[p], it)
	}
	return out, nil
}

// readParked reads the partitions of <prefix>.parked in from, each from its
// offset to its end now, and returns those ends.
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
	base, err := rn.cfg.Kafka.ClientOpts()
	if err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(append(base,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{rn.topics.Parked: start}),
		kgo.FetchMaxWait(200*time.Millisecond),
	)...)
	if err != nil {
		return nil, fmt.Errorf("parked reader: %w", err)
	}
	defer cl.Close()
	next := map[int32]int64{}
	last := time.Now()
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("reading %s: %w", rn.topics.Parked, err)
		}
		for _, fe := range fs.Errors() {
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
		if moved {
			last = time.Now()
		} else if time.Since(last) > 2*time.Second {
			break // compacted away or aborted: nothing more to read
		}
	}
	return ends, nil
}

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
// wrote to <prefix>.parked (redrive --parked's tombstones) before retrying.
const catchUpInterval = 5 * time.Second

// catchUp reads what was written to the parked partitions this lane holds
// reports of since it last read them, and forgets the reports an operator's
// redrive made final (their tombstones). Its own records read back change
// nothing: the lane is their only writer and holds their newest state.
func (rn *run) catchUp(ctx context.Context) {
	s := rn.slow
	s.mu.Lock()
	if time.Since(s.caughtUp) < catchUpInterval {
		s.mu.Unlock()
		return
	}
	from := map[int32]int64{}
	for _, it := range s.byID {
		pp := rn.parkedPart(it.e.Source.Partition)
		from[pp] = s.readTo[pp]
	}
	s.mu.Unlock()
	if len(from) == 0 {
		return
	}
	var gone []string
	ends, err := rn.readParked(ctx, from, func(r *kgo.Record) {
		if len(r.Value) == 0 {
			gone = append(gone, string(r.Key))
		}
	})
	if err != nil {
		rn.log.Warn("reading the parked topic before slow retries failed (retried in a while)", "err", err)
		return
	}
	s.mu.Lock()
	s.caughtUp = time.Now()
	for _, id := range gone {
		if it := s.byID[id]; it != nil {
			if it.i >= 0 {
				heap.Remove(&s.due, it.i)
			}
			delete(s.byID, id)
			rn.log.Info("parked report made final by an operator's redrive: no more slow retries", "report_id", id)
		}
	}
	s.count = int64(len(s.byID))
	s.mu.Unlock()
	rn.slow.readFrom(ends)
}
