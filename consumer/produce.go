package consumer

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// promise records the first produce error of the transaction, and every
// record Kafka refused for itself.
func (p *processor) promise(r *kgo.Record, err error) {
	if err != nil {
		p.errMu.Lock()
		if p.prodErr == nil {
			p.prodErr = err
		}
		if recordRefused(err) {
			p.refused = append(p.refused, r)
		}
		p.errMu.Unlock()
	}
}

func (p *processor) produceErr() error {
	p.errMu.Lock()
	defer p.errMu.Unlock()
	return p.prodErr
}

// srcLoc is where an event record was read.
type srcLoc struct {
	topic     string
	partition int32
	offset    int64
}

func (l srcLoc) String() string {
	return l.topic + "/" + strconv.Itoa(int(l.partition)) + "@" + strconv.FormatInt(l.offset, 10)
}

// evSpan is an event of the open transaction and the arena index of its
// first output record.
type evSpan struct {
	first int
	loc   srcLoc
}

// poisonState counts the transactions in which Kafka refused an output
// record of one event.
type poisonState struct {
	loc srcLoc
	n   int
	err string
}

// recordRefused reports whether a produce error is Kafka refusing the record
// itself, which no retry of the same bytes fixes, as opposed to the broker,
// the network or the transaction failing (those abort and redo the
// transaction as before, for ever).
func recordRefused(err error) bool {
	return errors.Is(err, kerr.MessageTooLarge) || // over max.message.bytes (broker) or the client's batch limit
		errors.Is(err, kerr.RecordListTooLarge) ||
		errors.Is(err, kerr.InvalidRecord) || // refused by a broker-side record validation
		errors.Is(err, kerr.CorruptMessage)
}

// produce hands out to the transaction. The records of events whose
// outputs Kafka refused before (p.isolate) are produced between flushes, so
// that they share no batch with other events' records: a refusal then
// names exactly the event that caused it.
func (p *processor) produce(ctx context.Context, cl *kgo.Client, out []*kgo.Record) error {
	iso := p.isolate
	p.isolate = p.isolate[:0]
	next := 0
	for _, rg := range iso {
		for _, r := range out[next:rg[0]] {
			cl.Produce(ctx, r, p.promise)
		}
		if err := cl.Flush(ctx); err != nil {
			return inSession(fmt.Errorf("consumer: flush: %w", err))
		}
		for _, r := range out[rg[0]:rg[1]] {
			cl.Produce(ctx, r, p.promise)
		}
		if err := cl.Flush(ctx); err != nil {
			return inSession(fmt.Errorf("consumer: flush: %w", err))
		}
		next = rg[1]
	}
	for _, r := range out[next:] {
		cl.Produce(ctx, r, p.promise)
	}
	return nil
}

// notePoison counts, once per event, the events behind the records Kafka
// refused in the open transaction, and returns their states.
func (p *processor) notePoison() []*poisonState {
	p.errMu.Lock()
	refused := append([]*kgo.Record(nil), p.refused...)
	var firstErr error = p.prodErr
	p.errMu.Unlock()
	if len(refused) == 0 {
		return nil
	}
	if p.poison == nil {
		p.poison = map[srcLoc]*poisonState{}
	}
	idx := map[*kgo.Record]bool{}
	for _, r := range refused {
		idx[r] = true
	}
	var out []*poisonState
	seen := map[srcLoc]bool{}
	for i := 0; i < p.used; i++ {
		if !idx[&p.arena[i/arenaChunk][i%arenaChunk]] {
			continue
		}
		// The event whose outputs start at or before record i.
		k := sort.Search(len(p.spans), func(j int) bool { return p.spans[j].first > i }) - 1
		if k < 0 || seen[p.spans[k].loc] {
			continue
		}
		loc := p.spans[k].loc
		seen[loc] = true
		ps := p.poison[loc]
		if ps == nil {
			ps = &poisonState{loc: loc}
			p.poison[loc] = ps
		}
		ps.n++
		ps.err = trunc(firstErr.Error(), 300)
		out = append(out, ps)
	}
	return out
}
