package replay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// runner posts the selected reports.
type runner struct {
	cfg     Config
	w       waits
	api     *partnerapi.Client
	log     *slog.Logger
	cl      *kgo.Client
	topic   string
	kind    string
	lim     *rate.Limiter
	inDoubt bool

	posts, delivered, rejected, unfinished, found atomic.Int64
}

type job struct {
	it   item
	body []byte
}

// send records the run in its group (the offset ranges of the selected
// records of the reports topic, and the first run's start time, or now on
// a first run), posts the reports, and records how the run ended: done if
// every report got a final answer, stopped if it was interrupted with
// every post on record; a run that failed otherwise stays running, which
// the next run of the id reads as a crash.
func (r *runner) send(ctx context.Context, opts []kgo.Opt, adm *kadm.Client, group, reports string, items []item, pr prior, res *Result) error {
	var ranges map[int32][2]int64
	err := r.w.do(ctx, "listing the offsets of "+reports, func(ctx context.Context) (err error) {
		ranges, err = offsetRanges(ctx, adm, reports, items)
		return err
	})
	if err != nil {
		return err
	}
	startMS := pr.startMS
	if !pr.found {
		startMS = time.Now().UnixMilli()
	}
	err = r.w.do(ctx, "recording the run in group "+group, func(ctx context.Context) error {
		return commitRanges(ctx, adm, group, reports, ranges, startMS, stateRunning, pr.crashed)
	})
	if err != nil {
		return err
	}
	r.log.Info("replay started", "reason", r.cfg.Reason, "reports", len(items), "resumed", pr.found)
	err = r.run(ctx, opts, reports, ranges, items, res)
	state := ""
	switch {
	case err == nil:
		state = stateDone
	case errors.Is(err, context.Canceled):
		state = stateStopped // interrupted: every post it made has a record
	}
	if state != "" {
		cerr := r.w.do(context.WithoutCancel(ctx), "recording the end of the run in group "+group, func(ctx context.Context) error {
			return commitRanges(ctx, adm, group, reports, ranges, startMS, state, pr.crashed)
		})
		if cerr != nil {
			r.log.Warn("recording the end of the replay", "state", state, "err", cerr)
		}
	}
	return err
}

// run reads the selected records in ranges and posts their reports with
// cfg.Concurrency workers, filling in res.
func (r *runner) run(ctx context.Context, opts []kgo.Opt, reports string, ranges map[int32][2]int64, items []item, res *Result) error {
	// Delivery records are still published once ctx ends (the operator's
	// interrupt): an answer that came back, or a post that may have
	// reached the partner, is not left unrecorded (KafkaTimeout bounds
	// each wait). A run that fails (Kafka did not answer, the partner
	// refuses us) publishes nothing more.
	pubCtx, pubCancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer pubCancel(nil)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	want := make(map[int32]map[int64]item, len(ranges))
	for _, it := range items {
		if want[it.partition] == nil {
			want[it.partition] = map[int64]item{}
		}
		want[it.partition][it.offset] = it
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := r.deliver(ctx, pubCtx, j); err != nil {
					pubCancel(err)
					cancel(err)
				}
			}
		}()
	}
	stopProgress := r.startProgress(len(items))
	readErr := readRanges(ctx, r.w, opts, reports, ranges, func(rec *kgo.Record) error {
		return r.enqueue(ctx, reports, want, rec, jobs)
	})
	close(jobs)
	wg.Wait()
	stopProgress()
	r.progress(len(items))
	interrupted := readErr != nil || ctx.Err() != nil
	for _, m := range want {
		if interrupted {
			res.Untried += len(m) // never read: a re-run of the id sends them
		} else {
			res.Missing += len(m)
		}
	}
	res.Posts, res.Delivered, res.Rejected, res.Unfinished = int(r.posts.Load()), int(r.delivered.Load()), int(r.rejected.Load()), int(r.unfinished.Load())
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if readErr != nil {
		return readErr
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return r.problems(reports, want, res)
}

// startProgress writes a progress line every cfg.Progress (if > 0) until
// the returned function is called; that function waits for the last line.
func (r *runner) startProgress(total int) (stop func()) {
	progressDone := make(chan struct{})
	var pwg sync.WaitGroup
	if r.cfg.Progress > 0 {
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			t := time.NewTicker(r.cfg.Progress)
			defer t.Stop()
			for {
				select {
				case <-progressDone:
					return
				case <-t.C:
					r.progress(total)
				}
			}
		}()
	}
	return func() {
		close(progressDone)
		pwg.Wait()
	}
}

