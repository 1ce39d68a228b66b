package kafkax

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TimeoutError is the error of a wait on Kafka that ran past its bound: a
// broker that does not answer (frozen, cut off) ends the wait, named,
// instead of holding it forever or passing for an answer.
type TimeoutError struct {
	Role    string // who waited ("replay", "reporter"): the message's prefix
	Brokers []string
	Timeout time.Duration
	Setting string // what sets Timeout ("--kafka-timeout"), or ""
	Step    string // what the role waited for
	Err     error  // the step's own error
}

func (e *TimeoutError) Error() string {
	set := ""
	if e.Setting != "" {
		set = " (" + e.Setting + ")"
	}
	return fmt.Sprintf("%s: Kafka (%s) did not answer within %s%s while %s: %v",
		e.Role, strings.Join(e.Brokers, ","), e.Timeout, set, e.Step, e.Err)
}

func (e *TimeoutError) Unwrap() error { return e.Err }

// Waits bounds each wait of a role on Kafka by Timeout; its errors name
// the role, the brokers and what sets the bound.
type Waits struct {
	Timeout time.Duration
	Brokers []string
	Role    string
	Setting string // the flag of Timeout, if any (TimeoutError.Setting)
}

// errWaitOver is the cause of a step's context whose Timeout ran out.
var errWaitOver = errors.New("kafka wait over")

// Do runs one step against Kafka (an admin request, a produce's
// acknowledgement) with ctx bounded by the timeout, and waits for it no
// longer than that: franz-go dials a new connection with a dial timeout of
// its own, whatever the context says (a frozen broker held a 2 s request
// for 19 s), and holds a record whose produce request is not answered. When
// the bound, not ctx, ended the step, the error is a *TimeoutError naming
// it. A step given up on finishes in the background (its own timeouts end
// it); fn must not write what the caller reads after an error.
func (w Waits) Do(ctx context.Context, step string, fn func(context.Context) error) error {
	sctx, cancel := context.WithTimeoutCause(ctx, w.Timeout, errWaitOver)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- fn(sctx) }() // owned by this call; past the bound, by franz-go's own timeouts
	select {
	case err := <-done:
		if err == nil || ctx.Err() != nil || !errors.Is(context.Cause(sctx), errWaitOver) {
			return err
		}
		return w.TimedOut(step, err)
	case <-sctx.Done():
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return w.TimedOut(step, context.DeadlineExceeded)
	}
}

// TimedOut is the error of step when its bound ran out.
func (w Waits) TimedOut(step string, err error) error {
	return &TimeoutError{Role: w.Role, Brokers: w.Brokers, Timeout: w.Timeout, Setting: w.Setting, Step: step, Err: err}
}

// ReadRanges is the one reader of "a log up to its end" (the reporter's
// recovery, replay): it reads the records of topic in ranges ([from, to)
// by partition, read_committed) and calls fn for each, in offset order per
// partition.
//
// The end is the broker's word, never a silence: each range is clipped to
// the partition's start and last stable offset as the broker lists them
// when the read begins, and a partition is read once a record at or past
// its last offset came. Transaction markers are fetched too (never passed
// to fn), so a range whose last offsets hold a marker or an aborted
// transaction still ends on a record. A broker that lists nothing within
// w.Timeout, or sends no record of a range not read yet for w.Timeout (a
// frozen or cut-off broker, a slow partition's leader while the others
// answer), ends the read with a *TimeoutError naming the partitions left:
// the caller fails loudly or tries again, it never takes the read as done.
func ReadRanges(ctx context.Context, w Waits, opts []kgo.Opt, topic string, ranges map[int32][2]int64, fn func(*kgo.Record) error) error {
	parts := map[int32]kgo.Offset{}
	for p, rg := range ranges {
		if rg[1] > rg[0] {
			parts[p] = kgo.NewOffset().At(rg[0])
		}
	}
	if len(parts) == 0 {
		return nil
	}
	opts = append(slices.Clone(opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: parts}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords(),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("read %s: %w", topic, err)
	}
	// A reader holds no group and nothing to flush: a second bounds its
	// close, which a frozen broker would hold for the requests in flight.
	defer CloseClient(cl, time.Second)

	// The ends, listed once at the start: what was committed to the log
	// then is what the read waits for.
	var starts, ends kadm.ListedOffsets
	err = w.Do(ctx, "listing the offsets of "+topic, func(ctx context.Context) error {
		adm := kadm.NewClient(cl)
		var err error
		if starts, err = adm.ListStartOffsets(ctx, topic); err == nil {
			err = starts.Error()
		}
		if err == nil {
			if ends, err = adm.ListCommittedOffsets(ctx, topic); err == nil {
				err = ends.Error()
			}
		}
		return err
	})
	if err != nil {
		var te *TimeoutError
		if errors.As(err, &te) {
			return err
		}
		return fmt.Errorf("read %s: list offsets: %w", topic, err)
	}
	next := map[int32]int64{} // partitions not read yet: the next offset wanted
	to := map[int32]int64{}   // … and the offset their read ends before
	for p := range parts {
		s, sok := starts.Lookup(topic, p)
		e, eok := ends.Lookup(topic, p)
		if !sok || !eok {
			return fmt.Errorf("read %s: the broker listed no offsets for partition %d", topic, p)
		}
		lo, hi := max(ranges[p][0], s.Offset), min(ranges[p][1], e.Offset)
		if lo < hi {
			next[p], to[p] = lo, hi
		}
	}
	last := time.Now() // the last record of a range not read yet
	for len(next) > 0 {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && ferr == nil {
				ferr = fmt.Errorf("read %s/%d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var rerr error
		fs.EachRecord(func(r *kgo.Record) {
			n, ok := next[r.Partition]
			if !ok || rerr != nil || r.Offset < n {
				return
			}
			last = time.Now()
			if r.Offset < to[r.Partition] && !r.Attrs.IsControl() {
				rerr = fn(r)
			}
			if next[r.Partition] = r.Offset + 1; r.Offset+1 >= to[r.Partition] {
				delete(next, r.Partition)
			}
		})
		if rerr != nil {
			return rerr
		}
		if len(next) > 0 && time.Since(last) > w.Timeout {
			left := make([]string, 0, len(next))
			for _, p := range slices.Sorted(maps.Keys(next)) {
				left = append(left, fmt.Sprintf("%d at %d of %d", p, next[p], to[p]))
			}
			return w.TimedOut("reading "+topic+" to the end offsets listed at the start",
				fmt.Errorf("no record for %s; partitions left: %s", time.Since(last).Round(time.Millisecond), strings.Join(left, ", ")))
		}
	}
	return nil
}
