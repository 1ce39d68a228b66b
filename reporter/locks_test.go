package reporter

import (
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// TestSnapshotsWhileAnswersLand drives the partition lock's invariant with
// real concurrency: workers take leased reports and apply their answers,
// a leaser leases, one goroutine acknowledges the lease markers and
// Delivery records in log order (as the Kafka client does for one
// partition), and another takes progress snapshots all the while. Every
// snapshot must be one a next owner can trust: each record acknowledged
// below its LogOffset has its change in it — a final answer's report is
// below Base or in Done (else the next owner, reading the log from
// LogOffset, would post a final report again), and a lease marker's
// reports are below Base, in Done or in Doubt (else a report that may be at
// the partner would be posted again unlabelled). Run under -race, it also
// checks that every field is touched under its lock.
func TestSnapshotsWhileAnswersLand(t *testing.T) {
	const (
		conc    = 8
		reports = 3000
		workers = 6
	)
	rn, ps := bareRun(t, conc, 0)
	rn.log = testLogger(t)
	now := time.Now().UnixNano()
	for i := range reports {
		rec := &kgo.Record{Topic: "p.reports", Offset: int64(i)}
		seq := ps.wm.add(rec.Offset, 0, now)
		rn.fresh.push(&job{ps: ps, seq: seq, rec: rec, id: "report-" + strconv.Itoa(i), body: []byte(`{}`)})
	}

	// What the log holds, by log offset: the report offsets a record is
	// about (recorded before the record is applied, as the log has it
	// before the client's callback runs).
	type logRec struct {
		final   bool
		offsets []int64
	}
	var logMu sync.Mutex
	var logRecs []logRec
	type event struct {
		l   *lease // a lease marker
		ps  *partState
		j   *job // a final Delivery record
		off []int64
	}
	events := make(chan event, 1024)
	var finals atomic.Int64
	var wg sync.WaitGroup
	done := make(chan struct{})

	// The Kafka client's callbacks: one at a time, in log order.
	wg.Go(func() {
		for ev := range events {
			logMu.Lock()
			o := int64(len(logRecs))
			logRecs = append(logRecs, logRec{final: ev.j != nil, offsets: ev.off})
			logMu.Unlock()
			r := &kgo.Record{Partition: 0, Offset: o}
			if ev.l != nil {
				rn.leaseAcked(ev.l, ev.ps, r, nil)
				continue
			}
			rn.recorded()
			rn.persisted(ev.j, r, nil)
			if finals.Add(1) == reports {
				close(done)
			}
		}
	})
	var producers sync.WaitGroup
	// The leaser.
	producers.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-rn.leaseWake:
			case <-time.After(time.Millisecond): // a lost wake-up would show as a slow test, not a hang
			}
			rn.takeLeases(func(l *lease, marks []partLease) {
				for _, m := range marks {
					p := m.ps
					var offs []int64
					for _, j := range l.jobs {
						if j.ps == p {
							offs = append(offs, j.rec.Offset)
						}
					}
					events <- event{l: l, ps: p, off: offs}
				}
			})
		}
	})
	// The workers: the answer applied, then its record handed to Kafka.
	for range workers {
		producers.Go(func() {
			var last *job
			for {
				rn.mu.Lock()
				if last != nil {
					rn.inflight--
					rn.posted(last)
					rn.unrecorded++
				}
				j := rn.next()
				rn.mu.Unlock()
				if last != nil {
					events <- event{j: last, off: []int64{last.rec.Offset}}
				}
				last = j
				if j == nil {
					select {
					case <-done:
						return
					case <-time.After(100 * time.Microsecond): // polls for leased reports instead of cond: the test's own wait
					}
					continue
				}
				j.attempt++
				j.dec = delivery.Decision{Action: delivery.ActDelivered, Outcome: schemas.OutcomeDelivered, Status: 200}
				j.latency, j.held = time.Millisecond, time.Millisecond
			}
		})
	}

	// The snapshots.
	snapshots, checked := 0, 0
	check := func() {
		ps.mu.Lock()
		ps.dirty = true
		ps.mu.Unlock()
		batch := rn.dirtyProgress()
		if len(batch) != 1 {
			t.Fatalf("snapshot of %d partitions, want 1", len(batch))
		}
		p, err := decodeProgress(batch[0].meta, batch[0].offset)
		if err != nil {
			t.Fatalf("snapshot: %v", err)
		}
		snapshots++
		logMu.Lock()
		recs := slices.Clone(logRecs[:min(int(p.LogOffset), len(logRecs))])
		logMu.Unlock()
		if int(p.LogOffset) > len(recs) && int(p.LogOffset) > 0 {
			t.Fatalf("LogOffset %d past the %d records in the log", p.LogOffset, len(recs))
		}
		for lo, r := range recs {
			for _, o := range r.offsets {
				checked++
				switch {
				case o < p.Base, slices.Contains(p.Done, o):
				case r.final:
					t.Fatalf("log offset %d (< LogOffset %d) is the final record of report offset %d, but the snapshot has it neither below Base %d nor done: the next owner would post it again", lo, p.LogOffset, o, p.Base)
				case !slices.Contains(p.Doubt, o):
					t.Fatalf("log offset %d (< LogOffset %d) leases report offset %d, but the snapshot has it neither below Base %d, done nor in doubt", lo, p.LogOffset, o, p.Base)
				}
			}
		}
	}
	deadline := time.After(60 * time.Second)
loop:
	for {
		select {
		case <-done:
			break loop
		case <-deadline:
			t.Fatalf("%d of %d reports final after 60 s", finals.Load(), reports)
		default:
			check()
		}
	}
	producers.Wait()
	close(events)
	wg.Wait()
	check()
	ps.mu.Lock()
	base := rn.commitBase(ps)
	ps.mu.Unlock()
	if base != reports {
		t.Fatalf("commit point %d after every report was final, want %d", base, reports)
	}
	if snapshots < 10 {
		t.Fatalf("only %d snapshots taken while answers landed", snapshots)
	}
	t.Logf("%d snapshots, %d record offsets checked against them", snapshots, checked)
}
