package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// txn drives the enricher's transactions: poll events, begin a transaction
// at the first records, process them (holding those whose mix is not
// served, see hold.go), produce the outputs, and commit once the
// transaction is full or old enough. At most one transaction is open. It is
// used by one goroutine (Run's).
type txn struct {
	e    *Enricher
	o    Config
	p    *processor
	sess *kgo.GroupTransactSession

	open    bool      // a transaction is open
	started time.Time // when the open transaction began
	inTxn   int       // events handled in the open transaction
	recs    []*kgo.Record
	batch   []*kgo.Record

	h       *holdState     // held events now
	snap    *holdState     // held events as of the last commit (restored on abort)
	w       *mixWaiter     // background fetches of the mixes held events wait for
	seen    map[tpKey]bool // partitions whose commit metadata was read since their assignment
	blocked bool           // the hold is full: polling stopped (logged once)
	scan    struct {       // the last release scan
		gen int64
		at  time.Time
	}
}

// step is what the loop does after a batch was handled.
type step int

const (
	stepCommitCheck step = iota // go on: commit when the transaction is due
	stepReturn                  // Run's loop ends with the returned error (nil: clean shutdown)
)

// errWaitTooLong: mixes did not arrive within the wait of a batch (their
// events are held).
type errWaitTooLong struct{ mixIDs []int64 }

func (e *errWaitTooLong) Error() string {
	return fmt.Sprintf("consumer: mixes %v not available within the batch's wait", e.mixIDs)
}

var errClientClosed = errors.New("consumer: kafka client closed")

// loop runs transactions until ctx ends or a fatal error.
func (e *Enricher) loop(ctx context.Context, sess *kgo.GroupTransactSession) error {
	t := &txn{e: e, o: e.opts, p: e.proc, sess: sess, h: newHoldState(), snap: newHoldState(),
		w: newMixWaiter(ctx, e.cache), seen: map[tpKey]bool{}}
	defer t.w.stop()
	defer e.setHeld(0)
	for {
		if err := t.w.err(); err != nil {
			return err
		}
		if !t.open {
			t.applyLost()
		}
		if t.h.room(t.o.MaxHeld, t.o.MetadataMaxBytes) == 0 {
			if next, err := t.blockFull(ctx); next == stepReturn {
				return err
			}
			continue
		}
		if t.blocked {
			t.blocked = false
			t.o.Logger.Info("held events below their bound again: fetching resumed", "held", t.h.n)
		}
		fs := t.poll(ctx)
		if fs.IsClientClosed() {
			return errClientClosed
		}
		if ctx.Err() != nil {
			// Clean shutdown. Commit when everything polled was produced;
			// when this last poll returned records, abort instead (they
			// and the rest of the transaction are read again after a
			// restart: nothing lost, nothing doubled). Held events are
			// read again too: the commit stops at the oldest.
			commit := kgo.TryCommit
			if len(fs.Records()) > 0 {
				commit = kgo.TryAbort
			}
			return t.shutdown(ctx, commit)
		}
		t.collect(fs)
		if len(t.recs) > 0 || t.releaseDue() {
			if next, err := t.handleBatch(ctx); next == stepReturn {
				return err
			}
		}
		if t.due() {
			if err := t.end(ctx, kgo.TryCommit); err != nil {
				if ctx.Err() != nil {
					continue
				}
				return err
			}
		}
	}
}

