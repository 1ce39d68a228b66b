package reporter

import (
	"container/heap"
	"context"
	"errors"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// slowLane holds the parked reports of the partitions this run owns and
// retries them when they are due, up to slowConcurrency at once (park.go).
// Its own lock (a leaf): the coordinator and the workers never wait on a
// slow retry.
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
	// pending are redrive requests for partitions this run did not own when
	// it read them (redrive.go), by report id.
	pending map[string]foundRequest
}

// parkedItem is one parked report in the slow lane: its id, when it is
// due, and where its newest entry is — never its body, read back from
// <prefix>.parked when it is due (readBack), so the lane's memory does not
// grow with the bodies of thousands of parked reports.
type parkedItem struct {
	ps  *partState
	id  string
	due int64 // when its next slow retry is due (Unix ms)
	pp  int32 // the partition of <prefix>.parked its entry is in
	off int64 // the offset of its newest entry there
	// attempts, stage and inDoubt are the entry's as this run knows them:
	// they win over the entry read back (a write of its next state may have
	// failed).
	attempts, stage int
	inDoubt         bool
	// carried is a doubt cause to put on the next Delivery record (a
	// previous owner stopped mid-retry: schemas.DoubtCrash; an answer whose
	// record Kafka failed: schemas.DoubtUnrecorded).
	carried string
	i       int // heap index; -1 while a slow retry holds it
	// redrive is an operator's request to post it now (redrive.go), read
	// from partition rpp of <prefix>.parked; under slowLane.mu.
	redrive *schemas.RedriveRequest
	rpp     int32
}

type parkedHeap []*parkedItem

func (h parkedHeap) Len() int           { return len(h) }
func (h parkedHeap) Less(i, j int) bool { return h[i].due < h[j].due }
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

