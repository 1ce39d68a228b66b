package consumer

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// outageWindow is how long the mix endpoint fails for one mix in the hold
// tests. The real partner's outage lasted 60 s; the behaviour is the same for any window
// longer than the batch wait (MixHoldAfter) and the retry backoff, so a
// shorter one keeps the tests quick.
const outageWindow = 6 * time.Second

// holdScenario is the case seen in production: keys whose first event is of the
// failing mix (then events of the healthy, cached mix behind it), and keys
// with only events of the healthy mix, spread over every partition.
type holdScenario struct {
	evs       []genEvent
	byKey     map[string][]string // event ids per key, in publish order
	mixedKeys map[string]bool     // keys with an event of the failing mix
	want      map[string][]refPlay
}

func newHoldScenario(bad, good refMix, mixedKeys, goodKeys, perKey int, started int64) *holdScenario {
	s := &holdScenario{byKey: map[string][]string{}, mixedKeys: map[string]bool{}, want: map[string][]refPlay{}}
	add := func(key string, i int, m refMix) {
		id := fmt.Sprintf("%s-e%d", key, i)
		ev := map[string]any{"event_id": id, "mix_id": m.id, "started_at": started + int64(i)*60_000, "offset_ms": int64(0),
			"duration_ms": int64(200_000), "user_id": "u-" + key, "country": "DE", "os": "iOS 17", "device": "phone", "vendor": int64(1)}
		b, _ := json.Marshal(ev)
		mm := m
		s.evs = append(s.evs, genEvent{key: []byte(key), value: b, eventID: id, fields: ev, mix: &mm})
		s.byKey[key] = append(s.byKey[key], id)
		s.want[id] = expectPlays(m, ev)
	}
	for i := 0; i < perKey; i++ { // interleaved: event i of every key, then event i+1
		for k := 0; k < mixedKeys; k++ {
			key := fmt.Sprintf("mixed-%d", k)
			s.mixedKeys[key] = true
			if i == 0 {
				add(key, i, bad)
			} else {
				add(key, i, good) // a cached mix, but behind a held event of its key
			}
		}
		for k := 0; k < goodKeys; k++ {
			add(fmt.Sprintf("good-%d", k), i, good)
		}
	}
	return s
}

// checkDeliveredOnce reads what was delivered and asserts that every event
// of the scenario has all its plays and no report id came twice (when says
// after what, for the message); it returns the plays by event id.
func (s *holdScenario) checkDeliveredOnce(t *testing.T, k *testenv.Kafka, when string) map[string][]schemas.TrackPlay {
	t.Helper()
	got, dups := delivered(t, k)
	if len(dups) > 0 {
		t.Errorf("report ids delivered twice%s: %v", when, dups)
	}
	for id, want := range s.want {
		if len(got[id]) != len(want) {
			t.Errorf("event %s: %d plays, want %d", id, len(got[id]), len(want))
		}
	}
	return got
}

// delivered reads the committed plays and returns the plays per event id and
// the report ids seen more than once.
func delivered(t *testing.T, k *testenv.Kafka) (map[string][]schemas.TrackPlay, []string) {
	t.Helper()
	got := map[string][]schemas.TrackPlay{}
	seen := map[string]bool{}
	var dups []string
	for _, r := range k.ReadAll(t, k.Config.Topics().Reports) {
		var tp schemas.TrackPlay
		if err := json.Unmarshal(r.Value, &tp); err != nil {
			t.Fatalf("report %s: %v", r.Value, err)
		}
		if seen[tp.ReportID] {
			dups = append(dups, tp.ReportID)
		}
		seen[tp.ReportID] = true
		got[tp.EventID] = append(got[tp.EventID], tp)
	}
	return got, dups
}

