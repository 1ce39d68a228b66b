package reporter

import (
	"container/heap"
	"encoding/json"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// Redrive requests: one poster per parked report.
//
// `playpipe redrive --parked` never posts a parked report itself: it writes
// a schemas.RedriveRequest to <prefix>.parked (key "redrive:<report id>")
// and waits for the outcome. The slow lane of the reporter that owns the
// report's partition reads the request (catchUp, every catchUpInterval;
// recoverParked when it takes the partition), makes the report due at
// once, and posts it in a slow retry like any other — its Delivery record
// carrying the redrive's replay id and reason — then removes the request
// (a tombstone of its key) once that record is on record. A request for a
// report the owner does not hold (final already) is removed without a
// post. So the main lane, the slow lane and a redrive never post the same
// report concurrently: the slow lane is a parked report's one poster, its
// writes fenced by the partition's ownership (slowRetry). An interrupted
// redrive leaves its requests in the topic: each is still served once, by
// whichever reporter owns the partition then; a re-run writes the same
// keys again.

// requestKey is the key of the redrive request of report id.
func requestKey(id string) string { return schemas.RedriveKeyPrefix + id }

// parseRequest reads r as a redrive request: isReq when its key is a
// request's; q is nil for a tombstone or an unreadable request.
func (rn *run) parseRequest(r *kgo.Record) (q *schemas.RedriveRequest, isReq bool) {
	id, isReq := strings.CutPrefix(string(r.Key), schemas.RedriveKeyPrefix)
	if !isReq || len(r.Value) == 0 {
		return nil, isReq
	}
	var req schemas.RedriveRequest
	if err := json.Unmarshal(r.Value, &req); err != nil || req.ReportID != id {
		rn.log.Warn("unreadable redrive request in the parked topic: ignored", "partition", r.Partition, "offset", r.Offset, "err", err)
		return nil, true
	}
	return &req, true
}

// foundRequest is a redrive request and the partition of <prefix>.parked
// it was read from.
type foundRequest struct {
	q  *schemas.RedriveRequest
	pp int32
}

// requested applies the redrive requests read by catchUp (the slow lane's
// goroutine; no lock held): the owned partitions' parked reports are due at
// once; a request for a report this run owns but does not hold is removed
// (final already); the others wait in the lane for a recovery of their
// partition by this run (recoverFirst: pending) or are another owner's.
func (rn *run) requested(reqs []foundRequest) {
	for _, f := range reqs {
		ps := rn.part(tpKey{rn.topics.Reports, f.q.Partition})
		if ps == nil || !rn.owned(ps) {
			rn.slow.pend(f)
			continue
		}
		if !rn.slow.request(f, rn.cfg.Now()) {
			rn.unrequest(f, "the report is not parked (final already)")
		}
	}
}

// unrequest removes the redrive request f (a tombstone of its key in its
// partition), answered: the redrive waiting for it reads the tombstone.
func (rn *run) unrequest(f foundRequest, why string) {
	if _, err := rn.slowProduce(rn.parkRecord(f.pp, requestKey(f.q.ReportID), nil)); err != nil {
		if !ended(err) {
			rn.log.Warn("a redrive request could not be removed: it is served again", "report_id", f.q.ReportID, "replay_id", f.q.ReplayID, "err", err)
		}
		return
	}
	rn.log.Info("redrive request answered", "report_id", f.q.ReportID, "replay_id", f.q.ReplayID, "why", why)
}

// request attaches f to the parked report it names, due at now; false when
// the lane does not hold it.
func (s *slowLane) request(f foundRequest, now time.Time) bool {
	s.mu.Lock()
	it := s.byID[f.q.ReportID]
	if it == nil {
		s.mu.Unlock()
		return false
	}
	it.redrive, it.rpp = f.q, f.pp
	if it.i >= 0 {
		it.due = now.UnixMilli()
		heap.Fix(&s.due, it.i)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// pend keeps f for a later recovery of its partition by this run.
func (s *slowLane) pend(f foundRequest) {
	s.mu.Lock()
	if s.pending == nil {
		s.pending = map[string]foundRequest{}
	}
	s.pending[f.q.ReportID] = f
	s.mu.Unlock()
}

// unpend forgets the pending request of id (its tombstone was read).
func (s *slowLane) unpend(id string) {
	s.mu.Lock()
	delete(s.pending, id)
	s.mu.Unlock()
}

// pendingOf takes the pending requests of reports partition p.
func (s *slowLane) pendingOf(p int32) []foundRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []foundRequest
	for id, f := range s.pending {
		if f.q.Partition == p {
			out = append(out, f)
			delete(s.pending, id)
		}
	}
	return out
}

// serving returns the request a slow retry of it starts to serve (nil:
// none).
func (s *slowLane) serving(it *parkedItem) (foundRequest, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return foundRequest{it.redrive, it.rpp}, it.redrive != nil
}

// served clears the request f of it, answered; it returns a newer one that
// came meanwhile.
func (s *slowLane) served(it *parkedItem, f foundRequest) (foundRequest, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if it.redrive == f.q {
		it.redrive = nil
	}
	return foundRequest{it.redrive, it.rpp}, it.redrive != nil
}

// requestedNow reports whether a request waits on it.
func (s *slowLane) requestedNow(it *parkedItem) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return it.redrive != nil
}
