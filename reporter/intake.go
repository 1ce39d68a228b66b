package reporter

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// fetched is a record with its decoded track play.
type fetched struct {
	rec *kgo.Record
	tp  schemas.TrackPlayHead // the report body stays raw: the exact bytes are posted
	err error
}

// describeTopics learns the reports topic's id (for offset commits) and the
// deliveries topic's partitions and their end offsets (where the records of
// this run will start).
//
// <prefix>.parked is the reporter's own: created (compacted) when missing,
// and checked: a topic that is not compacted stops the start with an error
// wrapping ErrInvalidConfig (kafkax.EnsureParked).
func (rn *run) describeTopics(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var err error
	for attempt := 0; ; attempt++ {
		if _, err = kafkax.EnsureParked(ctx, rn.adm, rn.cfg.Kafka); errors.Is(err, kafkax.ErrParkedNotCompacted) {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond) // the broker not ready yet: waits on the broker, the real clock on purpose (clock.go)
			continue
		}
		var tds kadm.TopicDetails
		tds, err = rn.adm.ListTopics(ctx, rn.topics.Reports, rn.topics.Deliveries, rn.topics.Parked)
		if err == nil {
			err = tds.Error()
		}
		if err == nil {
			rn.reportsID = tds[rn.topics.Reports].ID
			rn.logParts = int32(len(tds[rn.topics.Deliveries].Partitions))
			rn.parkedParts = int32(len(tds[rn.topics.Parked].Partitions))
			var ends kadm.ListedOffsets
			if ends, err = rn.adm.ListEndOffsets(ctx, rn.topics.Deliveries); err == nil {
				err = ends.Error()
			}
			if err == nil {
				ends.Each(func(o kadm.ListedOffset) { rn.logStart[o.Partition] = o.Offset })
				if rn.logParts > 0 && rn.parkedParts > 0 {
					return nil
				}
				err = errors.New("no partitions")
			}
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond) // topics still being created: the real clock on purpose (clock.go)
	}
	return fmt.Errorf("reporter: describe topics %s, %s and %s: %w", rn.topics.Reports, rn.topics.Deliveries, rn.topics.Parked, err)
}

// poll fetches records and adds them to the state. Each partition holds at
// most about MaxPending records between its commit point and its newest
// fetched one: at the bound, fetching pauses for that partition alone
// (pauseFull), so a partition whose reports are all stuck never stops the
// others; markDone resumes it once half of the room is free. With
// BlockRebalanceOnPoll, a rebalance cannot slip between a poll and the
// intake, so the state never holds a record of a partition that was already
// revoked. A partition seen for the first time is recovered first: what its
// previous owner left in the commit metadata and the deliveries log
// (recover.go).
func (rn *run) poll(ctx context.Context) {
	for {
		fs := rn.cl.PollRecords(ctx, rn.cfg.MaxPending)
		if ctx.Err() != nil || fs.IsClientClosed() {
			rn.cl.AllowRebalance()
			return
		}
		fs.EachError(func(t string, p int32, err error) {
			rn.cfg.Kafka.Faults.Fetch(rn.log, t, p, err) // at most a line a minute per fault
		})
		recs := fs.Records()
		if len(recs) > 0 {
			if err := rn.recoverNew(ctx, recs); err != nil {
				rn.cl.AllowRebalance()
				if ctx.Err() == nil {
					rn.stop(err, true)
				}
				return
			}
			rn.pending.Add(int64(len(recs)))
			// Decode outside the lock.
			batch := make([]fetched, len(recs))
			for i, rec := range recs {
				batch[i].rec = rec
				batch[i].err = schemas.DecodeTrackPlayHead(rec.Value, &batch[i].tp)
			}
			for _, j := range rn.intake(batch) {
				rn.produce(rn.deliveryRecord(context.Background(), j), func(r *kgo.Record, err error) {
					rn.persisted(j, r, err)
				})
			}
			rn.pauseFull(recs)
		}
		rn.cl.AllowRebalance()
	}
}

// pauseFull pauses fetching of the partitions of recs that hold MaxPending
// records or more (no lock held). It pauses a full partition again even if
// it thinks it paused it: a resume that raced with the last pause may have
// undone it.
func (rn *run) pauseFull(recs []*kgo.Record) {
	var full map[string][]int32
	last := int32(-1)
	for _, r := range recs {
		if r.Partition == last {
			continue
		}
		last = r.Partition
		ps := rn.part(tpKey{r.Topic, r.Partition})
		if ps == nil {
			continue
		}
		ps.mu.Lock()
		if ps.wm.pending() >= rn.cfg.MaxPending && !ps.dropped.Load() {
			ps.paused = true
			if full == nil {
				full = map[string][]int32{}
			}
			if !slices.Contains(full[r.Topic], r.Partition) {
				full[r.Topic] = append(full[r.Topic], r.Partition)
			}
		}
		ps.mu.Unlock()
	}
	if full != nil {
		rn.cl.PauseFetchPartitions(full)
		rn.log.Debug("fetching paused for full partitions", "partitions", full, "max_pending", rn.cfg.MaxPending)
	}
}

