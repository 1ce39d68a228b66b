package consumer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestHoldMetaRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		base := rng.Int64N(1 << 40)
		var u []int64
		o := base
		for n := 1 + rng.IntN(200); n > 0; n-- {
			u = append(u, o)
			if rng.IntN(3) == 0 {
				o += 1 + rng.Int64N(5000)
			} else {
				o++
			}
		}
		head := u[len(u)-1] + 1 + rng.Int64N(100)
		meta := encodeHoldMeta(head, u)
		r, err := decodeHoldMeta(base, meta)
		if err != nil || r.head != head || !slices.Equal(r.undone, u) {
			t.Fatalf("%q: %+v %v; want head %d undone %v", meta, r, err, head, u)
		}
	}
	if got := encodeHoldMeta(110, []int64{100, 101, 102, 105, 107, 108}); got != "pph1:a:0+2,2,1+1" {
		t.Fatalf("encoding %q", got)
	}
	for _, bad := range []string{"", "member-1", "pph1:", "pph1:x", "pph1:5:", "pph1:5:1", "pph1:2:0+5", "pph1:-1:0", "pph1:5:0,-1"} {
		if _, err := decodeHoldMeta(100, bad); err == nil {
			t.Errorf("%q decoded", bad)
		}
	}
}

func rec(part int32, off int64, key string) *kgo.Record {
	return &kgo.Record{Topic: "plays.events", Partition: part, Offset: off, Key: []byte(key)}
}

// TestHoldStateCommitMarks walks a partition through holding, committing,
// releasing and a restart: the committed offset stops at the oldest held
// event, the metadata names what is undone, and the restart skips exactly
// the offsets produced before.
func TestHoldStateCommitMarks(t *testing.T) {
	h := newHoldState()
	tp := tpKey{"plays.events", 0}
	for off := int64(10); off < 20; off++ {
		r := rec(0, off, fmt.Sprint("k", off%3))
		switch {
		case off == 12: // k0's mix fails
			h.add(r, 42)
		case h.keyHeld(r): // 15, 18: behind it
			h.add(r, 0)
		default:
			h.handled(r)
		}
	}
	if h.n != 3 || !slices.Equal(h.parts[tp].held, []int64{12, 15, 18}) {
		t.Fatalf("held %d %v", h.n, h.parts[tp].held)
	}
	marks := h.marks()
	want := commitMark{12, encodeHoldMeta(20, []int64{12, 15, 18})}
	if marks[tp] != want {
		t.Fatalf("marks %+v, want %+v", marks, want)
	}
	h.committed(marks)
	snap := h.clone()

	// A restart reads the metadata: 13, 14, 16, 17, 19 are skipped.
	r, err := decodeHoldMeta(marks[tp].offset, marks[tp].meta)
	if err != nil {
		t.Fatal(err)
	}
	after := newHoldState()
	after.parts[tp] = &partState{pos: 12, rec: r, last: marks[tp], known: true}
	var skipped []int64
	for off := int64(12); off < 22; off++ {
		rr := rec(0, off, "x")
		if after.skip(rr) {
			skipped = append(skipped, off)
		}
		after.handled(rr)
	}
	if !slices.Equal(skipped, []int64{13, 14, 16, 17, 19}) || after.parts[tp].rec != nil {
		t.Fatalf("skipped %v, recovery %+v", skipped, after.parts[tp].rec)
	}

	// Releasing k0 and committing: a plain commit at the head, once.
	q := h.take(queueKey(rec(0, 12, "k0")))
	if len(q) != 3 || h.n != 0 || q[0].rec.Offset != 12 || q[2].rec.Offset != 18 {
		t.Fatalf("take %v, n %d", q, h.n)
	}
	marks = h.marks()
	if marks[tp] != (commitMark{offset: 20}) {
		t.Fatalf("marks after release %+v", marks)
	}
	h.committed(marks)
	if len(h.parts) != 0 || len(h.marks()) != 0 {
		t.Fatalf("state kept after a plain commit: %+v", h.parts)
	}
	// The snapshot is independent.
	if snap.n != 3 || len(snap.parts[tp].held) != 3 {
		t.Fatalf("snapshot changed: %+v", snap)
	}
	snap.drop(map[tpKey]bool{tp: true})
	if snap.n != 0 || len(snap.keys) != 0 || len(snap.parts) != 0 {
		t.Fatalf("drop left %+v", snap)
	}
}