// blockFull is the policy of a full hold: no new event is fetched (none is
// dropped); the open transaction is committed, and the loop waits until a
// held event's mix is fetched, then releases what it can.
func (t *txn) blockFull(ctx context.Context) (step, error) {
	if err := t.end(ctx, kgo.TryCommit); err != nil && ctx.Err() == nil {
		return stepReturn, err
	}
	if !t.blocked {
		t.blocked = true
		t.o.Logger.Warn("held events at their bound: fetching no new events until a mix is served (nothing is dropped)",
			"held", t.h.n, "max_held", t.o.MaxHeld, "offset_metadata_max_bytes", t.o.MetadataMaxBytes)
	}
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	select {
	case <-t.w.notify:
	case <-timer.C:
	case <-ctx.Done():
		return stepReturn, t.shutdown(ctx, kgo.TryCommit)
	}
	t.applyLost()
	t.recs = t.recs[:0]
	t.scan.at = time.Time{} // release now
	if next, err := t.handleBatch(ctx); next == stepReturn {
		return next, err
	}
	return stepCommitCheck, t.end(ctx, kgo.TryCommit)
}

// poll fetches up to the records the open transaction still has room for,
// and no more than the hold has room for (each could be held), waiting no
// longer than its interval allows (and 200 ms while events are held, so
// that they are released soon after their mix is served).
func (t *txn) poll(ctx context.Context) kgo.Fetches {
	pollCtx, cancel := ctx, context.CancelFunc(func() {})
	switch {
	case t.open:
		pollCtx, cancel = context.WithDeadline(ctx, t.started.Add(t.o.TxnInterval))
	case t.h.n > 0:
		pollCtx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	}
	defer cancel()
	return t.sess.PollRecords(pollCtx, max(1, min(t.o.TxnRecords-t.inTxn, t.h.room(t.o.MaxHeld, t.o.MetadataMaxBytes))))
}

// collect logs the fetch errors of fs and keeps its records in t.recs.
func (t *txn) collect(fs kgo.Fetches) {
	fs.EachError(func(topic string, part int32, err error) {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
			return
		}
		t.o.Kafka.Faults.Fetch(t.o.Logger, topic, part, err) // at most a line a minute per fault
	})
	t.recs = t.recs[:0]
	fs.EachRecord(func(r *kgo.Record) { t.recs = append(t.recs, r) })
}

// due reports whether the open transaction is full or old enough to commit.
func (t *txn) due() bool {
	return t.open && (t.inTxn >= t.o.TxnRecords || time.Since(t.started) >= t.o.TxnInterval)
}

// begin opens a transaction unless one is open.
func (t *txn) begin() error {
	if t.open {
		return nil
	}
	t.applyLost()
	if err := t.sess.Begin(); err != nil {
		return fmt.Errorf("consumer: begin transaction: %w", err)
	}
	t.open, t.started = true, time.Now()
	return nil
}

// handleBatch processes the held events whose mix is now served and
// t.recs in the open transaction (begun if needed) and produces their
// outputs.
func (t *txn) handleBatch(ctx context.Context) (step, error) {
	if err := t.begin(); err != nil {
		return stepReturn, err
	}
	if err := t.readCommitMeta(ctx); err != nil {
		return stepReturn, err
	}
	batch := t.release(t.batch[:0])
	for _, r := range t.recs {
		if t.h.skip(r) {
			t.h.handled(r)
			t.e.skipped.Add(1)
			continue
		}
		batch = append(batch, r)
	}
	t.batch = batch
	if len(batch) == 0 {
		return stepCommitCheck, nil
	}
	waitCtx, cancelWait := context.WithTimeout(ctx, t.o.MixHoldAfter)
	out, err := t.p.process(ctx, waitCtx, batch, t.o.Now().UnixMilli(), t)
	cancelWait()
	t.e.setHeld(t.h.n)
	if err != nil {
		if ctx.Err() != nil {
			// Shutdown while waiting for a mix: these records were
			// polled but not produced, so abort.
			return stepReturn, t.shutdown(ctx, kgo.TryAbort)
		}
		return stepReturn, err
	}
	if err := t.p.produce(ctx, t.sess.Client(), out); err != nil {
		return stepReturn, err
	}
	t.inTxn += len(batch)
	if t.e.testHookProduced != nil {
		t.e.testHookProduced(t.sess.Client())
	}
	return stepCommitCheck, nil
}

