package reporter

import (
	"context"
	"fmt"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/reporter/delivery"
)

// coordinate does the housekeeping that no worker does: retry timers,
// commits, revocations, shutdown. It returns once the run is over and every
// final offset that may be committed is committed.
func (rn *run) coordinate(ctx context.Context) error {
	// Every timer is the clock's (Config.Clock): tests advance time.
	clk := rn.cfg.Clock
	commitTick := clk.NewTimer(rn.cfg.CommitInterval)
	defer commitTick.Stop()
	stallTick := clk.NewTimer(stallCheck)
	defer stallTick.Stop()
	retryTimer := clk.NewTimer(time.Hour)
	retryTimer.Stop()
	var deadline <-chan time.Time
	var shutdownTimer Timer
	defer func() {
		if shutdownTimer != nil {
			shutdownTimer.Stop()
		}
	}()
	done := ctx.Done()
	// The periodic commits' pace is the coordinator's own; a commit's
	// goroutine reports back on commitDone (one in flight: never blocks).
	var pace commitPace
	commitDone := make(chan []*partState, 1)

	for {
		rn.checkRevocations(rn.cfg.Now())
		rn.parkHanging() // a hanging track's reports waiting: parked without a post
		// Shutting down, before its deadline: slow retries and the parks
		// whose entries are being written are waited for.
		slowWait := deadline != nil && (rn.slowBusy() || rn.parking.Load() > 0)
		rn.mu.Lock()
		// stopping is set before this lock is taken: a worker that takes a
		// report after this check saw it (next) and takes none.
		if rn.stopping.Load() && rn.inflight == 0 && !slowWait {
			rn.mu.Unlock()
			return rn.finish()
		}
		next := rn.nextWake(rn.cfg.Now())
		if !next.IsZero() && !next.Equal(rn.retryAt) {
			rn.retryAt = next
			retryTimer.Reset(max(next.Sub(rn.cfg.Now()), 0))
		}
		rn.mu.Unlock()
		var batch []commitEntry
		if !rn.stopping.Load() {
			batch = rn.periodicCommit(&pace)
		}
		if batch != nil {
			rn.commitWG.Go(func() { commitDone <- rn.commit(ctx, "periodic", batch) })
		}

		select {
		case <-rn.wake:
		case req := <-rn.revokeCh:
			rn.startRevocation(req)
		case <-retryTimer.C():
			rn.mu.Lock()
			rn.retryAt = time.Time{}
			rn.delayed.due(rn.cfg.Now(), &rn.ready)
			rn.jobsReady()
			rn.mu.Unlock()
		case failed := <-commitDone:
			pace.inFlight = false
			rn.markDirty(failed)
		case <-commitTick.C():
			commitTick.Reset(rn.cfg.CommitInterval)
		case <-stallTick.C():
			stallTick.Reset(stallCheck)
			rn.mu.Lock()
			rn.checkStall(rn.cfg.Now())
			rn.mu.Unlock()
		case <-done:
			done = nil
			shutdownTimer = clk.NewTimer(rn.cfg.ShutdownTimeout)
			deadline = shutdownTimer.C()
			rn.stopping.Store(true)
			// The slow lane's posts are cancelled, and waited for until the
			// deadline: each records its cancelled post in its entry
			// (slowCancelled), so that the next owner labels it cancelled.
			rn.stopSlowAll()
			rn.mu.Lock()
			rn.log.Info("reporter shutting down: no new posts; waiting for posts in flight",
				"in_flight", rn.inflight, "timeout", rn.cfg.ShutdownTimeout)
			rn.mu.Unlock()
		case <-deadline:
			deadline = nil
			rn.mu.Lock()
			rn.log.Warn("shutdown timeout: abandoning posts in flight (their reports stay uncommitted, in doubt, and are posted again labelled on restart)",
				"in_flight", rn.inflight)
			rn.mu.Unlock()
			rn.cancelPosts()
		}
	}
}

