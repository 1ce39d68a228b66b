package reporter

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
)

// secondPostAPI answers a report's first post 401 (retried at once, with a
// new session) and its second post 200 after a pause, having said on
// second that the second post began.
type secondPostAPI struct {
	posts  atomic.Int32
	second chan struct{}
}

func (a *secondPostAPI) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	if a.posts.Add(1) == 1 {
		return partnerapi.ReportResult{}, &partnerapi.Error{Kind: partnerapi.KindUnauthorized, Op: "POST /partners/royalty-tracking", Status: 401}
	}
	close(a.second)
	// No synchronisation with the test from here: what the first post's
	// worker and its record's callback do meanwhile is concurrent with
	// this post's answer being applied.
	time.Sleep(200 * time.Millisecond)
	return partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200}, Message: "ok"}, nil
}

func (a *secondPostAPI) Session(context.Context) (partnerapi.Meta, error) {
	return partnerapi.Meta{Status: 200}, nil
}

// TestRetryWhileTheFirstAnswerLands: a report answered 401 is posted again
// at once by another worker while the first answer's Delivery record is
// still on its way: the first worker is held in the Kafka client's
// Produce (its buffer full), and the record then fails (the client
// closes), marking the report in doubt under its partition's lock. The
// first worker must not read the report's decision after handing it back
// (run.mu released: the second post writes it), and the second post must
// read the doubt under the partition's lock. Run it under -race: both were
// data races before the doubt moved under the partition's lock.
func TestRetryWhileTheFirstAnswerLands(t *testing.T) {
	rn, ps := bareRun(t, 4, 0)
	rn.log = testLogger(t)
	api := &secondPostAPI{second: make(chan struct{})}
	rn.api = api
	// A client that reaches no broker and buffers one record: the filler
	// takes the room, so the first answer's Produce blocks until Close.
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.DefaultProduceTopic("p.deliveries"),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.MaxBufferedRecords(1))
	if err != nil {
		t.Fatal(err)
	}
	rn.cl, rn.prod = cl, []*kgo.Client{cl}
	var closeOnce sync.Once
	closeCl := func() { closeOnce.Do(cl.Close) }
	t.Cleanup(closeCl)
	cl.Produce(context.Background(), &kgo.Record{Value: []byte("filler")}, nil)

	rec := &kgo.Record{Topic: "p.reports", Offset: 0}
	seq := ps.wm.add(rec.Offset, 0, time.Now().UnixNano())
	rn.fresh.push(&job{ps: ps, seq: seq, rec: rec, id: "report-0", body: []byte(`{}`)})

	done := make(chan struct{})
	var wg sync.WaitGroup
	// The leaser, its markers acknowledged at once (no Kafka).
	wg.Go(func() {
		var logOff int64
		for {
			select {
			case <-done:
				return
			case <-rn.leaseWake:
			case <-time.After(time.Millisecond):
			}
			rn.takeLeases(func(l *lease, marks []partLease) {
				for _, m := range marks {
					rn.leaseAcked(l, m.ps, &kgo.Record{Offset: logOff}, nil)
					logOff++
				}
			})
		}
	})
	var workers sync.WaitGroup
	for range 4 {
		workers.Go(rn.worker)
	}

	select {
	case <-api.second:
	case <-time.After(10 * time.Second):
		t.Fatal("the report was not posted again within 10 s")
	}
	closeCl() // the first answer's record fails: the report is in doubt

	// The second answer's record fails too (client closed): the run stops.
	waitFor(t, 10*time.Second, rn.stopping.Load)
	close(done)
	rn.mu.Lock()
	rn.exiting = true
	rn.idle = 0
	rn.cond.Broadcast()
	rn.mu.Unlock()
	workers.Wait()
	wg.Wait()
	if n := api.posts.Load(); n != 2 {
		t.Fatalf("%d posts, want 2", n)
	}
}
