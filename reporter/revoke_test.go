package reporter

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
)

// closedClient is a Kafka client that was never connected and is closed:
// its produce callbacks fail at once with kgo.ErrClientClosed, and it is in
// no group (commit skips its request).
func closedClient(t *testing.T) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.DefaultProduceTopic("p.deliveries"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	cl.Close()
	return cl
}

// TestRevokeWhileCommitsStart: onRevoked (the Kafka client's group
// goroutine) waits for the periodic commit in flight while the coordinator
// starts the next one, as in a rebalance during steady commits. With a
// sync.WaitGroup, a Wait that overlaps an Add from zero is a misuse: the
// race detector reports it, and the runtime may panic with "WaitGroup is
// reused before previous Wait has returned" (the process dies in a
// rebalance). Run it under -race.
func TestRevokeWhileCommitsStart(t *testing.T) {
	rn, _ := bareRun(t, 1, 0)
	rn.log = testLogger(t)
	rn.cl = closedClient(t)
	rn.prod = []*kgo.Client{rn.cl}
	ctx := context.Background()
	delete(rn.parts, tpKey{"p.reports", 0})

	// The coordinator's part: periodic commits back to back (one in
	// flight, as its pace allows) and revocations answered in between.
	stop := make(chan struct{})
	coordinator := make(chan struct{})
	go func() {
		defer close(coordinator)
		commitDone := make(chan struct{}, 1)
		rn.commitWG.Go(func() { rn.commit(ctx, "periodic", nil); commitDone <- struct{}{} })
		for {
			select {
			case <-stop:
				<-commitDone
				return
			case req := <-rn.revokeCh:
				rn.startRevocation(req)
				rn.checkRevocations(rn.cfg.Now())
			case <-commitDone:
				rn.commitWG.Go(func() { rn.commit(ctx, "periodic", nil); commitDone <- struct{}{} })
			}
		}
	}()
	// The group goroutine's part: a partition assigned and revoked, again
	// and again.
	for range 300 {
		ps := &partState{key: tpKey{"p.reports", 0}, unsure: map[*job]struct{}{}, recovered: map[int64]recState{}}
		rn.partsMu.Lock()
		rn.parts[ps.key] = ps
		rn.partsMu.Unlock()
		rn.onRevoked(ctx, map[string][]int32{"p.reports": {0}}, false)
	}
	close(stop)
	<-coordinator
	rn.commitWG.Wait()
}
