package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestConsumeFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--default-vendor", "seven"},
		{"--min-play-length", "-1s"},
		{"--txn-records", "0"},
		{"--mix-cache-ttl", "0s"},
		{"--max-txn-wait", "40s", "--txn-timeout", "60s"},
		{"--max-event-bytes", "0"},
		{"--mix-unavailable-attempts", "0"},
		{"--mix-unavailable-after", "-1s"},
		{"--time-window-back", "0s"},
		{"--time-window-ahead", "-1h"},
		{"--mix-hold-after", "11s"},
		{"--mix-hold-after", "0s"},
		{"--max-held-events", "0"},
		{"--offset-metadata-max-bytes", "100"},
	} {
		var errOut bytes.Buffer
		err := runConsume(context.Background(), append([]string{"--brokers", "127.0.0.1:1", "--api-url", "http://127.0.0.1:1"}, args...), io.Discard, &errOut)
		if !errors.Is(err, errUsage) {
			t.Errorf("%v: err %v, want a usage error", args, err)
			continue
		}
		if !strings.Contains(errOut.String(), strings.TrimLeft(args[0], "-")) {
			t.Errorf("%v: the message does not name the flag: %s", args, errOut.String())
		}
	}
}

// TestConsumeMaxEventBytesEnv: a PLAYPIPE_MAX_EVENT_BYTES that is not a
// number is a usage error naming the variable.
func TestConsumeMaxEventBytesEnv(t *testing.T) {
	t.Setenv("PLAYPIPE_MAX_EVENT_BYTES", "64k")
	var errOut bytes.Buffer
	err := runConsume(context.Background(), []string{"--brokers", "127.0.0.1:1", "--api-url", "http://127.0.0.1:1"}, io.Discard, &errOut)
	if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), "PLAYPIPE_MAX_EVENT_BYTES") {
		t.Fatalf("err %v, output %q: want a usage error naming PLAYPIPE_MAX_EVENT_BYTES", err, errOut.String())
	}
}

// TestTimeWindowFlags: the window flags reach the configuration, from the
// command line and the environment; a bad environment value names it. The
// ingest command takes the same flags.
func TestTimeWindowFlags(t *testing.T) {
	var cf consumeFlags
	fs := newFlagSet("consume", io.Discard, "")
	cf.register(fs)
	if err := fs.Parse([]string{"--time-window-back", "48h", "--time-window-ahead", "2h"}); err != nil {
		t.Fatal(err)
	}
	o, err := cf.config()
	if err != nil || o.Events.Window != (schemas.TimeWindow{Back: 48 * time.Hour, Ahead: 2 * time.Hour}) {
		t.Fatalf("window %+v, %v", o.Events.Window, err)
	}
	t.Setenv("PLAYPIPE_TIME_WINDOW_BACK", "2160h")
	var env consumeFlags
	fs = newFlagSet("consume", io.Discard, "")
	env.register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if o, err := env.config(); err != nil || o.Events.Window.Back != 2160*time.Hour || o.Events.Window.Ahead != schemas.DefaultTimeAhead {
		t.Fatalf("from the environment: %+v, %v", o.Events.Window, err)
	}
	t.Setenv("PLAYPIPE_TIME_WINDOW_BACK", "30 days")
	var bad consumeFlags
	bad.register(newFlagSet("consume", io.Discard, ""))
	if _, err := bad.config(); err == nil || !strings.Contains(err.Error(), "PLAYPIPE_TIME_WINDOW_BACK") {
		t.Fatalf("bad environment value: %v", err)
	}
	t.Setenv("PLAYPIPE_TIME_WINDOW_BACK", "")
	var errOut bytes.Buffer
	err = runIngestWith(context.Background(), []string{"--brokers", "127.0.0.1:1", "--api-key", "acme:" + strings.Repeat("a", 64), "--time-window-ahead", "0s"}, nil, io.Discard, &errOut, nil)
	if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), "--time-window-ahead") {
		t.Fatalf("ingest --time-window-ahead 0s: %v %q", err, errOut.String())
	}
}