// enqueue hands the report of rec to the workers if rec is one of want
// (removing it from want), after checking it is the track play the ledger
// names.
func (r *runner) enqueue(ctx context.Context, reports string, want map[int32]map[int64]item, rec *kgo.Record, jobs chan<- job) error {
	it, ok := want[rec.Partition][rec.Offset]
	if !ok {
		return nil
	}
	var tp schemas.TrackPlayHead
	if err := schemas.DecodeTrackPlayHead(rec.Value, &tp); err != nil || tp.ReportID != it.reportID || len(tp.Report) == 0 {
		return fmt.Errorf("replay: %s/%d@%d is not the track play %s the ledger names (%v)", reports, rec.Partition, rec.Offset, it.reportID, err)
	}
	delete(want[rec.Partition], rec.Offset)
	r.found.Add(1)
	select {
	case jobs <- job{it: it, body: tp.Report}:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// problems is the error of a run that ended with selected reports not
// found (want: those left) or without a final answer; nil if none.
func (r *runner) problems(reports string, want map[int32]map[int64]item, res *Result) error {
	var problems []string
	if res.Missing > 0 {
		var ids []string
		for _, m := range want {
			for _, it := range m {
				ids = append(ids, it.reportID)
			}
		}
		sort.Strings(ids)
		problems = append(problems, fmt.Sprintf("%d selected reports not found in %s (retention?), e.g. %s", res.Missing, reports, ids[0]))
	}
	if res.Unfinished > 0 {
		problems = append(problems, fmt.Sprintf("%d reports without a final answer after %d attempts: run again with --replay-id %s", res.Unfinished, r.cfg.MaxAttempts, r.cfg.ReplayID))
	}
	if len(problems) > 0 {
		return errors.New("replay: " + strings.Join(problems, "; "))
	}
	return nil
}

func (r *runner) progress(total int) {
	fmt.Fprintf(r.cfg.Out, "%s %s: %d/%d found, %d posts, %d delivered, %d rejected, %d unfinished\n",
		r.kind, r.cfg.ReplayID, r.found.Load(), total, r.posts.Load(), r.delivered.Load(), r.rejected.Load(), r.unfinished.Load())
}

// deliver posts one report until a final answer or MaxAttempts, publishing
// every answer with pubCtx (see run). It returns an error only when the
// whole run must stop.
//
// Doubt is labelled as the reporter labels it (delivery.Doubt, one
// Delivery builder for both): a post in doubt (its request may have left,
// no complete answer of the API came back) carries its cause, and every
// later record of the report says in_doubt; on a resumed run every report
// re-posted is in doubt from its first record on (carrying
// schemas.DoubtCrash), since the earlier run may have posted it without
// recording the answer. A post cancelled after its request may have left
// gets a record of its own (cause cancelled, outcome retry): no later post
// of the run will carry it. The answer of a post that came back is
// recorded even when the run is stopping.
func (r *runner) deliver(ctx, pubCtx context.Context, j job) error {
	backoff := r.cfg.BackoffInitial
	var doubt delivery.Doubt
	switch {
	case r.inDoubt:
		doubt = delivery.Doubt{InDoubt: true, Carried: schemas.DoubtCrash}
	case j.it.inDoubt:
		doubt = delivery.Doubt{InDoubt: true} // its cause is on the live reporter's record
	}
	for attempt := 1; ; attempt++ {
		if r.lim != nil {
			if err := r.lim.Wait(ctx); err != nil {
				return nil // stopping
			}
		}
		r.posts.Add(1)
		start := time.Now()
		res, err := r.api.ReportPlayJSON(ctx, j.body)
		lat := res.Latency
		if lat <= 0 {
			lat = time.Since(start) // a failed post: its own round trip, as the reporter records it
		}
		dec := delivery.Classify(res, err, r.cfg.LiveBypassDelivered)
		if dec.Action == delivery.ActAbandon && dec.Doubt == "" {
			return nil // cancelled before its request left: nothing to record
		}
		doubt.Posted(dec, true)
		d := delivery.New(&delivery.Attempt{ReportID: j.it.reportID, EventID: j.it.eventID, N: attempt, Decision: dec,
			Latency: lat, Partner: r.cfg.Partner, ReplayID: r.cfg.ReplayID, ReplayReason: r.cfg.Reason, At: time.Now()}, &doubt)
		if dec.Action != delivery.ActStop {
			val, merr := json.Marshal(d)
			if merr != nil {
				return fmt.Errorf("replay: encode delivery: %w", merr)
			}
			if perr := r.publish(pubCtx, &kgo.Record{Topic: r.topic, Key: []byte(d.ReportID), Value: val}); perr != nil {
				return perr
			}
		}
		switch dec.Action {
		case delivery.ActDelivered:
			r.delivered.Add(1)
			return nil
		case delivery.ActRejected:
			r.rejected.Add(1)
			r.log.Warn("report rejected", "report_id", d.ReportID, "message", d.Message)
			return nil
		case delivery.ActStop:
			return fmt.Errorf("replay: the partner API refuses us (configuration): %w", dec.Err)
		case delivery.ActAbandon:
			return nil // stopping; a re-run of the id posts it again
		}
		if ctx.Err() != nil {
			return nil // stopping
		}
		if attempt >= r.cfg.MaxAttempts {
			r.unfinished.Add(1)
			r.log.Warn("no final answer", "report_id", d.ReportID, "attempts", attempt, "last", d.Outcome, "reason", d.Reason)
			return nil
		}
		wait := max(backoff, dec.RetryAfter)
		backoff = min(2*backoff, r.cfg.BackoffMax)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// publish produces rec (the Delivery record of one answer) and waits for
// its acknowledgement, at most KafkaTimeout (waits.do: franz-go holds a
// record whose request a frozen broker never answers for its request
// timeouts and retries, whatever the record's context says). Past the
// bound the run ends; the record's fate is unknown (it may still land) and
// a re-run of the id reads the deliveries log before it posts anything
// again.
func (r *runner) publish(ctx context.Context, rec *kgo.Record) error {
	return r.w.do(ctx, fmt.Sprintf("publishing the answer for %s to %s", rec.Key, r.topic), func(ctx context.Context) error {
		if err := r.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			return fmt.Errorf("replay: publish the answer for %s to %s: %w", rec.Key, r.topic, err)
		}
		return nil
	})
}