// nextWake is when the coordinator must look again (zero: on its next
// wake-up): the first retry due, or, while leased reports wait for the
// retry budget, the instant a token is back (mu held). When a token is back
// already, it wakes the idle workers: those that found none went idle, and
// with no post out nothing else may wake them (a worker that looked an
// instant before the refill completed shed, and the timer that woke it
// does not fire again).
func (rn *run) nextWake(now time.Time) time.Time {
	next := rn.delayed.next()
	if rn.leased.len() == 0 {
		return next
	}
	if at := rn.thr.readyAt(now); !at.IsZero() && (next.IsZero() || at.Before(next)) {
		next = at
	}
	if rn.thr.tokens >= 1 {
		rn.wakeWorkers()
	}
	return next
}

// poke wakes the housekeeper (never blocks).
func (rn *run) poke() {
	select {
	case rn.wake <- struct{}{}:
	default:
	}
}

// jobsReady is called after reports were queued (mu held): the leaser
// leases them, and idle workers take the leased ones.
func (rn *run) jobsReady() {
	select {
	case rn.leaseWake <- struct{}{}:
	default:
	}
	rn.wakeWorkers()
}

// finish runs once every post is back: it waits for the Delivery records to
// reach Kafka, then commits every partition's progress (unless a
// configuration error forbids committing). Reports still waiting for a
// retry stay pending: the commit's progress says which later ones are
// final, so the next run posts only what has no final outcome.
func (rn *run) finish() error {
	rn.publishing.Wait()
	flushCtx, cancel := context.WithTimeout(context.Background(), rn.cfg.ShutdownTimeout)
	err := rn.flushProducers(flushCtx)
	cancel()
	if err != nil {
		rn.log.Warn("flushing delivery records", "err", err)
	}
	rn.commitWG.Wait() // a periodic commit in flight
	rn.mu.Lock()
	if rn.standby != nil {
		rn.log.Warn("reporter stopped during a standby episode: the reports standby answered stay uncommitted and are replayed on restart",
			"held", len(rn.held))
		rn.endEpisode(len(rn.held), "reporter stopped during standby")
	}
	// No worker posts any more (stopping, nothing in flight): the reports
	// leased but not posted are not in doubt. A lease whose marker is still
	// unacknowledged was flushed above.
	rn.unleaseAll()
	rn.mu.Unlock()
	var batch []commitEntry
	if !rn.noCommit.Load() {
		rn.markDirty(rn.partList()) // all of them: a periodic commit may have failed
		batch = rn.dirtyProgress()
	}
	rn.fatalMu.Lock()
	fatal := rn.fatal
	rn.fatalMu.Unlock()
	if len(batch) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), rn.cfg.ShutdownTimeout)
		if failed := rn.commit(ctx, "shutdown", batch); len(failed) == 0 {
			rn.log.Info("final progress committed", "partitions", len(batch))
		}
		cancel()
	}
	return fatal
}

func (rn *run) configError(j *job, d delivery.Decision) error {
	var hint string
	switch partnerapi.KindOf(d.Err) {
	case partnerapi.KindEdgeBlocked:
		hint = "the partner API's edge blocked our User-Agent (HTTP 403, edge error 1010): configure a distinctive product User-Agent"
	case partnerapi.KindNotFound:
		hint = "the report endpoint answered 404: check the partner API base URL"
	default:
		hint = "the partner API refused our credentials: check the client id and signature"
	}
	return fmt.Errorf("%w: %s (report %s): %w", ErrInvalidConfig, hint, j.id, d.Err)
}

// stop ends the run after a configuration or publishing error: posts in
// flight are abandoned and, when noCommit, no offset is committed any more.
// It takes only fatalMu (a leaf): any goroutine may call it, holding any
// lock.
func (rn *run) stop(err error, noCommit bool) {
	rn.fatalMu.Lock()
	if rn.fatal == nil {
		rn.fatal = err
		rn.log.Error("reporter stopping", "err", err, "commit", !noCommit)
	}
	rn.fatalMu.Unlock()
	if noCommit {
		rn.noCommit.Store(true)
	}
	rn.stopping.Store(true)
	rn.cancelPosts()
	rn.poke()
}
