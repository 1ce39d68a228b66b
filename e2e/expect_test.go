//go:build linux

package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/testkit/expect"
)

// play is the identity of one posted report, as the sandbox decoded it.
type play = expect.Play

// simRecord is one line of `playpipe simulate --record`.
type simRecord struct {
	Kind  string `json:"kind"`
	Key   string `json:"key"`
	Value string `json:"value"`
}

// readRecord reads the messages the simulator had acknowledged by Kafka.
func readRecord(t *testing.T, path string) []simRecord {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("simulator record: %v", err)
	}
	defer f.Close()
	var out []simRecord
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var r simRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("simulator record line %d: %v", len(out)+1, err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("simulator record: %v", err)
	}
	return out
}

// expectedPlays computes, independently of the consumer, the reports the
// valid simulated events must yield, from the sandbox's own catalog (the
// split rule of docs/design.md, with testkit/expect like the harness tests, with a
// minimum play length of 1 s).
func expectedPlays(t *testing.T, cat *sandbox.Catalog, msgs []simRecord) (posted map[play]int, belowMin, validEvents, badEvents int) {
	t.Helper()
	posted = map[play]int{}
	for _, m := range msgs {
		if m.Kind != simulator.KindValid {
			badEvents++
			continue
		}
		validEvents++
		plays, below, err := expect.Event(cat, []byte(m.Value))
		if err != nil {
			t.Fatalf("simulated event: %v", err)
		}
		belowMin += below
		for _, p := range plays {
			posted[p]++
		}
	}
	return posted, belowMin, validEvents, badEvents
}

// compare returns the plays expected but not accepted (missing), the plays
// accepted more often than expected (duplicates, counted once per extra
// acceptance) and the plays accepted that were never expected (unexpected).
func compare(want, got map[play]int) (missing []play, duplicates int, unexpected []play) {
	for p, n := range want {
		for i := got[p]; i < n; i++ {
			missing = append(missing, p)
		}
	}
	for p, n := range got {
		w, ok := want[p]
		if !ok {
			unexpected = append(unexpected, p)
			continue
		}
		if n > w {
			duplicates += n - w
		}
	}
	sort.Slice(missing, func(i, j int) bool { return missing[i].PlayedAt < missing[j].PlayedAt })
	sort.Slice(unexpected, func(i, j int) bool { return unexpected[i].PlayedAt < unexpected[j].PlayedAt })
	return missing, duplicates, unexpected
}

func firstPlays(ps []play, n int) []play {
	return ps[:min(n, len(ps))]
}

// simArgs are the simulator's flags of the scale-out run; generated builds
// the same messages in-process (same catalog walk, same generator), so that
// the fault schedule can be set as shares of the expected reports before the
// simulation ends. The recorded messages are the authority afterwards.
type simArgs struct {
	events, devices int
	rate            float64
	badShare        float64
	seed, startMS   int64
}

func (s simArgs) flags() []string {
	return []string{"--events", strconv.Itoa(s.events), "--rate", strconv.FormatFloat(s.rate, 'f', -1, 64),
		"--devices", strconv.Itoa(s.devices), "--bad-share", strconv.FormatFloat(s.badShare, 'f', -1, 64),
		"--seed", strconv.FormatInt(s.seed, 10), "--start-ms", strconv.FormatInt(s.startMS, 10)}
}

// generated returns the messages `playpipe simulate` with these flags sends
// against the sandbox at apiURL.
func (s simArgs) generated(t *testing.T, apiURL string, creds partnerapi.Credentials) []simRecord {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, err := partnerapi.New(partnerapi.Config{BaseURL: apiURL, Credentials: creds})
	if err != nil {
		t.Fatalf("partner API client: %v", err)
	}
	defer api.Close()
	mixes, err := simulator.CatalogFromAPI(ctx, api, 0)
	if err != nil {
		t.Fatalf("catalog walk: %v", err)
	}
	gen, err := simulator.NewGenerator(simulator.Config{Mixes: mixes, Events: s.events, Rate: s.rate, Devices: s.devices,
		BadShare: s.badShare, Seed: s.seed, StartMS: s.startMS})
	if err != nil {
		t.Fatalf("simulation generator: %v", err)
	}
	var out []simRecord
	for m, ok := gen.Next(); ok; m, ok = gen.Next() {
		out = append(out, simRecord{Kind: m.Kind, Key: string(m.Key), Value: string(m.Value)})
	}
	return out
}