func TestHoldRoom(t *testing.T) {
	h := newHoldState()
	for off := int64(0); off < 5; off++ {
		h.add(rec(0, off*1000, fmt.Sprint(off)), 1)
	}
	if h.room(6, 4096) != 1 || h.room(5, 4096) != 0 {
		t.Fatalf("MaxHeld bound: room %d", h.room(6, 4096))
	}
	h2 := newHoldState()
	for off := int64(0); off < 2000; off += 2 { // gaps of 2: one token each
		h2.add(rec(1, off, fmt.Sprint(off)), 1)
	}
	if h2.room(100000, 1024) != 0 || h2.room(100000, 8192) == 0 {
		t.Fatalf("metadata bound: estimate %d", h2.parts[tpKey{"plays.events", 1}].est)
	}
	if m := h2.marks()[tpKey{"plays.events", 1}]; len(m.meta) > 8192-64 {
		t.Fatalf("metadata %d bytes over the bound the estimate allowed", len(m.meta))
	}
}

func TestApplyMarks(t *testing.T) {
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.MemberID = "member-1"
	topic := kmsg.NewTxnOffsetCommitRequestTopic()
	topic.Topic = "plays.events"
	for _, p := range []struct {
		part int32
		off  int64
	}{{0, 50}, {1, 70}} {
		rp := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		rp.Partition, rp.Offset, rp.LeaderEpoch, rp.Metadata = p.part, p.off, 3, &req.MemberID
		topic.Partitions = append(topic.Partitions, rp)
	}
	req.Topics = append(req.Topics, topic)
	applyMarks(req, map[tpKey]commitMark{
		{"plays.events", 0}: {12, "pph1:a:0"}, // held: lowered, with metadata
		{"plays.events", 2}: {90, ""},         // not polled since: added
	})
	var got []string
	for _, tt := range req.Topics {
		for _, p := range tt.Partitions {
			got = append(got, fmt.Sprintf("%s/%d@%d e%d %s", tt.Topic, p.Partition, p.Offset, p.LeaderEpoch, *p.Metadata))
		}
	}
	want := "plays.events/0@12 e-1 pph1:a:0,plays.events/1@70 e3 member-1,plays.events/2@90 e-1 member-1"
	if strings.Join(got, ",") != want {
		t.Fatalf("request %v\nwant %s", got, want)
	}
}

// TestHoldBoundBlocks: with room for 3 held events, the failing mix's
// events fill the hold and the enricher fetches nothing more until the mix
// is served (block, never drop); then everything is derived exactly once.
func TestHoldBoundBlocks(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 1)
	sb := testenv.StartSandbox(t)
	refs, _ := sandboxRefs(sb.Catalog())
	bad, good := refs[4], refs[5]
	s := newHoldScenario(bad, good, 5, 5, 2, time.Now().Add(-time.Hour).UnixMilli())
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 1, IDs: []int64{bad.id}}})
	e := newTestEnricher(t, k, sandboxClient(t, sb), func(o *Config) {
		o.MixHoldAfter = 100 * time.Millisecond
		o.MaxHeld = 3
		o.TxnRecords = 4 // small batches, so the bound is reached between them
	})
	publish(t, k, k.Config.Topics().Events, s.evs)
	stop := runEnricher(t, e)
	time.Sleep(2 * time.Second)
	st := e.Stats()
	if st.Held > 3 || st.HeldPeak != 3 || st.Events >= int64(len(s.evs)) {
		t.Fatalf("during the outage: %+v; want at most 3 held and the rest not fetched", st)
	}
	blocked := st.Events
	sb.SetFaults(sandbox.Faults{})
	waitFor(t, 30*time.Second, "every event committed", func() bool { return e.Stats().Events >= int64(len(s.evs)) })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	got, dups := delivered(t, k)
	if len(dups) > 0 || len(got) != len(s.evs) {
		t.Fatalf("%d events delivered, duplicates %v; want %d once each", len(got), dups, len(s.evs))
	}
	t.Logf("blocked at %d of %d events with %d held; then everything: %+v", blocked, len(s.evs), st.Held, e.Stats())
}
