package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// txn drives the enricher's transactions: poll events, begin a transaction
// at the first records, process them, produce the outputs, and commit once
// the transaction is full or old enough. At most one transaction is open.
// It is used by one goroutine (Run's).
type txn struct {
	e    *Enricher
	o    Config
	p    *processor
	sess *kgo.GroupTransactSession

	open     bool      // a transaction is open
	started  time.Time // when the open transaction began
	inTxn    int       // events polled into the open transaction
	produced bool      // the open transaction produced records
	recs     []*kgo.Record
}

// step is what the loop does after a batch was handled.
type step int

const (
	stepCommitCheck step = iota // go on: commit when the transaction is due
	stepPoll                    // poll again at once (the transaction was aborted)
	stepReturn                  // Run's loop ends with the returned error (nil: clean shutdown)
)

// errWaitTooLong: a mix needed by a transaction that already produced records
// did not arrive within MaxTxnWait.
type errWaitTooLong struct{ mixIDs []int64 }

func (e *errWaitTooLong) Error() string {
	return fmt.Sprintf("consumer: mixes %v not available within the transaction's wait budget", e.mixIDs)
}

var errClientClosed = errors.New("consumer: kafka client closed")

// loop runs transactions until ctx ends or a fatal error.
func (e *Enricher) loop(ctx context.Context, sess *kgo.GroupTransactSession) error {
	t := &txn{e: e, o: e.opts, p: e.proc, sess: sess}
	for {
		fs := t.poll(ctx)
		if fs.IsClientClosed() {
			return errClientClosed
		}
		if ctx.Err() != nil {
			// Clean shutdown. Commit when everything polled was produced;
			// when this last poll returned records, abort instead (they
			// and the rest of the transaction are read again after a
			// restart: nothing lost, nothing doubled).
			commit := kgo.TryCommit
			if len(fs.Records()) > 0 {
				commit = kgo.TryAbort
			}
			return t.shutdown(ctx, commit)
		}
		t.collect(fs)
		if len(t.recs) > 0 {
			next, err := t.handleBatch(ctx)
			switch next {
			case stepReturn:
				return err
			case stepPoll:
				continue
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

// poll fetches up to the records the open transaction still has room for,
// waiting no longer than its interval allows.
func (t *txn) poll(ctx context.Context) kgo.Fetches {
	pollCtx, cancel := ctx, context.CancelFunc(func() {})
	if t.open {
		pollCtx, cancel = context.WithDeadline(ctx, t.started.Add(t.o.TxnInterval))
	}
	defer cancel()
	return t.sess.PollRecords(pollCtx, t.o.TxnRecords-t.inTxn)
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
	if err := t.sess.Begin(); err != nil {
		return fmt.Errorf("consumer: begin transaction: %w", err)
	}
	t.open, t.started = true, time.Now()
	return nil
}

// handleBatch processes t.recs in the open transaction (begun if needed)
// and produces their outputs.
func (t *txn) handleBatch(ctx context.Context) (step, error) {
	if err := t.begin(); err != nil {
		return stepReturn, err
	}
	var waitCtx context.Context = ctx
	cancelWait := context.CancelFunc(func() {})
	if t.produced {
		waitCtx, cancelWait = context.WithTimeout(ctx, t.o.MaxTxnWait)
	}
	out, err := t.p.process(ctx, waitCtx, t.recs, t.o.Now().UnixMilli())
	cancelWait()
	var tooLong *errWaitTooLong
	switch {
	case errors.As(err, &tooLong) && ctx.Err() == nil:
		if err := t.waitOutside(ctx, tooLong); err != nil {
			return stepReturn, err
		}
		return stepPoll, nil
	case err != nil:
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
	t.inTxn += len(t.recs)
	t.produced = t.produced || len(out) > 0
	if t.e.testHookProduced != nil {
		t.e.testHookProduced(t.sess.Client())
	}
	return stepCommitCheck, nil
}

// waitOutside aborts the open transaction, whose mixes are slow to come,
// and waits for them outside any transaction; the aborted events are read
// again from the committed offsets.
func (t *txn) waitOutside(ctx context.Context, tooLong *errWaitTooLong) error {
	t.o.Logger.Warn("partner API slow for a mix while a transaction is open; aborting it and waiting outside any transaction",
		"mix_ids", tooLong.mixIDs, "max_txn_wait", t.o.MaxTxnWait)
	if err := t.end(ctx, kgo.TryAbort); err != nil {
		return err
	}
	for _, id := range tooLong.mixIDs {
		if _, err := t.e.cache.Get(ctx, id); err != nil && !rejectsEvents(err) && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// end commits or aborts the open transaction, if any. A commit whose
// produce failed turns into an abort (and counts the events whose records
// Kafka refused).
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
			return err
		}
	}
	committed, err := t.sess.End(ctx, commit)
	t.p.endTxn(committed)
	t.inTxn, t.produced = 0, false
	if err != nil {
		return fmt.Errorf("consumer: end transaction: %w", err)
	}
	if commit == kgo.TryCommit && !committed {
		t.o.Logger.Info("transaction aborted by a rebalance; its events will be read again from the committed offsets")
	}
	return nil
}

// flush waits for the transaction's records and says how to end it: abort
// when a produce failed.
func (t *txn) flush(ctx context.Context) (kgo.TransactionEndTry, error) {
	if err := t.sess.Client().Flush(ctx); err != nil {
		return kgo.TryAbort, fmt.Errorf("consumer: flush: %w", err)
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
	t.o.Logger.Info("enricher stopped", "committed_last", bool(commit), "stats", t.e.Stats())
	return err
}