// hold implements holder: it holds it when an event with its key is held or
// its mix is not served (and has its mix fetched in the background).
func (t *txn) hold(it *item) bool {
	r := it.rec
	waiting := it.vs == nil && it.listing == nil
	if !waiting && !t.h.keyHeld(r) {
		t.h.handled(r)
		return false
	}
	var mixID int64
	if waiting {
		mixID = it.ev.MixID
		t.w.wait(mixID)
	}
	t.h.add(r, mixID)
	t.e.noteHeld(t.h.n)
	return true
}

// waited implements holder.
func (t *txn) waited(id int64) bool { return t.w.isWaiting(id) }

// releaseDue reports whether held events may be ready: a background fetch
// ended since the last scan, or a second passed (a listing may also have
// come through another batch's fetch).
func (t *txn) releaseDue() bool {
	return t.h.n > 0 && (t.w.gen.Load() != t.scan.gen || time.Since(t.scan.at) >= time.Second)
}

// release appends to batch, in order per key, the held events of every key
// whose first held event's mix is served now (or got a verdict, as a 404):
// the whole queue of the key, whose later events are held again behind any
// that still wait.
func (t *txn) release(batch []*kgo.Record) []*kgo.Record {
	if !t.releaseDue() {
		return batch
	}
	t.scan.gen, t.scan.at = t.w.gen.Load(), time.Now()
	kept := t.h.order[:0]
	for _, k := range t.h.order {
		q, ok := t.h.keys[k]
		if !ok {
			continue
		}
		if id := q[0].mixID; id != 0 {
			if l, err := t.p.cache.Lookup(id); l == nil && err == nil {
				t.w.wait(id) // expired again, or evicted: fetch it again
				kept = append(kept, k)
				continue
			}
		}
		for _, hr := range t.h.take(k) {
			batch = append(batch, hr.rec)
		}
		t.e.released.Add(int64(len(q)))
	}
	t.h.order = kept
	return batch
}

