package analytics

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"
)

// sliceWorkers is how many slices the audit reads at once. Each slice's
// queries then run with 1/sliceWorkers of the memory limit and of the
// server's threads, so the audit's queries together stay within
// --max-memory and the server's cores. On two cores, two slices of one
// thread each cost less than one slice after another on two threads: the
// two threads' hash tables of one GROUP BY each hold most of the slice's
// reports and are merged at the end (measured on a slice of the 50 M bench
// ledger: 1.05 CPU-s on two threads, 0.83 on one). docs/audit.md, "The
// audit at scale".
const sliceWorkers = 2

// sliceOut is what the queries of one slice found, merged into the audit
// in slice order (auditSliced).
type sliceOut struct {
	ts []sliceTotals
	// joined: the delays of the slice's plays without their event's time,
	// when more than maxLookups (sliceUncarriedDelays); else they are in
	// ts' uncarriedPlays, to be looked up.
	joined map[int64]uint64
	causes map[string]uint64
	// partners and sandbox, read by slicePartners when a play of the slice
	// has records from more than one partner target; else in ts.
	partners map[string]*PartnerCount
	sandbox  uint64
	replays  map[string]*ReplayCount
}

// readSlice runs the queries of slice i of plan.
func (a *Auditor) readSlice(ctx context.Context, o AuditOptions, plan []slice, i int, x firstRecords, sandboxes string, targets []string) (sliceOut, error) {
	s := plan[i]
	name := fmt.Sprintf("plays, slice %d/%d (%s)", i+1, len(plan), s)
	sctx := withCheck(ctx, o, name)
	var out sliceOut
	var err error
	if out.ts, err = a.sliceParts(sctx, o, s, name, sandboxes, x, targets); err != nil {
		return out, err
	}
	var uncarried uint64
	var doubtful, multiPartner, replayed bool
	for _, t := range out.ts {
		uncarried += t.uncarried
		doubtful = doubtful || t.doubtful > 0
		multiPartner = multiPartner || t.multiPartner > 0
		replayed = replayed || t.replayed > 0
	}
	if uncarried > uint64(a.limits.maxLookups()) {
		out.joined = map[int64]uint64{}
		uctx := withCheck(ctx, o, fmt.Sprintf("delay of plays without their event's time, slice %d/%d (%s)", i+1, len(plan), s))
		if err := a.sliceUncarriedDelays(uctx, o, s, x, out.joined); err != nil {
			return out, err
		}
	}
	if doubtful {
		out.causes = map[string]uint64{}
		if err := a.sliceCauses(sctx, o, s, out.causes); err != nil {
			return out, err
		}
	}
	if multiPartner {
		out.partners = map[string]*PartnerCount{}
		var sub Audit
		if err := a.slicePartners(sctx, o, s, out.partners, sandboxes, &sub); err != nil {
			return out, err
		}
		out.sandbox = sub.DeliveredToSandbox
	}
	if replayed {
		out.replays = map[string]*ReplayCount{}
		if err := a.sliceReplays(sctx, o, s, out.replays); err != nil {
			return out, err
		}
	}
	return out, nil
}

// eachSlice reads slices 0 … n-1 with read, sliceWorkers at once, and
// hands each to merge in slice order, from one goroutine. At most
// 2·sliceWorkers slices are read ahead of the merge. merge gets the slots
// of the reads at once: a query it runs takes one (send to slots, then
// receive). The first error ends the others.
func (a *Auditor) eachSlice(ctx context.Context, n int, read func(context.Context, int) (sliceOut, error),
	merge func(context.Context, int, sliceOut, chan struct{}) error) error {
	g, gctx := errgroup.WithContext(ctx)
	slots := make(chan struct{}, sliceWorkers)
	ahead := make(chan struct{}, 2*sliceWorkers)
	outs := make([]chan sliceOut, n)
	for i := range outs {
		outs[i] = make(chan sliceOut, 1)
	}
	g.Go(func() error {
		for i := range n {
			select {
			case ahead <- struct{}{}:
			case <-gctx.Done():
				return gctx.Err()
			}
			select {
			case slots <- struct{}{}:
			case <-gctx.Done():
				return gctx.Err()
			}
			g.Go(func() error {
				defer func() { <-slots }()
				out, err := read(gctx, i)
				if err != nil {
					return err
				}
				outs[i] <- out
				return nil
			})
		}
		return nil
	})
	g.Go(func() error {
		for i := range n {
			var out sliceOut
			select {
			case out = <-outs[i]:
			case <-gctx.Done():
				return gctx.Err()
			}
			<-ahead
			if err := merge(gctx, i, out, slots); err != nil {
				return err
			}
		}
		return nil
	})
	return g.Wait()
}

// serverThreads is the server's max_threads for this user (its cores by
// default), 0 when it cannot be read.
func (a *Auditor) serverThreads(ctx context.Context, o AuditOptions) int {
	var v string
	if err := a.row(withCheck(ctx, o, "server threads"), `SELECT value FROM system.settings WHERE name = 'max_threads'`, &v); err != nil {
		return 0
	}
	// "2" on 18.16; "'auto(16)'" on current releases.
	digits := strings.TrimFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	n, err := strconv.Atoi(digits)
	if err != nil {
		return 0
	}
	return n
}