// resumeIfRoom resumes fetching of ps once half of its room is free (ps.mu
// held; the client call runs on its own: no lock of ours around it).
func (rn *run) resumeIfRoom(ps *partState) {
	if !ps.paused || ps.wm.pending() >= rn.cfg.MaxPending/2 {
		return
	}
	ps.paused = false
	rn.unpause(ps)
}

// unpause resumes fetching of ps (any lock held: the call is made on its own
// goroutine). A revoked partition is resumed too: pauses outlive
// assignments in the Kafka client.
func (rn *run) unpause(ps *partState) {
	go rn.cl.ResumeFetchPartitions(map[string][]int32{ps.key.topic: {ps.key.partition}})
}

// jobRecord is a job and the slim copy of its fetched record, allocated
// together: one allocation per report instead of two (BenchmarkOverhead).
type jobRecord struct {
	job
	rec kgo.Record
}

// newJob makes the job of fetched record r (of report id and event id evID)
// with a small copy of r (slimRecord): the fetched record shares its memory
// with the whole fetched batch, which a pending report would pin.
func newJob(ps *partState, seq uint64, r *kgo.Record, id, evID string) *job {
	jr := &jobRecord{}
	slimRecord(&jr.rec, r)
	jr.job = job{ps: ps, seq: seq, rec: &jr.rec, id: id, evID: evID}
	return &jr.job
}

// slimRecord copies into c what the reporter keeps of a fetched record:
// where it came from and its headers (trace context), not its key and value.
func slimRecord(c, r *kgo.Record) {
	*c = kgo.Record{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, LeaderEpoch: r.LeaderEpoch}
	if len(r.Headers) > 0 {
		c.Headers = make([]kgo.RecordHeader, len(r.Headers))
		for i, h := range r.Headers {
			c.Headers[i] = kgo.RecordHeader{Key: strings.Clone(h.Key), Value: bytes.Clone(h.Value)}
		}
	}
}

// intake adds fetched records to their partitions' trackers, each
// partition's run of records under its lock, then queues them under the
// dispatch lock. It returns the records that cannot be posted, whose
// rejected Delivery record the caller publishes. No lock is held when it
// is called; no rebalance can drop a partition meanwhile (the poller holds
// rebalances until the intake is done).
func (rn *run) intake(batch []fetched) (invalid []*job) {
	var fresh, rq []*job
	now := rn.cfg.Now().UnixNano()
	for i := 0; i < len(batch); {
		key := tpKey{batch[i].rec.Topic, batch[i].rec.Partition}
		ps := rn.part(key) // created by recoverNew
		ps.mu.Lock()
		for ; i < len(batch) && batch[i].rec.Partition == key.partition && batch[i].rec.Topic == key.topic; i++ {
			rec, tp, err := batch[i].rec, &batch[i].tp, batch[i].err
			seq := ps.wm.add(rec.Offset, rec.LeaderEpoch, now)
			st, known := ps.recovered[rec.Offset]
			if known {
				delete(ps.recovered, rec.Offset)
				if st == recFinal {
					// Its final outcome is in the deliveries log already (a stop or
					// crash before the commit point passed it): never posted again.
					rn.met.skip(context.Background(), "final_before_restart")
					rq = rn.markDone(ps, seq, rq)
					continue
				}
			}
			switch {
			case err == nil && tp.ReportID != "" && tp.BelowMinimum:
				// Shorter than the minimum play length: counted in the ledger,
				// never posted. Final at once, unless past the progress window
				// (lease.go): then final when leasing reaches it.
				if rec.Offset < rn.commitBase(ps)+rn.window {
					rn.met.skip(context.Background(), "below_minimum")
					rq = rn.markDone(ps, seq, rq)
				} else {
					j := newJob(ps, seq, rec, tp.ReportID, tp.EventID)
					j.skip = true
					fresh = append(fresh, j)
				}
			case err != nil || tp.ReportID == "" || len(tp.Report) == 0 || tp.Report[0] != '{':
				// A record the reporter cannot post. It is published as rejected
				// with the reason, so it is never lost silently.
				msg := "invalid track play record: no report_id or report object"
				if err != nil {
					msg = "invalid track play record: " + err.Error()
				}
				rn.log.Error("invalid record on the reports topic", "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "err", msg)
				rn.met.skip(context.Background(), "invalid")
				j := newJob(ps, seq, rec, tp.ReportID, tp.EventID)
				j.dec = delivery.Decision{Action: delivery.ActRejected, Outcome: schemas.OutcomeRejected, Message: msg}
				ps.inflight++
				invalid = append(invalid, j)
			default:
				j := newJob(ps, seq, rec, tp.ReportID, tp.EventID)
				j.body = tp.Report
				j.track = trackKey(j.body)
				if known && st == recDoubt {
					// The previous owner may have posted it without recording the
					// answer: post it again, labelled, so the audit counts it.
					j.inDoubt = true
					j.carried = schemas.DoubtCrash
					ps.unsure[j] = struct{}{}
				}
				fresh = append(fresh, j)
			}
		}
		ps.mu.Unlock()
	}
	rn.mu.Lock()
	for _, j := range fresh {
		rn.fresh.push(j)
	}
	rn.pushReady(rq)
	rn.jobsReady()
	rn.mu.Unlock()
	return invalid
}
