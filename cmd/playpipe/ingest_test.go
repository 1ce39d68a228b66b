package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/testkit/testenv"
)

func TestIngestHashKeyAndNewKey(t *testing.T) {
	var out bytes.Buffer
	if err := runIngestWith(context.Background(), []string{"--hash-key"}, strings.NewReader("s3cret\n"), &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != gateway.HashKey("s3cret") || len(got) != 64 {
		t.Fatalf("--hash-key printed %q", got)
	}
	if err := runIngestWith(context.Background(), []string{"--hash-key"}, strings.NewReader(""), io.Discard, io.Discard, nil); !errors.Is(err, errUsage) {
		t.Fatalf("empty stdin: %v", err)
	}
	out.Reset()
	if err := runIngestWith(context.Background(), []string{"--new-key", "acme"}, nil, &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	key := strings.TrimSpace(strings.TrimPrefix(lines[0], "key:"))
	if len(lines) != 2 || lines[1] != "--api-key acme:"+gateway.HashKey(key) {
		t.Fatalf("--new-key printed %q", out.String())
	}
	if err := runIngestWith(context.Background(), []string{"--new-key", "a:b"}, nil, io.Discard, io.Discard, nil); !errors.Is(err, errUsage) {
		t.Fatalf("bad fleet name: %v", err)
	}
}

func TestIngestRefusesToStartWithoutKeys(t *testing.T) {
	t.Setenv("PLAYPIPE_INGEST_API_KEYS", "")
	var errOut bytes.Buffer
	err := runIngestWith(context.Background(), []string{"--brokers", "127.0.0.1:1"}, nil, io.Discard, &errOut, nil)
	if !errors.Is(err, errUsage) || !strings.Contains(errOut.String(), "--api-key") {
		t.Fatalf("err %v, stderr %s", err, errOut.String())
	}
	err = runIngestWith(context.Background(), []string{"--brokers", "127.0.0.1:1", "--api-key", "acme:" + "not-a-hash-but-a-raw-key"}, nil, io.Discard, &errOut, nil)
	if err == nil || strings.Contains(err.Error(), "not-a-hash-but-a-raw-key") {
		t.Fatalf("bad key entry: %v", err)
	}
}

// TestIngestCommandServesAndShutsDown runs the subcommand against a broker,
// posts a batch with a key, and stops it through its context.
func TestIngestCommandServesAndShutsDown(t *testing.T) {
	k := testenv.SharedApacheKafka(t, 2)
	key := "fleet-key-for-cmd-test"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addrc := make(chan string, 1)
	done := make(chan error, 1)
	var logs bytes.Buffer
	go func() {
		done <- runIngestWith(ctx, []string{"--addr", "127.0.0.1:0", "--brokers", strings.Join(k.Config.Brokers, ","), "--topic-prefix", k.Config.TopicPrefix,
			"--api-key", "acme:" + gateway.HashKey(key), "--log-level", "debug", "--admin-addr", "127.0.0.1:0"}, nil, io.Discard, &ingestLogBuffer{b: &logs}, func(a string) { addrc <- a })
	}()
	var addr string
	select {
	case addr = <-addrc:
	case err := <-done:
		t.Fatalf("ingest exited: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("ingest did not start")
	}
	body := fmt.Sprintf(`{"event_id":"cmd-1","mix_id":1,"started_at":%d,"offset_ms":0,"duration_ms":1000,"user_id":"u","country":"DE","os":"o","device":"d","vendor":1}`, recentMS())
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/events", strings.NewReader(body))
	req.Header.Set("X-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || !strings.Contains(string(b), `"accepted":1`) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	recs := k.ReadAll(t, k.Config.Topics().Events)
	if len(recs) != 1 || string(recs[0].Key) != "cmd-1" {
		t.Fatalf("topic holds %d records", len(recs))
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ingest returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ingest did not shut down")
	}
	if strings.Contains(logs.String(), key) {
		t.Fatal("the log holds the API key")
	}
}

// ingestLogBuffer is a bytes.Buffer safe for the command's concurrent logging.
type ingestLogBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (s *ingestLogBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
