package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// sandboxRefs are the sandbox catalog's mixes as the reference computation
// sees them: straight from the catalog's own fields (seconds), not from
// what the API served.
func sandboxRefs(cat *sandbox.Catalog) ([]refMix, int64) {
	var out []refMix
	var maxID int64
	for _, m := range cat.Mixes {
		r := refMix{id: m.ID, title: m.Title, lengthMS: int64(m.LengthSec) * 1000}
		for _, t := range m.Tracks {
			r.tracks = append(r.tracks, refTrack{id: t.ID, isrc: t.ISRC, startMS: int64(t.StartSec) * 1000})
		}
		out = append(out, r)
		maxID = max(maxID, m.ID)
	}
	return out, maxID + 1000
}

func sandboxClient(t *testing.T, sb *testenv.Sandbox) *partnerapi.Client {
	t.Helper()
	c, err := partnerapi.New(partnerapi.Config{BaseURL: sb.URL, Logger: quietLogger(),
		Credentials: partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature},
		BaseBackoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestEndToEndWithSandbox: events computed from the sandbox catalog (plus
// bad ones and unknown mixes) go through kfake and the real partner API
// client against the sandbox; the topics then hold exactly what the
// reference computation expects from the catalog.
func TestEndToEndWithSandbox(t *testing.T) {
	t.Parallel()
	k := testenv.SharedApacheKafka(t, 3)
	sb := testenv.StartSandbox(t)
	refs, unknown := sandboxRefs(sb.Catalog())
	quirks := 0
	for _, r := range refs {
		for _, tr := range r.tracks {
			if tr.isrc == "" || tr.isrc[len(tr.isrc)-1] == ' ' {
				quirks++
			}
		}
	}
	if quirks == 0 {
		t.Fatal("the sandbox catalog has no isrc quirks; the byte-for-byte check would prove little")
	}
	evs := genEvents(5, 4000, refs, unknown)
	evs = append(evs, quirkEvents(sb.Catalog(), refs)...)
	publish(t, k, k.Config.Topics().Events, evs)

	e := newTestEnricher(t, k, sandboxClient(t, sb), nil)
	stop := runEnricher(t, e)
	waitFor(t, 40*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(evs)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	cs := e.Cache().Stats()
	t.Logf("stats %+v; cache %+v; %d mixes in the catalog", e.Stats(), cs, len(refs))
	if cs.Fetches > int64(len(refs))+1 {
		t.Errorf("%d mix fetches for %d mixes and one unknown: the cache did not hold", cs.Fetches, len(refs))
	}
	checkOutput(t, k, evs)
	checkISRCBytes(t, k, sb.Catalog())
}

// checkISRCBytes reads the committed reports raw and checks the isrc bytes of
// every play against the catalog track, quirks included.
func checkISRCBytes(t *testing.T, k *testenv.Kafka, cat *sandbox.Catalog) {
	t.Helper()
	seen := map[sandbox.ISRCQuirk]int{}
	for _, r := range k.ReadAll(t, k.Config.Topics().Reports) {
		var v struct {
			Report map[string]json.RawMessage `json:"report"`
		}
		if err := json.Unmarshal(r.Value, &v); err != nil {
			t.Fatal(err)
		}
		var id int64
		if err := json.Unmarshal(v.Report["trackid"], &id); err != nil {
			t.Fatalf("trackid not an integer: %s", v.Report["trackid"])
		}
		tr, ok := cat.Track(id)
		if !ok {
			t.Fatalf("report of unknown track %d", id)
		}
		raw, has := v.Report["isrc"]
		if tr.ISRC == "" {
			if has {
				t.Errorf("track %d has no isrc in the listing but the report has %s", id, raw)
			}
		} else {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil || s != tr.ISRC {
				t.Errorf("track %d: isrc %s, listing %q", id, raw, tr.ISRC)
			}
		}
		seen[tr.Quirk]++
	}
	t.Logf("plays by isrc quirk: %v", seen)
	for _, q := range allQuirks {
		if seen[q] == 0 {
			t.Errorf("no play of a track with isrc quirk %q was checked", q)
		}
	}
}

var allQuirks = []sandbox.ISRCQuirk{sandbox.QuirkNone, sandbox.QuirkLowercase, sandbox.QuirkHyphenated,
	sandbox.QuirkTrailingSpace, sandbox.QuirkShared, sandbox.QuirkEmpty}

// quirkEvents are valid events that play the tracks with odd isrcs: for
// each quirk, up to three tracks, from 0.5 s after their start for 30 s.
func quirkEvents(cat *sandbox.Catalog, refs []refMix) []genEvent {
	var out []genEvent
	for _, q := range allQuirks {
		tracks := cat.TracksWithQuirk(q)
		for i := 0; i < len(tracks) && i < 3; i++ {
			m, pos, ok := cat.MixContaining(tracks[i].ID)
			if !ok {
				continue
			}
			var ref *refMix
			for j := range refs {
				if refs[j].id == m.ID {
					ref = &refs[j]
				}
			}
			id := fmt.Sprintf("quirk-%s-%d", q, i)
			ev := map[string]any{"event_id": id, "mix_id": m.ID, "started_at": int64(1_750_000_000_000),
				"offset_ms": int64(m.Tracks[pos].StartSec)*1000 + 500, "duration_ms": int64(30_000),
				"user_id": "u", "country": "SE", "os": "Linux", "device": "car", "vendor": int64(1), "end_reason": int64(0)}
			b, _ := json.Marshal(ev)
			out = append(out, genEvent{key: []byte(id), value: b, eventID: id, fields: ev, mix: ref})
		}
	}
	return out
}

// TestEndToEnd503StormWithSandbox: while the sandbox answers every mix
// request 503, nothing is rejected as unknown_mix and no play is derived;
// once the storm ends, everything is, exactly.
func TestEndToEnd503StormWithSandbox(t *testing.T) {
	t.Parallel()
	k := testenv.SharedApacheKafka(t, 3)
	sb := testenv.StartSandbox(t)
	refs, unknown := sandboxRefs(sb.Catalog())
	evs := genEvents(6, 1500, refs, unknown)
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate503: 1}})
	publish(t, k, k.Config.Topics().Events, evs)

	e := newTestEnricher(t, k, sandboxClient(t, sb), nil)
	stop := runEnricher(t, e)
	waitFor(t, 20*time.Second, "the storm to be hit", func() bool { return e.Cache().Stats().Retries >= 5 })
	// A negative wait: for half a second of the storm nothing may be
	// derived or rejected, so there is no condition to wait for instead.
	time.Sleep(500 * time.Millisecond)
	if st := e.Stats(); st.Plays != 0 {
		t.Fatalf("plays derived during a total mix outage: %+v", st)
	}
	for _, r := range k.ReadAll(t, k.Config.Topics().Rejected) {
		var rj schemas.Rejection
		_ = json.Unmarshal(r.Value, &rj)
		if rj.Reason == schemas.ReasonUnknownMix {
			t.Fatalf("a 503 was turned into a rejection: %s", r.Value)
		}
	}
	sb.SetFaults(sandbox.Faults{})
	waitFor(t, 40*time.Second, "all events committed after the storm", func() bool { return e.Stats().Events >= int64(len(evs)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("stats %+v; cache %+v", e.Stats(), e.Cache().Stats())
	checkOutput(t, k, evs)
}

// TestStandbyListingFlaggedAndShortLived: a mix served by standby is used
// for the split, its plays are flagged standby_listing, and it is fetched
// again after the standby TTL.
func TestStandbyListingFlaggedAndShortLived(t *testing.T) {
	sb := testenv.StartSandbox(t)
	api := sandboxClient(t, sb)
	sb.SetMode(sandbox.ModeStandby)
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	c, err := NewMixCache(api, fastRetry(CacheConfig{StandbyTTL: 5 * time.Second, TTL: time.Hour, Now: clock.Now}))
	if err != nil {
		t.Fatal(err)
	}
	id := sb.Catalog().Mixes[0].ID
	l, err := c.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Standby || len(l.Tracks) != len(sb.Catalog().Mixes[0].Tracks) {
		t.Fatalf("standby listing: standby=%v, %d tracks", l.Standby, len(l.Tracks))
	}
	ev := testEvent(0, 10_000)
	ev.MixID = id
	plays, v := Split(nil, &ev, l, SplitOptions{})
	if v != nil || len(plays) == 0 || !plays[0].StandbyListing {
		t.Fatalf("plays of a standby listing: %v %+v", v, plays)
	}
	sb.SetMode(sandbox.ModeLive)
	clock.Advance(6 * time.Second)
	if l, err = c.Get(context.Background(), id); err != nil || l.Standby {
		t.Fatalf("after the standby TTL the live listing is fetched: %v standby=%v", err, l != nil && l.Standby)
	}
	if s := c.Stats(); s.Fetches != 2 {
		t.Fatalf("fetches %d, want 2", s.Fetches)
	}
}
