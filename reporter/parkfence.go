package reporter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"
)

// The parked-state fence. Every write of a reports partition's parked
// state by its owner — the main lane's first entry of a parked report
// (setAside), a slow retry's entry saying posting, its next state or its
// tombstone, and the removals of recovery — goes through a
// transactional producer of that partition (transactional id
// <group>.parked.<reports topic>.<partition>), claimed when the partition
// is recovered (recoverFirst), before its parked entries are read. Claiming
// it bumps the id's producer epoch: Kafka aborts the previous owner's open
// transaction and refuses every later one of its (PRODUCER_FENCED), so an
// owner that lost the partition without being told — paused past its
// session, on a partitioned network — can no longer write the state after
// its successor's (a delivered report brought back into <prefix>.parked).
// Readers of <prefix>.parked read committed records only (readParked,
// readRange). The pause fence (pausefence.go) still keeps such an owner
// from posting at all when it notices its pause; this fence closes the
// window between that check and the write.
//
// Writes are group-committed: writes that arrive while a transaction is
// under way share the next one, so 32 slow retries cost a few
// transactions, not 32. The main lane's first write of an entry was once
// left unfenced (recovery removes an entry whose parked Delivery record is
// missing), but an owner paused with the entry in its client's buffer, not
// yet sent, wrote it on waking after its successor had delivered the report
// and removed it (TestParkedOwnerPausedPastSession, with a longer producer
// linger): it is fenced like the rest.

// parkTxnTimeout is the fence's transaction timeout: a transaction left
// open by a paused process holds the readers of its partition of
// <prefix>.parked (read committed) at most this long.
const parkTxnTimeout = 10 * time.Second

// parkFence is the fence of one reports partition.
type parkFence struct {
	p  int32
	id string
	cl *kgo.Client

	mu     sync.Mutex
	queue  []*fenceWrite
	busy   bool  // a writer is committing (the others queue)
	fenced error // set once fenced: every later write fails with it
}

// fenceWrite is one record waiting for its transaction.
type fenceWrite struct {
	rec  *kgo.Record
	err  error
	done chan struct{}
}

// errFenced wraps the error of a write refused because another process
// claimed the partition's fence since (this one lost the partition).
var errFenced = errors.New("reporter: the partition's parked state is fenced: another reporter claimed it")

// fenceID is the transactional id of reports partition p's fence.
func (rn *run) fenceID(p int32) string {
	return fmt.Sprintf("%s.parked.%s.%d", rn.cfg.Group, rn.topics.Reports, p)
}

// claimFences claims the fences of parts (recoverFirst, before their
// parked entries are read), in parallel, and keeps them until the
// partitions are dropped. A fence already held is claimed again (its
// client is replaced).
func (rn *run) claimFences(ctx context.Context, parts []int32) error {
	base, err := rn.cfg.Kafka.ClientOpts()
	if err != nil {
		return fmt.Errorf("reporter: %w", err)
	}
	got := make([]*parkFence, len(parts))
	var g errgroup.Group
	for i, p := range parts {
		g.Go(func() error {
			f := &parkFence{p: p, id: rn.fenceID(p)}
			cl, err := kgo.NewClient(append(base,
				kgo.TransactionalID(f.id),
				kgo.TransactionTimeout(parkTxnTimeout),
				kgo.DefaultProduceTopic(rn.topics.Parked),
				kgo.RecordPartitioner(kgo.ManualPartitioner()),
				kgo.ProducerBatchCompression(kgo.NoCompression()),
			)...)
			if err != nil {
				return fmt.Errorf("parked-state fence of partition %d: %w", p, err)
			}
			// Loading the producer id claims the transactional id: the
			// previous owner is fenced from here on.
			if _, _, err := cl.ProducerID(ctx); err != nil {
				cl.Close()
				return fmt.Errorf("claim the parked-state fence %q: %w", f.id, err)
			}
			f.cl = cl
			got[i] = f
			return nil
		})
	}
	err = g.Wait()
	rn.fenceMu.Lock()
	defer rn.fenceMu.Unlock()
	if rn.fences == nil {
		rn.fences = map[int32]*parkFence{}
	}
	for _, f := range got {
		if f == nil {
			continue
		}
		if rn.fencesClosed { // the run ended meanwhile
			f.close()
			continue
		}
		if old := rn.fences[f.p]; old != nil {
			old.close()
		}
		rn.fences[f.p] = f
	}
	return err
}

