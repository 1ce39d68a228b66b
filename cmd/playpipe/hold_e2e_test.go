package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestConsumeKill9WhileHeld: one failing mix holds only its events, with
// `playpipe consume` as a
// separate process: the sandbox's mix endpoint answers 500 for one mix; the
// other mix's events, on every partition, are delivered meanwhile; the
// process is killed with SIGKILL while the failing mix's events (and those
// behind them on their keys) are held; the mix is served again and a new
// process with the same transactional id delivers the held events — and
// none of the already delivered ones again (commit metadata). Every play
// exactly once, nothing rejected. The outage here lasts until the kill
// (a few seconds); the behaviour is the same for the real outage's 60 s.
func TestConsumeKill9WhileHeld(t *testing.T) {
	if testing.Short() {
		t.Skip("separate processes")
	}
	k := testenv.SharedApacheKafka(t, 4)
	sb := testenv.StartSandbox(t)
	cat := sb.Catalog()
	bad, good := cat.Mixes[0], cat.Mixes[1]
	topics := k.Config.Topics()

	// 6 keys start with an event of the failing mix, then 2 of the healthy
	// one; 12 keys have 3 events of the healthy mix.
	type event struct{ id, key string }
	var evs []event
	var recs []*kgo.Record
	want := map[string]int{} // plays (below-minimum ones included) per event
	started := time.Now().Add(-2 * time.Hour).UnixMilli()
	for i := 0; i < 3; i++ {
		for k := 0; k < 18; k++ {
			key := fmt.Sprintf("dev-%02d", k)
			mix := good
			if k < 6 && i == 0 {
				mix = bad
			}
			id := fmt.Sprintf("%s-%d", key, i)
			v := fmt.Sprintf(`{"event_id":%q,"mix_id":%d,"started_at":%d,"offset_ms":%d,"duration_ms":400000,"user_id":"u-%s","country":"DE","os":"iOS 17","device":"phone","vendor":1}`,
				id, mix.ID, started+int64(i)*600_000, int64(i)*60_000, key)
			plays, below, err := expect.Event(cat, []byte(v))
			if err != nil {
				t.Fatal(err)
			}
			want[id] = len(plays) + below
			evs = append(evs, event{id, key})
			recs = append(recs, &kgo.Record{Topic: topics.Events, Key: []byte(key), Value: []byte(v)})
		}
	}
	sb.SetFaults(sandbox.Faults{Mix: sandbox.GroupFaults{Rate500: 1, IDs: []int64{bad.ID}}})
	env := []string{envAPIClientSignature + "=" + sb.ClientSignature}
	args := []string{"consume", "--brokers", k.Config.Brokers[0], "--topic-prefix", k.Config.TopicPrefix, "--api-url", sb.URL, "--api-client-id", sb.ClientID,
		"--transactional-id", "kill9-held", "--mix-hold-after", "300ms", "--admin-addr", "127.0.0.1:0", "--log-level", "info"}
	first := startProc(t, env, args...)
	first.out.wait(t, regexp.MustCompile(`enricher started`), 60*time.Second)
	outageStart := time.Now()
	if err := k.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	read := func() (map[string]int, []string) {
		got := map[string]int{}
		seen := map[string]bool{}
		var dups []string
		for _, r := range k.ReadAll(t, topics.Reports) {
			var tp schemas.TrackPlay
			if err := json.Unmarshal(r.Value, &tp); err != nil {
				t.Fatalf("report %s: %v", r.Value, err)
			}
			if seen[tp.ReportID] {
				dups = append(dups, tp.ReportID)
			}
			seen[tp.ReportID] = true
			got[tp.EventID]++
		}
		return got, dups
	}
	heldKey := func(key string) bool { return key < "dev-06" }
	var during map[string]int
	deadline := time.Now().Add(30 * time.Second)
	for {
		during, _ = read()
		done := true
		for _, e := range evs {
			if !heldKey(e.key) && during[e.id] != want[e.id] {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the healthy mix's events were not delivered during the outage: %v\n%s", during, first.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	deliveredDuring := 0
	for _, e := range evs {
		if heldKey(e.key) && during[e.id] > 0 {
			t.Errorf("%s (behind the failing mix on its key) delivered during the outage", e.id)
		}
		if during[e.id] > 0 {
			deliveredDuring++
		}
	}
	t.Logf("outage: %d of %d events delivered within %.1fs (every event of the 12 healthy keys); 18 held", deliveredDuring, len(evs), time.Since(outageStart).Seconds())

	first.kill9() // SIGKILL while 18 events are held
	sb.SetFaults(sandbox.Faults{})
	second := startProc(t, env, args...)
	second.out.wait(t, regexp.MustCompile(`resuming after held events`), 60*time.Second)
	deadline = time.Now().Add(60 * time.Second)
	for {
		got, _ := read()
		done := true
		for _, e := range evs {
			if got[e.id] < want[e.id] {
				done = false
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("held events not delivered after the restart: %v\n%s", got, second.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := second.stop(t, 20*time.Second); err != nil {
		t.Fatalf("second consume: %v\n%s", err, second.out.String())
	}
	got, dups := read()
	if len(dups) > 0 {
		t.Errorf("report ids delivered twice: %v", dups)
	}
	for _, e := range evs {
		if got[e.id] != want[e.id] {
			t.Errorf("%s: %d plays, want %d", e.id, got[e.id], want[e.id])
		}
	}
	if rej := k.ReadAll(t, topics.Rejected); len(rej) != 0 {
		t.Errorf("%d rejections; the 500s must not become any", len(rej))
	}
}