// addItem holds it for its slow retries (a later entry of the same report
// replaces the earlier one).
func (s *slowLane) addItem(it *parkedItem) {
	s.mu.Lock()
	if old := s.byID[it.id]; old != nil && old.i >= 0 {
		heap.Remove(&s.due, old.i)
	}
	s.byID[it.id] = it
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

// take pops up to n parked reports due at now, first due first, or
// returns when the next one is due (zero: none held).
func (s *slowLane) take(now time.Time, n int) ([]*parkedItem, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*parkedItem
	for len(s.due) > 0 && len(out) < n {
		if at := time.UnixMilli(s.due[0].due); at.After(now) {
			if len(out) == 0 {
				return nil, at
			}
			break
		}
		out = append(out, heap.Pop(&s.due).(*parkedItem))
	}
	return out, time.Time{}
}

// done forgets it (delivered, rejected, its partition gone).
func (s *slowLane) done(it *parkedItem) {
	s.mu.Lock()
	if s.byID[it.id] == it {
		delete(s.byID, it.id)
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

// slowConcurrency bounds the slow retries under way at once: each holds a
// post and waits for up to three records of its own, so one at a time
// drained about 15–50 parked reports a second.
const slowConcurrency = 32

// readBackBatch is how many due parked reports the lane reads back at once
// (one read of <prefix>.parked, a client of its own: ~10 ms): the bodies
// held at a time are at most it and the slow retries under way (~1 MB).
const readBackBatch = 1024

// slowRetries runs the slow lane until the run ends (a goroutine of
// serve): it takes the parked reports due, up to readBackBatch, reads
// their entries back from <prefix>.parked, and hands each to a slow retry
// of its own, at most slowConcurrency at once; it returns once they all
// ended.
func (rn *run) slowRetries() {
	clk := rn.cfg.Clock
	timer := clk.NewTimer(time.Hour)
	defer timer.Stop()
	var retries sync.WaitGroup
	defer retries.Wait()
	slots := make(chan struct{}, slowConcurrency)
	for {
		if rn.stopping.Load() {
			return
		}
		rn.catchUp(rn.postCtx) // operators' redrive requests (at most every catchUpInterval)
		items, next := rn.slow.take(rn.cfg.Now(), readBackBatch)
		if len(items) > 0 {
			entries := rn.readBack(rn.postCtx, items)
			for _, it := range items {
				e := entries[it]
				if e == nil {
					continue // readBack put it back or let it go
				}
				select {
				case slots <- struct{}{}:
				case <-rn.coordDone:
					return
				}
				retries.Go(func() {
					defer func() { <-slots }()
					rn.slowRetry(it, e)
				})
			}
			continue
		}
		wait := catchUpInterval
		if !next.IsZero() {
			wait = min(wait, max(next.Sub(rn.cfg.Now()), time.Millisecond))
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

// slowPart is a partition's slow retries under way (partState.slow, under
// its mu).
type slowPart struct {
	// busy counts the slow retries of the partition under way: its
	// revocation waits for them (checkRevocations), so that no write of
	// its parked state by this run lands after its next owner's.
	busy int
	// ctx is their posts' context, cancelled when the partition is revoked
	// (the post abandoned; its entry still says posting, and the next owner
	// posts again labelled in doubt).
	ctx    context.Context
	cancel context.CancelFunc
	// holds are the log positions held by slow retries recording their
	// answers (hold), with their counts: progress snapshots keep their log
	// position at the least of them.
	holds map[int64]int
}

// held is the log position progress snapshots must not pass (0: none;
// ps.mu held).
func (sp *slowPart) held() int64 {
	var least int64
	for pos := range sp.holds {
		if least == 0 || pos < least {
			least = pos
		}
	}
	return least
}

// slowStart counts a slow retry of ps, unless ps is on its way out, and
// returns its posts' context.
func (rn *run) slowStart(ps *partState) (context.Context, bool) {
	if rn.part(ps.key) != ps {
		return nil, false
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.revoking.Load() || ps.dropped.Load() || rn.stopping.Load() {
		return nil, false
	}
	if ps.slow.ctx == nil {
		ps.slow.ctx, ps.slow.cancel = context.WithCancel(rn.postCtx)
	}
	ps.slow.busy++
	return ps.slow.ctx, true
}

// slowEnd ends a slow retry of ps counted by slowStart; the coordinator
// looks again at a revocation waiting for it.
func (rn *run) slowEnd(ps *partState) {
	ps.mu.Lock()
	ps.slow.busy--
	revoking := ps.revoking.Load()
	ps.mu.Unlock()
	if revoking || rn.stopping.Load() {
		rn.poke()
	}
}

// slowBusy reports whether a slow retry of any partition is under way.
func (rn *run) slowBusy() bool {
	for _, ps := range rn.partList() {
		ps.mu.Lock()
		busy := ps.slow.busy > 0
		ps.mu.Unlock()
		if busy {
			return true
		}
	}
	return false
}

// stopSlowAll cancels the slow posts of every partition (shutdown).
func (rn *run) stopSlowAll() {
	for _, ps := range rn.partList() {
		ps.mu.Lock()
		ps.stopSlow()
		ps.mu.Unlock()
	}
}

// stopSlow cancels the slow posts of ps (its revocation; ps.mu held).
func (ps *partState) stopSlow() {
	if ps.slow.cancel != nil {
		ps.slow.cancel()
	}
}

// hold keeps ps's progress snapshots at their log position now until
// unhold: a slow retry's answer is on its way.
func hold(ps *partState) int64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	pos := max(ps.logEnd, 1)
	if ps.slow.holds == nil {
		ps.slow.holds = map[int64]int{}
	}
	ps.slow.holds[pos]++
	return pos
}

func unhold(ps *partState, pos int64) {
	ps.mu.Lock()
	if ps.slow.holds[pos]--; ps.slow.holds[pos] <= 0 {
		delete(ps.slow.holds, pos)
	}
	ps.dirty = true
	ps.mu.Unlock()
}

// errRunEnded ends a slow retry's wait for its record when the run ends
// first (the record may still land: a reader of the entry labels the
// report in doubt).
var errRunEnded = errors.New("reporter: the run ended before the record was acknowledged")

// slowProduce hands rec to Kafka and waits for its acknowledgement, or for
// the end of the run. The record has no context of its own (produce): a
// slow retry that stops waiting never fails it, nor the records of other
// reports buffered with it (franz-go fails a batch whose first record's
// context is done). A post that outlasts the caller's patience is bounded
// by the partner client's timeout instead.
func (rn *run) slowProduce(rec *kgo.Record) (*kgo.Record, error) {
	type result struct {
		r   *kgo.Record
		err error
	}
	done := make(chan result, 1)
	rn.produce(rec, func(r *kgo.Record, err error) { done <- result{r, err} })
	select {
	case res := <-done:
		return res.r, res.err
	case <-rn.coordDone:
		return nil, errRunEnded
	}
}

// slowPublish publishes the Delivery record of a slow retry and waits for
// it; the log position moves with it.
func (rn *run) slowPublish(ps *partState, rec *kgo.Record) error {
	r, err := rn.slowProduce(rec)
	if err != nil {
		return err
	}
	ps.mu.Lock()
	ps.noteLog(r)
	ps.mu.Unlock()
	return nil
}

// slowDelay is the delay of the slow schedule before the retry after stage.
func (rn *run) slowDelay(stage int) time.Duration {
	return rn.cfg.ParkRetries[min(max(stage, 0), len(rn.cfg.ParkRetries)-1)]
}

// slowAgain puts it back in the lane, due after d (at once when asked, and
// an operator's redrive request waits on it), unless its partition is on
// its way out (the next owner reads the entry).
func (rn *run) slowAgain(it *parkedItem, d time.Duration, asked bool) {
	if !rn.owned(it.ps) {
		rn.slow.done(it)
		return
	}
	if asked && rn.slow.requestedNow(it) {
		d = 0
	}
	it.due = rn.cfg.Now().Add(d).UnixMilli()
	rn.slow.addItem(it)
}

// ended reports whether err means the run (or its client) ended, or the
// partition's parked state is another reporter's now (errFenced): the
// slow retry records nothing more.
func ended(err error) bool {
	return errors.Is(err, errRunEnded) || errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, errFenced)
}