// fenceOf is the fence of reports partition p, or nil.
func (rn *run) fenceOf(p int32) *parkFence {
	rn.fenceMu.Lock()
	defer rn.fenceMu.Unlock()
	return rn.fences[p]
}

// dropFence closes the fence of reports partition p (the partition
// dropped by its revocation).
func (rn *run) dropFence(p int32) {
	rn.fenceMu.Lock()
	f := rn.fences[p]
	delete(rn.fences, p)
	rn.fenceMu.Unlock()
	if f != nil {
		f.close()
	}
}

// closeFences closes every fence (the run's end).
func (rn *run) closeFences() {
	rn.fenceMu.Lock()
	fs := rn.fences
	rn.fences, rn.fencesClosed = nil, true
	rn.fenceMu.Unlock()
	for _, f := range fs {
		f.close()
	}
}

func (f *parkFence) close() {
	f.mu.Lock()
	if f.fenced == nil {
		f.fenced = fmt.Errorf("%w (the fence of partition %d is closed)", errFenced, f.p)
	}
	f.mu.Unlock()
	f.cl.Close()
}

// parkWrite writes rec, a record of reports partition p's parked state,
// through p's fence and waits for its transaction's commit, or for the end
// of the run.
func (rn *run) parkWrite(p int32, rec *kgo.Record) (*kgo.Record, error) {
	f := rn.fenceOf(p)
	if f == nil {
		return nil, fmt.Errorf("%w (partition %d has no fence in this run)", errFenced, p)
	}
	w := &fenceWrite{rec: rec, done: make(chan struct{})}
	f.mu.Lock()
	if f.fenced != nil {
		err := f.fenced
		f.mu.Unlock()
		return nil, err
	}
	f.queue = append(f.queue, w)
	if !f.busy {
		// This caller commits, for itself and whoever queues meanwhile.
		f.busy = true
		for len(f.queue) > 0 && f.fenced == nil {
			batch := f.queue
			f.queue = nil
			f.mu.Unlock()
			err := f.commit(rn.endCtx, batch)
			f.mu.Lock()
			if errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.TransactionalIDAuthorizationFailed) {
				f.fenced = fmt.Errorf("%w: %w", errFenced, err)
			}
		}
		for _, q := range f.queue { // fenced: the rest fail alike
			q.err = f.fenced
			close(q.done)
		}
		f.queue = nil
		f.busy = false
	}
	f.mu.Unlock()
	select {
	case <-w.done:
		return w.rec, w.err
	case <-rn.coordDone:
		return nil, errRunEnded
	}
}

// commit writes batch in one transaction and tells each write its
// outcome; the error is the transaction's. A record Kafka fails aborts the
// transaction: every write of the batch fails. ctx ends with the run: its
// records fail then, and the transaction is left to the coordinator's
// timeout or the next owner's claim.
func (f *parkFence) commit(ctx context.Context, batch []*fenceWrite) error {
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	fail := func(err error) error {
		for _, w := range batch {
			if w.err == nil {
				w.err = err
			}
		}
		return err
	}
	if err := f.cl.BeginTransaction(); err != nil {
		return fail(fmt.Errorf("begin a transaction of the parked-state fence %q: %w", f.id, err))
	}
	var wg sync.WaitGroup
	wg.Add(len(batch))
	for _, w := range batch {
		f.cl.Produce(ctx, w.rec, func(r *kgo.Record, err error) {
			w.rec = r
			if err != nil {
				w.err = fmt.Errorf("write %s through the parked-state fence %q: %w", r.Topic, f.id, err)
			}
			wg.Done()
		})
	}
	wg.Wait()
	end := kgo.TryCommit
	var first error
	for _, w := range batch {
		if w.err != nil {
			end, first = kgo.TryAbort, w.err
			break
		}
	}
	if err := f.cl.EndTransaction(ctx, end); err != nil {
		return fail(fmt.Errorf("end a transaction of the parked-state fence %q: %w", f.id, err))
	}
	if first != nil {
		return fail(fmt.Errorf("%w (its transaction aborted)", first))
	}
	return nil
}
