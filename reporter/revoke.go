package reporter

import (
	"context"
	"slices"
	"sync"
	"time"
)

// commitsOut counts the periodic commits in flight (one at a time: the
// coordinator's pace). The coordinator starts them (Go); onRevoked, on the
// Kafka client's group goroutine, and finish wait for the ones started
// before they asked (Wait). Not a sync.WaitGroup: its Add from zero must
// happen before any Wait, and the coordinator starts a commit whenever the
// pace allows, whatever a rebalance is doing — an Add racing a Wait made
// the runtime panic ("WaitGroup is reused before previous Wait has
// returned") in a rebalance (TestRevokeWhileCommitsStart).
type commitsOut struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to zero; a new one when n leaves it
}

// Go runs f in a goroutine of its own, counted until it returns.
func (c *commitsOut) Go(f func()) {
	c.mu.Lock()
	if c.n == 0 {
		c.idle = make(chan struct{})
	}
	c.n++
	c.mu.Unlock()
	go func() { // counted: Wait waits for it
		defer c.done()
		f()
	}()
}

func (c *commitsOut) done() {
	c.mu.Lock()
	if c.n--; c.n == 0 {
		close(c.idle)
	}
	c.mu.Unlock()
}

// Wait returns once every commit started before the call has returned
// (any goroutine, concurrently with Go).
func (c *commitsOut) Wait() {
	c.mu.Lock()
	if c.n == 0 {
		c.mu.Unlock()
		return
	}
	idle := c.idle
	c.mu.Unlock()
	<-idle
}

// revocation is one rebalance's partitions leaving this instance.
type revocation struct {
	parts    []*partState
	lost     bool
	deadline time.Time
	reply    chan []commitEntry
}

type revokeReq struct {
	parts map[string][]int32
	lost  bool
	reply chan []commitEntry
}

// onRevoked runs in the Kafka client's group goroutine: it asks the
// coordinator to stop posting the partitions, waits until their posts in
// flight are back (bounded by ShutdownTimeout), and commits their progress
// (not for lost partitions, not after a configuration error), so that the
// next owner neither loses nor repeats a final report.
func (rn *run) onRevoked(ctx context.Context, m map[string][]int32, lost bool) {
	if len(m) == 0 {
		return
	}
	req := revokeReq{parts: m, lost: lost, reply: make(chan []commitEntry, 1)}
	select {
	case rn.revokeCh <- req:
	case <-rn.coordDone:
		return // the coordinator committed what was final before it returned
	}
	var batch []commitEntry
	select {
	case batch = <-req.reply:
	case <-rn.coordDone:
		return
	}
	if len(batch) == 0 {
		return
	}
	rn.commitWG.Wait() // a periodic commit in flight must not land after this one
	if failed := rn.commit(ctx, "revoke", batch); len(failed) == 0 {
		rn.log.Info("progress of revoked partitions committed", "partitions", len(batch))
	}
}

// startRevocation marks the partitions revoked (the coordinator's; no
// lock held): nothing more of them is posted (next checks the mark under
// the partition's lock); the reply goes once their posts are back.
func (rn *run) startRevocation(req revokeReq) {
	rv := &revocation{lost: req.lost, reply: req.reply, deadline: rn.cfg.Now().Add(rn.cfg.ShutdownTimeout)}
	for topic, ps := range req.parts {
		for _, p := range ps {
			if st := rn.part(tpKey{topic, p}); st != nil {
				st.mu.Lock()
				st.revoking.Store(true)
				st.stopSlow() // its slow retries end: they are waited for below
				st.mu.Unlock()
				rv.parts = append(rv.parts, st)
			}
		}
	}
	rn.log.Info("partitions revoked: waiting for their posts in flight", "partitions", req.parts, "lost", req.lost)
	rn.revocations = append(rn.revocations, rv)
	rn.revoking.Store(int32(len(rn.revocations)))
}

// checkRevocations completes the revocations whose posts are all back (or
// whose deadline passed: those posts stay in doubt in the progress) and
// whose slow retries have all ended (always waited for: slowRetry): it
// replies with the progress to commit and drops the partitions' state (the
// coordinator's; no lock held). No post of a revoking partition starts,
// so once its posts are back nothing but late acknowledgements changes it.
func (rn *run) checkRevocations(now time.Time) {
	rn.revocations = slices.DeleteFunc(rn.revocations, func(rv *revocation) bool {
		busy, slow := false, false
		for _, ps := range rv.parts {
			ps.mu.Lock()
			busy = busy || ps.inflight > 0
			slow = slow || ps.slow.busy > 0
			ps.mu.Unlock()
		}
		// A slow retry is waited for whatever the deadline: its post is
		// cancelled (startRevocation), and a write of the parked state after
		// the revocation could land after the next owner's (a delivered
		// report's entry brought back).
		if slow || (busy && now.Before(rv.deadline)) {
			return false
		}
		rn.mu.Lock()
		for _, j := range rn.leased.all() {
			if j.ps.revoking.Load() {
				j.ps.mu.Lock()
				rn.unlease(j) // never posted: next() drops revoking partitions' reports
				j.ps.mu.Unlock()
			}
		}
		rn.mu.Unlock()
		var batch []commitEntry
		gone := make(map[*partState]bool, len(rv.parts))
		for _, ps := range rv.parts {
			ps.mu.Lock()
			if !rv.lost && !rn.noCommit.Load() {
				if e, ok := rn.progressOf(ps); ok {
					batch = append(batch, e)
				}
			}
			ps.dropped.Store(true)
			rn.pending.Add(-int64(ps.wm.pending()))
			rn.slow.forget(ps)
			if ps.paused {
				rn.unpause(ps)
			}
			ps.mu.Unlock()
			gone[ps] = true
			rn.dropFence(ps.key.partition) // no slow retry of it is under way
			rn.partsMu.Lock()
			if rn.parts[ps.key] == ps {
				delete(rn.parts, ps.key)
			}
			rn.partsMu.Unlock()
		}
		// Dropped first, forgotten after: an answer that comes back in
		// between sees the partition dropped and does not make its report
		// active again.
		rn.mu.Lock()
		rn.idMu.Lock()
		for id, j := range rn.active {
			if gone[j.ps] {
				rn.release(j)
				delete(rn.active, id)
			}
		}
		rn.idMu.Unlock()
		rn.mu.Unlock()
		select {
		case rn.room <- struct{}{}:
		default:
		}
		rv.reply <- batch // capacity 1
		return true
	})
	rn.revoking.Store(int32(len(rn.revocations)))
}