// TestOneFailingMixHoldsOnlyItsEvents: one failing mix holds only its own
// events, end to end (kfake,
// the sandbox with the mix endpoint answering 500 for one mix during
// outageWindow, the real partner API client, the enrich role): the healthy
// mix's events on every partition are delivered during the outage; the
// failing mix's events, and the events of their keys behind them, after
// it; per key in order (derived_at never decreases along a key); every play
// exactly once, nothing rejected.
func TestOneFailingMixHoldsOnlyItsEvents(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 6)
	sb := testenv.StartSandbox(t)
	refs, _ := sandboxRefs(sb.Catalog())
	bad, good := refs[0], refs[1]
	s := newHoldScenario(bad, good, 4, 8, 3, time.Now().Add(-time.Hour).UnixMilli())

	e := newTestEnricher(t, k, sandboxClient(t, sb), func(o *Config) {
		o.MixHoldAfter = 300 * time.Millisecond
		o.TxnInterval = 50 * time.Millisecond
	})
	stop := runEnricher(t, e)
	// The healthy mix is cached before the outage (as it was when the real outage began).
	warm := newHoldScenario(bad, good, 0, 1, 1, time.Now().Add(-time.Hour).UnixMilli())
	warm.evs[0].eventID, warm.evs[0].key = "warm", []byte("warm")
	warm.evs[0].value = []byte(strings.Replace(string(warm.evs[0].value), "good-0-e0", "warm", 1))
	publish(t, k, k.Config.Topics().Events, warm.evs)
	waitFor(t, 20*time.Second, "warm-up event", func() bool { return e.Stats().Events >= 1 })

	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 1, IDs: []int64{bad.id}}})
	outageStart := time.Now()
	publish(t, k, k.Config.Topics().Events, s.evs)

	// During the outage: every event of the good-only keys is delivered,
	// none of the mixed keys'.
	var goodIDs []string
	for key, ids := range s.byKey {
		if !s.mixedKeys[key] {
			goodIDs = append(goodIDs, ids...)
		}
	}
	var during map[string][]schemas.TrackPlay
	waitFor(t, outageWindow-500*time.Millisecond, "the healthy mix's events delivered during the outage", func() bool {
		during, _ = delivered(t, k)
		for _, id := range goodIDs {
			if len(during[id]) == 0 {
				return false
			}
		}
		return true
	})
	inOutage := time.Since(outageStart)
	for key := range s.mixedKeys {
		for _, id := range s.byKey[key] {
			if len(during[id]) > 0 {
				t.Errorf("event %s of a held key delivered during the outage", id)
			}
		}
	}
	st := e.Stats()
	heldNow := st.Held
	t.Logf("during the outage (%.1fs in): %d of %d events delivered (all %d of the healthy-only keys), %d held",
		inOutage.Seconds(), len(during)-1, len(s.evs), len(goodIDs), heldNow)
	if heldNow != int64(len(s.mixedKeys)*3) {
		t.Errorf("%d events held during the outage, want %d (the failing mix's and those behind them)", heldNow, len(s.mixedKeys)*3)
	}
	time.Sleep(time.Until(outageStart.Add(outageWindow)))
	outageEnd := time.Now()
	sb.SetFaults(sandbox.Faults{})

	waitFor(t, 30*time.Second, "every event committed", func() bool { return e.Stats().Events >= int64(len(s.evs)+1) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := s.checkDeliveredOnce(t, k, "")
	if rej := k.ReadAll(t, k.Config.Topics().Rejected); len(rej) > 0 {
		t.Errorf("%d rejections; a 500 must never become one", len(rej))
	}
	// Order per key, and the held ones after the outage.
	stamped := map[string]int64{} // the event record's timestamp, by event id
	for _, ev := range s.evs {
		stamped[ev.eventID] = testArrival(ev.value).UnixMilli()
	}
	for key, ids := range s.byKey {
		var last int64
		for _, id := range ids {
			ps := got[id]
			if len(ps) == 0 {
				continue
			}
			d := ps[0].DerivedAt
			if d < last {
				t.Errorf("key %s: %s derived at %d before its predecessor (%d)", key, id, d, last)
			}
			last = d
			if s.mixedKeys[key] && d < outageEnd.UnixMilli() {
				t.Errorf("key %s: %s derived at %d, during the outage (ended %d)", key, id, d, outageEnd.UnixMilli())
			}
			// Each play carries its event record's timestamp, a held one too.
			for _, p := range ps {
				if p.EventAt != stamped[id] {
					t.Errorf("key %s: a play of %s carries event record time %d, the record's is %d", key, id, p.EventAt, stamped[id])
				}
			}
		}
	}
	st = e.Stats()
	if st.Held != 0 || st.HeldPeak != int64(len(s.mixedKeys)*3) || st.Released < st.HeldPeak {
		t.Errorf("hold stats %+v", st)
	}
	ids := make([]string, 0, len(got))
	for id := range got {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	t.Logf("after the outage: %d events delivered exactly once; stats %+v", len(ids), st)
}

// TestCrashWhileHeldNothingDoubled: the enricher is killed (client closed,
// no End) while the failing mix's events are held and the healthy mix's
// events past them are committed; a replacement with the same
// transactional id starts once the mix is served again. It reads the
// partitions again from the oldest held event, skips the events its
// predecessor produced (the commit metadata lists what was still undone)
// and derives the held ones: every play exactly once.
func TestCrashWhileHeldNothingDoubled(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 3)
	sb := testenv.StartSandbox(t)
	refs, _ := sandboxRefs(sb.Catalog())
	bad, good := refs[2], refs[3]
	s := newHoldScenario(bad, good, 3, 6, 4, time.Now().Add(-time.Hour).UnixMilli())
	mod := func(o *Config) {
		o.TransactionalID = "enrich-held-crash"
		o.MixHoldAfter = 200 * time.Millisecond
		o.TxnInterval = 50 * time.Millisecond
	}
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 1, IDs: []int64{bad.id}}})
	a := newTestEnricher(t, k, sandboxClient(t, sb), mod)
	errA := make(chan error, 1)
	go func() { errA <- a.Run(t.Context()) }()
	publish(t, k, k.Config.Topics().Events, s.evs)
	var goodIDs []string
	for key, ids := range s.byKey {
		if !s.mixedKeys[key] {
			goodIDs = append(goodIDs, ids...)
		}
	}
	waitFor(t, 20*time.Second, "the healthy events committed while the others are held", func() bool {
		got, _ := delivered(t, k)
		for _, id := range goodIDs {
			if len(got[id]) == 0 {
				return false
			}
		}
		return a.Stats().Held == int64(len(s.mixedKeys)*4)
	})
	a.crash()
	select {
	case err := <-errA:
		t.Logf("killed instance returned: %v (stats %+v)", err, a.Stats())
	case <-time.After(20 * time.Second):
		t.Fatal("killed instance did not return")
	}
	sb.SetFaults(sandbox.Faults{})

	b := newTestEnricher(t, k, sandboxClient(t, sb), mod)
	stop := runEnricher(t, b)
	waitGroupDone(t, k, DefaultGroup, 40*time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := s.checkDeliveredOnce(t, k, " after the restart")
	st := b.Stats()
	if st.Skipped == 0 || st.Events != int64(len(s.mixedKeys)*4) {
		t.Errorf("replacement: %+v; want the %d held events derived and the predecessor's skipped", st, len(s.mixedKeys)*4)
	}
	t.Logf("replacement stats %+v; %d events delivered exactly once", st, len(got))
}