// readCommitMeta reads the committed offsets' metadata of partitions seen
// for the first time since their assignment: where a predecessor held
// events, it says which offsets past the committed one were produced.
func (t *txn) readCommitMeta(ctx context.Context) error {
	var fresh []tpKey
	for _, r := range t.recs {
		if tp := tpOf(r); !t.seen[tp] {
			t.seen[tp] = true
			fresh = append(fresh, tp)
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	offs, err := t.fetchOffsets(ctx, fresh)
	if err != nil {
		for _, tp := range fresh {
			delete(t.seen, tp)
		}
		return err
	}
	for _, tp := range fresh {
		o, ok := offs.Lookup(tp.topic, tp.part)
		if !ok {
			continue
		}
		rec, err := decodeHoldMeta(o.At, o.Metadata)
		switch {
		case errors.Is(err, errNotHoldMeta):
			continue
		case err != nil:
			t.o.Logger.Error("commit metadata of held events unreadable: the events after the committed offset are enriched again (their plays may be doubled)",
				"topic", tp.topic, "partition", tp.part, "err", err)
			continue
		}
		ps := &partState{pos: o.At, rec: rec, last: commitMark{o.At, o.Metadata}, known: true}
		t.h.parts[tp] = ps
		cp := *ps
		t.snap.parts[tp] = &cp
		t.o.Logger.Info("resuming after held events: offsets already produced are skipped",
			"topic", tp.topic, "partition", tp.part, "from", o.At, "head", rec.head, "undone", len(rec.undone))
	}
	return nil
}

// fetchOffsets reads the group's committed offsets, retrying for up to 30 s
// while a partition of fresh answers with an error (e.g. an offset commit
// still pending in another instance's transaction): handling a partition
// without knowing its metadata could produce its events twice.
func (t *txn) fetchOffsets(ctx context.Context, fresh []tpKey) (kadm.OffsetResponses, error) {
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	adm := kadm.NewClient(t.sess.Client())
	for {
		offs, err := adm.FetchOffsets(fctx, t.o.Group)
		if err == nil {
			for _, tp := range fresh {
				if o, ok := offs.Lookup(tp.topic, tp.part); ok && o.Err != nil {
					err = fmt.Errorf("partition %s/%d: %w", tp.topic, tp.part, o.Err)
					break
				}
			}
		}
		if err == nil {
			return offs, nil
		}
		select {
		case <-fctx.Done():
			return nil, inSession(fmt.Errorf("consumer: read the group's committed offsets: %w", err))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// applyLost forgets the held events and bookkeeping of the partitions
// revoked or lost since (their next owner reads them again from the
// committed offsets and metadata).
func (t *txn) applyLost() {
	lost := t.e.lost.takeAll()
	if len(lost) == 0 {
		return
	}
	t.h.drop(lost)
	t.snap.drop(lost)
	for tp := range lost {
		delete(t.seen, tp)
	}
	t.e.setHeld(t.h.n)
}

// end commits or aborts the open transaction, if any. A commit whose
// produce failed turns into an abort (and counts the events whose records
// Kafka refused). The offset commit stops at each partition's oldest held
// event (with the metadata of what was produced past it); an abort restores
// the held events as of the last commit, as franz-go rewinds to it.
func (t *txn) end(ctx context.Context, commit kgo.TransactionEndTry) error {
	if !t.open {
		return nil
	}
	t.open = false
	// Ending is not cut short by shutdown: a cancelled End may have
	// committed on the broker without our knowing. It is bounded by
	// the transaction timeout instead.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.o.TransactionTimeout)
	defer cancel()
	if commit {
		var err error
		if commit, err = t.flush(ctx); err != nil {
			t.restore()
			return err
		}
	}
	marks := t.h.marks()
	if len(marks) > 0 && commit {
		ctx = kgo.PreTxnCommitFnContext(ctx, func(req *kmsg.TxnOffsetCommitRequest) error {
			applyMarks(req, marks)
			return nil
		})
	}
	committed, err := t.sess.End(ctx, commit)
	t.p.endTxn(committed)
	t.inTxn = 0
	if committed {
		t.h.committed(marks)
		t.snap = t.h.clone()
	} else {
		t.restore()
	}
	t.applyLost()
	if err != nil {
		return inSession(fmt.Errorf("consumer: end transaction: %w", err))
	}
	if commit == kgo.TryCommit && !committed {
		t.o.Logger.Info("transaction aborted by a rebalance; its events will be read again from the committed offsets")
	}
	return nil
}

// restore puts the held events back as of the last commit.
func (t *txn) restore() {
	t.h = t.snap.clone()
	t.scan.at = time.Time{}
	t.e.setHeld(t.h.n)
}

// flush waits for the transaction's records and says how to end it: abort
// when a produce failed.
func (t *txn) flush(ctx context.Context) (kgo.TransactionEndTry, error) {
	if err := t.sess.Client().Flush(ctx); err != nil {
		return kgo.TryAbort, inSession(fmt.Errorf("consumer: flush: %w", err))
	}
	perr := t.p.produceErr()
	if perr == nil {
		return kgo.TryCommit, nil
	}
	t.o.Logger.Warn("a produce failed; aborting the transaction (its events will be read again)", "err", perr)
	for _, s := range t.p.notePoison() {
		t.o.Logger.Warn("Kafka refused a record of this event; it is retried on its own, then rejected as produce_failed",
			"source", s.loc.String(), "failures", s.n, "max_produce_attempts", t.p.maxProduce, "err", s.err)
	}
	return kgo.TryAbort, nil
}

// shutdown ends the open transaction with a short deadline of its own (ctx
// has ended) and reports.
func (t *txn) shutdown(ctx context.Context, commit kgo.TransactionEndTry) error {
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	err := t.end(endCtx, commit)
	t.o.Logger.Info("enricher stopped", "committed_last", bool(commit), "held", t.h.n, "stats", t.e.Stats())
	return err
}
