package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/testkit/producertest"
)

// TestGatewayAnswersByTheDeliveryTimeout holds every produce request
// unanswered (a frozen broker) while two fleets post: each must be answered
// within the delivery timeout (plus slack) with 503 kafka_timeout,
// Retry-After and every event unknown — and the events must be on the topic
// once the broker answers, each once.
func TestGatewayAnswersByTheDeliveryTimeout(t *testing.T) {
	const timeout = time.Second
	e := startGateway(t, Config{}, producer.Config{DeliveryTimeout: timeout})
	if resp, b := e.post(t, "application/json", []byte("["+string(producertest.ValidEvent("warm"))+"]"), bearer...); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
	}
	release := make(chan struct{})
	c := e.k.Cluster()
	var once sync.Once
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		once.Do(func() { c.SleepControl(func() { <-release }) })
		return nil, nil, false
	})
	type result struct {
		status     int
		retryAfter string
		took       time.Duration
		body       IngestResponse
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	for i, key := range []string{acmeKey, otherKey} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := "[" + string(producertest.ValidEvent("f"+strconv.Itoa(i)+"-a")) + "," + string(producertest.ValidEvent("f"+strconv.Itoa(i)+"-b")) + "]"
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+key)
			start := time.Now()
			resp, err := e.srv.Client().Do(req) // not e.post: no t.Fatal off the test goroutine
			if err != nil {
				t.Errorf("fleet %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			r := result{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), took: time.Since(start)}
			if err := json.NewDecoder(resp.Body).Decode(&r.body); err != nil {
				t.Errorf("fleet %d answer: %v", i, err)
			}
			results[i] = r
		}()
	}
	wg.Wait()
	close(release)
	for i, r := range results {
		if r.took > timeout+500*time.Millisecond {
			t.Errorf("fleet %d answered after %s, want within the delivery timeout %s", i, r.took, timeout)
		}
		if r.status != http.StatusServiceUnavailable || r.retryAfter != strconv.Itoa(RetryAfterUnknown) || r.body.Code != "kafka_timeout" || r.body.Unknown != 2 {
			t.Errorf("fleet %d: %d Retry-After %q %+v, want 503 kafka_timeout, Retry-After %d, 2 unknown", i, r.status, r.retryAfter, r.body, RetryAfterUnknown)
		}
		for _, ev := range r.body.Events {
			if ev.Status != producer.StatusUnknown || ev.Error == "" {
				t.Errorf("fleet %d event %+v, want unknown with advice", i, ev)
			}
		}
	}
	recs := producertest.ReadTopic(t, e.k, e.k.Config.Topics().Events, 5)
	seen := map[string]int{}
	for _, r := range recs {
		seen[string(r.Key)]++
	}
	for _, id := range []string{"warm", "f0-a", "f0-b", "f1-a", "f1-b"} {
		if seen[id] != 1 {
			t.Errorf("event %s on the topic %d times after the broker answered, want once (all: %v)", id, seen[id], seen)
		}
	}
}
