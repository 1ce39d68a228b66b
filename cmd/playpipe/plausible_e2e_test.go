package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestImplausibleTimeProcesses runs the four implausible time cases end to end,
// with `playpipe ingest` and `playpipe consume` as separate processes on an
// embedded broker and the sandbox: an event whose started_at is in seconds,
// in microseconds, in the year 2100 or int64 max is
//   - posted to the gateway: refused in its per-event answer with
//     implausible_time and the value, and recorded on plays.rejected;
//   - written straight to plays.events (a fleet's own Kafka client): the
//     consumer rejects it to plays.rejected with implausible_time and the
//     value, and derives no play;
//
// while a plausible event on each path yields its plays. Nothing reaches
// plays.reports with a playedat outside the window.
func TestImplausibleTimeProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("separate processes")
	}
	k := testenv.StartKafka(t, 2)
	sb := testenv.StartSandbox(t)
	mix := sb.Catalog().Mixes[0]
	topics := k.Config.Topics()
	brokers := strings.Join(k.Config.Brokers, ",")
	const key = "fleet-key-for-time-test"

	ingest := startProc(t, nil, "ingest", "--addr", "127.0.0.1:0", "--brokers", brokers, "--api-key", "acme:"+gateway.HashKey(key),
		"--admin-addr", "127.0.0.1:0", "--log-level", "info")
	consume := startProc(t, []string{envAPIClientSignature + "=" + sb.ClientSignature}, "consume", "--brokers", brokers,
		"--api-url", sb.URL, "--api-client-id", sb.ClientID, "--transactional-id", "time-e2e", "--admin-addr", "127.0.0.1:0", "--log-level", "info")
	url := ingest.out.wait(t, regexp.MustCompile(`ingest listening.*url=(http://[0-9.:]+/v1/events)`), 60*time.Second)[1]

	now := time.Now()
	year2100 := time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	cases := []struct {
		name    string
		started int64
		want    string // in the detail
	}{
		{"seconds", now.Unix() - 600, "looks like epoch seconds"},
		{"micros", now.UnixMicro() - 600e6, "looks like epoch microseconds"},
		{"year2100", year2100, "(2100-01-01T00:00:00.000Z)"},
		{"int64max", math.MaxInt64, "started_at 9223372036854775807 (out of range)"},
	}
	ev := func(id string, started int64) string {
		return fmt.Sprintf(`{"event_id":%q,"mix_id":%d,"started_at":%d,"offset_ms":0,"duration_ms":200000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`,
			id, mix.ID, started)
	}
	plausible := now.Add(-10 * time.Minute).UnixMilli()

	// Through the gateway.
	var body []string
	for _, c := range cases {
		body = append(body, ev("http-"+c.name, c.started))
	}
	body = append(body, ev("http-ok", plausible))
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(strings.Join(body, "\n")))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var ir gateway.IngestResponse
	if resp.StatusCode != http.StatusAccepted || json.Unmarshal(b, &ir) != nil || ir.Accepted != 1 || ir.Refused != 4 {
		t.Fatalf("gateway: %d %s", resp.StatusCode, b)
	}
	for i, c := range cases {
		a := ir.Events[i]
		if len(a.Reasons) != 1 || a.Reasons[0].Reason != schemas.ReasonImplausibleTime || !strings.Contains(a.Reasons[0].Detail, fmt.Sprint(c.started)) ||
			!strings.Contains(a.Reasons[0].Detail, c.want) {
			t.Errorf("gateway answer for %s: %+v", c.name, a)
		}
	}

	// Straight to Kafka (record timestamp: now).
	var recs []*kgo.Record
	for _, c := range cases {
		recs = append(recs, &kgo.Record{Topic: topics.Events, Key: []byte("kafka-" + c.name), Value: []byte(ev("kafka-"+c.name, c.started))})
	}
	recs = append(recs, &kgo.Record{Topic: topics.Events, Key: []byte("kafka-ok"), Value: []byte(ev("kafka-ok", plausible))})
	if err := k.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	// The ledger topics: 4 + 4 rejections, the plays of the two good events.
	wantRejected := map[string]string{}
	for _, c := range cases {
		wantRejected["http-"+c.name], wantRejected["kafka-"+c.name] = c.want, c.want
	}
	reader := k.Client(t, kgo.ConsumeTopics(topics.Reports, topics.Rejected), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	rejected := map[string]schemas.Rejection{}
	playsOf := map[string]int{}
	lo, hi := now.Add(-31*24*time.Hour).UnixMilli(), now.Add(25*time.Hour).UnixMilli()
	for deadline := time.Now().Add(60 * time.Second); (len(rejected) < 8 || playsOf["http-ok"] == 0 || playsOf["kafka-ok"] == 0) && time.Now().Before(deadline); {
		pctx, cancel := context.WithTimeout(context.Background(), time.Second)
		reader.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if r.Topic == topics.Rejected {
				var rj schemas.Rejection
				if err := json.Unmarshal(r.Value, &rj); err != nil {
					t.Errorf("rejection %s: %v", r.Value, err)
				}
				if _, dup := rejected[rj.EventID]; dup {
					t.Errorf("event %s rejected twice", rj.EventID)
				}
				rejected[rj.EventID] = rj
				return
			}
			var tp schemas.TrackPlay
			if err := json.Unmarshal(r.Value, &tp); err != nil {
				t.Errorf("report %s: %v", r.Value, err)
			}
			if tp.Report.PlayedAt < lo || tp.Report.PlayedAt > hi {
				t.Errorf("report of %s with playedat %d outside the window", tp.EventID, tp.Report.PlayedAt)
			}
			playsOf[tp.EventID]++
		})
		cancel()
	}
	var got []string
	for id, rj := range rejected {
		got = append(got, id)
		want, ok := wantRejected[id]
		if !ok || rj.Reason != schemas.ReasonImplausibleTime || len(rj.Violations) != 1 || !strings.Contains(rj.Violations[0].Detail, want) {
			t.Errorf("rejection of %s: %+v", id, rj)
		}
		wantSrc := topics.Events
		if strings.HasPrefix(id, "http-") {
			wantSrc = gateway.IngestSource
		}
		if rj.Source.Topic != wantSrc {
			t.Errorf("rejection of %s from %q, want %q", id, rj.Source.Topic, wantSrc)
		}
	}
	sort.Strings(got)
	if len(rejected) != 8 || playsOf["http-ok"] == 0 || playsOf["kafka-ok"] == 0 || len(playsOf) != 2 {
		t.Fatalf("rejected %v, plays per event %v; want the 8 implausible events rejected and plays of http-ok and kafka-ok only\nconsume:\n%s",
			got, playsOf, consume.out.String())
	}
	t.Logf("rejected %v; plays %v", got, playsOf)
}