// TestConsumeRefusedCredentials: with a signature the partner API refuses,
// consume stops at the first mix it needs with exit status 78, like report,
// instead of retrying for ever.
func TestConsumeRefusedCredentials(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	sb := testenv.StartSandbox(t)
	t.Setenv(envAPIClientSignature, "not-the-signature-the-sandbox-knows")
	topics := k.Config.Topics()
	v := fmt.Sprintf(`{"event_id":"cred-1","mix_id":%d,"started_at":%d,"offset_ms":0,"duration_ms":200000,"user_id":"u","country":"NO","os":"iOS","device":"phone","vendor":1}`,
		sb.Catalog().Mixes[0].ID, recentMS())
	if err := k.Client(t).ProduceSync(context.Background(), &kgo.Record{Topic: topics.Events, Value: []byte(v)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var errOut bytes.Buffer
	err := runConsume(ctx, []string{"--brokers", strings.Join(k.Config.Brokers, ","), "--api-url", sb.URL,
		"--api-client-id", sb.ClientID, "--transactional-id", "cred-test", "--log-level", "warn"}, io.Discard, &errOut)
	var ec interface{ ExitCode() int }
	if !errors.As(err, &ec) || ec.ExitCode() != 78 {
		t.Fatalf("consume returned %v (ctx %v), want exit status 78\n%s", err, ctx.Err(), errOut.String())
	}
	t.Logf("consume: %v", err)
	if !strings.Contains(err.Error(), "credentials") || strings.Contains(err.Error()+errOut.String(), "not-the-signature") {
		t.Errorf("message should name the credentials and never the signature: %v", err)
	}
}

// TestConsumeCommand runs `playpipe consume` against a broker and the
// sandbox: a few events become plays on the reports topic, a bad one and an
// unknown mix land on the rejected topic, and the summary is printed at stop.
func TestConsumeCommand(t *testing.T) {
	k := testenv.StartKafka(t, 2)
	sb := testenv.StartSandbox(t)
	t.Setenv(envAPIClientSignature, sb.ClientSignature)
	mix := sb.Catalog().Mixes[0]
	topics := k.Config.Topics()
	var recs []*kgo.Record
	for i := 0; i < 20; i++ {
		v := fmt.Sprintf(`{"event_id":"cmd-%d","mix_id":%d,"started_at":%d,"offset_ms":%d,"duration_ms":200000,"user_id":"u","country":"no","os":"iOS","device":"phone"}`,
			i, mix.ID, recentMS(), i*1000)
		recs = append(recs, &kgo.Record{Topic: topics.Events, Key: []byte(fmt.Sprint(i)), Value: []byte(v)})
	}
	recs = append(recs,
		&kgo.Record{Topic: topics.Events, Value: []byte(`{"event_id":"cmd-bad"`)},
		&kgo.Record{Topic: topics.Events, Value: []byte(fmt.Sprintf(`{"event_id":"cmd-unknown","mix_id":987654321,"started_at":%d,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"NO","os":"iOS","device":"phone"}`, recentMS()))})
	if err := k.Client(t).ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- runConsume(ctx, []string{"--brokers", strings.Join(k.Config.Brokers, ","), "--api-url", sb.URL,
			"--api-client-id", sb.ClientID, "--default-vendor", "9", "--transactional-id", "cmd-test", "--log-level", "warn"}, &out, &errOut)
	}()
	reader := k.Client(t, kgo.ConsumeTopics(topics.Reports, topics.Rejected), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var reports, rejected int
	deadline := time.Now().Add(30 * time.Second)
	for (reports == 0 || rejected < 2) && time.Now().Before(deadline) {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		reader.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
			if r.Topic == topics.Rejected {
				rejected++
				return
			}
			reports++
			var tp schemas.TrackPlay
			if err := json.Unmarshal(r.Value, &tp); err != nil || tp.Report.Vendor != 9 || tp.Report.Country != "NO" {
				t.Errorf("report %s (%v)", r.Value, err)
			}
		})
		pcancel()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("consume: %v\n%s", err, errOut.String())
	}
	if reports == 0 || rejected != 2 {
		t.Fatalf("reports %d, rejected %d (want > 0 and 2)\n%s", reports, rejected, errOut.String())
	}
	if !strings.Contains(out.String(), "22 events committed") {
		t.Fatalf("summary: %q\n%s", out.String(), errOut.String())
	}
}

// recentMS is a plausible started_at for an event published now: an hour ago.
func recentMS() int64 { return time.Now().Add(-time.Hour).UnixMilli() }