// TestRebalanceWhileHeldNothingDoubled: a second enricher joins the group
// while the first holds the failing mix's events; partitions move between
// them (the first drops the held events of the partitions it loses, the
// second reads their commit metadata, skips what was produced and holds
// the rest). Once the mix is served, every play is delivered exactly once.
func TestRebalanceWhileHeldNothingDoubled(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 4)
	sb := testenv.StartSandbox(t)
	refs, _ := sandboxRefs(sb.Catalog())
	bad, good := refs[6], refs[7]
	s := newHoldScenario(bad, good, 6, 10, 3, time.Now().Add(-time.Hour).UnixMilli())
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 1, IDs: []int64{bad.id}}})
	mod := func(id string) func(o *Config) {
		return func(o *Config) {
			o.TransactionalID = id
			o.MixHoldAfter = 200 * time.Millisecond
			o.TxnInterval = 50 * time.Millisecond
		}
	}
	a := newTestEnricher(t, k, sandboxClient(t, sb), mod("enrich-rebalance-a"))
	stopA := runEnricher(t, a)
	publish(t, k, k.Config.Topics().Events, s.evs)
	waitFor(t, 20*time.Second, "the first enricher holds the failing mix's events", func() bool {
		return a.Stats().Held == int64(len(s.mixedKeys)*3) && a.Stats().Events == int64(len(s.evs)-len(s.mixedKeys)*3)
	})
	b := newTestEnricher(t, k, sandboxClient(t, sb), mod("enrich-rebalance-b"))
	stopB := runEnricher(t, b)
	waitFor(t, 30*time.Second, "the second enricher took partitions over", func() bool { return b.Stats().Skipped > 0 || b.Stats().Held > 0 })
	time.Sleep(500 * time.Millisecond)
	sb.SetFaults(sandbox.Faults{})
	waitGroupDone(t, k, DefaultGroup, 40*time.Second)
	if err := stopB(); err != nil {
		t.Fatalf("second: %v", err)
	}
	if err := stopA(); err != nil {
		t.Fatalf("first: %v", err)
	}
	s.checkDeliveredOnce(t, k, " across the rebalance")
	sa, sb2 := a.Stats(), b.Stats()
	if sa.Events+sb2.Events != int64(len(s.evs)) {
		t.Errorf("committed %d + %d events, want %d in all", sa.Events, sb2.Events, len(s.evs))
	}
	t.Logf("first %+v\nsecond %+v", sa, sb2)
}
