package consumer

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Holding events whose mix the partner API does not serve (docs/consumer.md,
// "One failing mix holds back only its events").
//
// An event whose mix cannot be had within Config.MixHoldAfter is held in
// memory, and so is every later event with the same record key (its order
// per key is kept); every other event of every partition flows on. Held
// events are released, in order per key, when their mix is served (or gets
// a verdict such as 404). The committed offset of a partition never passes
// its oldest held event: the transaction's offset commit is set to it, and
// its commit metadata records which offsets between it and the head are
// still undone (everything else there was produced in a committed
// transaction). A restart, a crash or a new owner after a rebalance reads
// that metadata, re-reads the partition from the oldest held event and
// skips the offsets already done, so nothing is lost and nothing is
// produced twice. The hold is bounded (Config.MaxHeld events, and the
// metadata must fit Config.MetadataMaxBytes per partition): when full, the
// enricher stops fetching new events until something is released (block,
// never drop).

// holdMetaPrefix marks commit metadata written by the hold.
const holdMetaPrefix = "pph1:"

// tpKey names a partition.
type tpKey struct {
	topic string
	part  int32
}

func tpOf(r *kgo.Record) tpKey { return tpKey{r.Topic, r.Partition} }

// heldRec is one held event.
type heldRec struct {
	rec   *kgo.Record
	mixID int64 // the mix it waits for; 0: none (held behind its key, or not valid)
}

// commitMark is what a transaction committed for a partition.
type commitMark struct {
	offset int64
	meta   string
}

// recovery is the state a partition's commit metadata describes: offsets
// below head that are not in undone were produced already.
type recovery struct {
	head   int64
	undone []int64 // sorted
}

// partState is the hold's bookkeeping of one partition.
type partState struct {
	held  []int64   // offsets held in memory, sorted
	pos   int64     // the next offset after the last handled record
	rec   *recovery // from the commit metadata read at assignment; nil once passed
	last  commitMark
	known bool // last is what the broker holds
	est   int  // upper bound of the metadata size of held (recomputed at commit)
}

// holdState is the enricher's held events. It is used by Run's goroutine
// only; snapshots make it transactional (restored when a transaction aborts,
// as franz-go then rewinds to the committed offsets).
type holdState struct {
	keys  map[string][]heldRec // per record key (and partition), in order
	order []string             // keys in the order they were first held (release order)
	parts map[tpKey]*partState
	n     int
}

func newHoldState() *holdState {
	return &holdState{keys: map[string][]heldRec{}, parts: map[tpKey]*partState{}}
}

// clone returns a deep copy (records are shared: they are not modified).
func (h *holdState) clone() *holdState {
	c := &holdState{keys: make(map[string][]heldRec, len(h.keys)), order: slices.Clone(h.order),
		parts: make(map[tpKey]*partState, len(h.parts)), n: h.n}
	for k, q := range h.keys {
		c.keys[k] = slices.Clone(q)
	}
	for tp, ps := range h.parts {
		cp := *ps
		cp.held = slices.Clone(ps.held)
		if ps.rec != nil {
			r := *ps.rec
			r.undone = slices.Clone(ps.rec.undone)
			cp.rec = &r
		}
		c.parts[tp] = &cp
	}
	return c
}

// queueKey is the key events are ordered by: the record key within its
// partition. Records without a key have no order to keep: each is its own.
func queueKey(r *kgo.Record) string {
	if len(r.Key) == 0 {
		return r.Topic + "\x00" + strconv.Itoa(int(r.Partition)) + "\x01" + strconv.FormatInt(r.Offset, 10)
	}
	return r.Topic + "\x00" + strconv.Itoa(int(r.Partition)) + "\x00" + string(r.Key)
}

// keyHeld reports whether an event with r's key is held.
func (h *holdState) keyHeld(r *kgo.Record) bool {
	if h.n == 0 {
		return false
	}
	_, ok := h.keys[queueKey(r)]
	return ok
}

// part returns the partition's state, creating it at r.
func (h *holdState) part(r *kgo.Record) *partState {
	tp := tpOf(r)
	ps := h.parts[tp]
	if ps == nil {
		ps = &partState{pos: r.Offset + 1}
		h.parts[tp] = ps
	}
	return ps
}

// add holds r (behind the events held with its key).
func (h *holdState) add(r *kgo.Record, mixID int64) {
	k := queueKey(r)
	q, ok := h.keys[k]
	if !ok {
		h.order = append(h.order, k)
	}
	h.keys[k] = append(q, heldRec{rec: r, mixID: mixID})
	h.n++
	ps := h.part(r)
	i, found := slices.BinarySearch(ps.held, r.Offset)
	if !found {
		prev := int64(-1)
		if i > 0 {
			prev = ps.held[i-1]
		}
		ps.held = slices.Insert(ps.held, i, r.Offset)
		ps.est += len(strconv.FormatInt(r.Offset-prev, 36)) + 1
	}
	ps.pos = max(ps.pos, r.Offset+1)
}

// handled notes that r was handled (produced, held or skipped).
func (h *holdState) handled(r *kgo.Record) {
	if ps := h.parts[tpOf(r)]; ps != nil {
		ps.pos = max(ps.pos, r.Offset+1)
		if ps.rec != nil && ps.pos >= ps.rec.head {
			ps.rec = nil // every offset the metadata described was re-read
		}
	}
}

// take removes and returns the events held under key k, in order.
func (h *holdState) take(k string) []heldRec {
	q := h.keys[k]
	delete(h.keys, k)
	h.n -= len(q)
	for _, hr := range q {
		ps := h.parts[tpOf(hr.rec)]
		if i, found := slices.BinarySearch(ps.held, hr.rec.Offset); found {
			ps.held = slices.Delete(ps.held, i, i+1)
		}
	}
	return q
}

// skip reports whether r was produced before the last restart or rebalance
// (its partition's commit metadata says so): it is not produced again.
func (h *holdState) skip(r *kgo.Record) bool {
	ps := h.parts[tpOf(r)]
	if ps == nil || ps.rec == nil || r.Offset >= ps.rec.head {
		return false
	}
	_, undone := slices.BinarySearch(ps.rec.undone, r.Offset)
	return !undone
}

// maxTokenBytes is the most one more held offset adds to a partition's
// commit metadata: a gap of up to 13 base-36 digits and a comma.
const maxTokenBytes = 14

// room is how many more events may be polled: each could be held, and the
// hold must stay within maxHeld events and every partition's metadata
// within metaMax bytes (64 kept for the head). 0: full.
func (h *holdState) room(maxHeld, metaMax int) int {
	est := 0
	for _, ps := range h.parts {
		est = max(est, ps.est)
	}
	return max(0, min(maxHeld-h.n, (metaMax-64-est)/maxTokenBytes))
}

// undone returns the partition's offsets not produced yet: those held, and
// those the recovered metadata lists that were not re-read yet.
func (ps *partState) undone() []int64 {
	if ps.rec == nil {
		return ps.held
	}
	u := slices.Clone(ps.held)
	for _, o := range ps.rec.undone {
		if o >= ps.pos {
			u = append(u, o)
		}
	}
	slices.Sort(u)
	return slices.Compact(u)
}

// desired is what the next commit must store for the partition.
func (ps *partState) desired() commitMark {
	head := ps.pos
	if ps.rec != nil {
		head = max(head, ps.rec.head)
	}
	u := ps.undone()
	if len(u) == 0 {
		return commitMark{offset: head}
	}
	return commitMark{offset: u[0], meta: encodeHoldMeta(head, u)}
}

// encodeHoldMeta writes the undone offsets u (sorted, u[0] = the commit
// offset) and the head as commit metadata: "pph1:" head−u[0] in base 36,
// ":", then runs of undone offsets, each the gap from the end of the
// previous run (base 36) and "+length−1" when longer than one, comma
// separated.
func encodeHoldMeta(head int64, u []int64) string {
	var b strings.Builder
	b.WriteString(holdMetaPrefix)
	b.WriteString(strconv.FormatInt(head-u[0], 36))
	b.WriteByte(':')
	prevEnd := u[0]
	for i := 0; i < len(u); {
		j := i
		for j+1 < len(u) && u[j+1] == u[j]+1 {
			j++
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(u[i]-prevEnd, 36))
		if j > i {
			b.WriteByte('+')
			b.WriteString(strconv.FormatInt(int64(j-i), 36))
		}
		prevEnd = u[j] + 1
		i = j + 1
	}
	return b.String()
}

// errNotHoldMeta: the metadata was not written by the hold.
var errNotHoldMeta = errors.New("not hold metadata")

// decodeHoldMeta reads metadata written by encodeHoldMeta for a partition
// committed at offset.
func decodeHoldMeta(offset int64, meta string) (*recovery, error) {
	rest, ok := strings.CutPrefix(meta, holdMetaPrefix)
	if !ok {
		return nil, errNotHoldMeta
	}
	headS, runs, ok := strings.Cut(rest, ":")
	if !ok {
		return nil, fmt.Errorf("consumer: hold metadata %q: no runs", meta)
	}
	dh, err := strconv.ParseInt(headS, 36, 64)
	if err != nil || dh < 0 {
		return nil, fmt.Errorf("consumer: hold metadata %q: head: %v", meta, err)
	}
	r := &recovery{head: offset + dh}
	prevEnd := offset
	for _, tok := range strings.Split(runs, ",") {
		gapS, lenS, long := strings.Cut(tok, "+")
		gap, err := strconv.ParseInt(gapS, 36, 64)
		if err != nil || gap < 0 {
			return nil, fmt.Errorf("consumer: hold metadata %q: run %q", meta, tok)
		}
		n := int64(0)
		if long {
			if n, err = strconv.ParseInt(lenS, 36, 64); err != nil || n < 0 {
				return nil, fmt.Errorf("consumer: hold metadata %q: run %q", meta, tok)
			}
		}
		start := prevEnd + gap
		for o := start; o <= start+n; o++ {
			r.undone = append(r.undone, o)
		}
		prevEnd = start + n + 1
		if len(r.undone) > 1<<20 {
			return nil, fmt.Errorf("consumer: hold metadata %q: too many offsets", meta)
		}
	}
	if len(r.undone) == 0 || r.undone[0] != offset || prevEnd > r.head {
		return nil, fmt.Errorf("consumer: hold metadata %q does not fit the committed offset %d", meta, offset)
	}
	return r, nil
}

// marks returns, for every partition whose commit must differ from what
// franz-go commits by itself (the head), the mark to commit.
func (h *holdState) marks() map[tpKey]commitMark {
	var m map[tpKey]commitMark
	for tp, ps := range h.parts {
		d := ps.desired()
		if d.meta == "" && ps.known && ps.last == d {
			continue
		}
		if m == nil {
			m = map[tpKey]commitMark{}
		}
		m[tp] = d
	}
	return m
}

// committed records that the marks were committed, and forgets partitions
// with nothing held, nothing to recover and a plain commit.
func (h *holdState) committed(marks map[tpKey]commitMark) {
	for tp, d := range marks {
		ps := h.parts[tp]
		if ps == nil {
			continue
		}
		ps.last, ps.known = d, true
	}
	for tp, ps := range h.parts {
		switch {
		case len(ps.held) == 0 && ps.rec == nil && (!ps.known || ps.last.meta == ""):
			// The broker holds a plain commit (or franz-go's own): nothing
			// left to override.
			delete(h.parts, tp)
		case len(ps.held) > 0:
			ps.est = len(ps.desired().meta)
		}
	}
}

// drop forgets the partitions in lost (revoked or lost by a rebalance):
// their held events are read again by their next owner from the committed
// offsets.
func (h *holdState) drop(lost map[tpKey]bool) {
	for tp := range lost {
		delete(h.parts, tp)
	}
	kept := h.order[:0]
	for _, k := range h.order {
		q, ok := h.keys[k]
		if !ok {
			continue
		}
		if lost[tpOf(q[0].rec)] {
			delete(h.keys, k)
			h.n -= len(q)
			continue
		}
		kept = append(kept, k)
	}
	h.order = kept
}
