//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/producer/simulator"
)

// event is one event of the fleet and what became of it.
type event struct {
	key, value string
	kind       string // simulator kind: valid or a bad kind
	viaKafka   bool   // produced to Kafka directly, not posted to the gateway
	first      time.Time
	accepted   bool     // acknowledged by Kafka (directly or through the gateway)
	refused    []string // the gateway's reasons, when it refused the event
	// refusedIn202 says the refusal came in a 202: the gateway answers 202
	// only once the rejection record is on Kafka.
	refusedIn202 bool
}

// fleet publishes the simulator's events at a steady rate, every other one
// through the ingest gateway (re-posting under the same event_id what was
// not accepted, as a device would) and the others straight to Kafka (an
// idempotent producer that retries until acknowledged).
type fleet struct {
	gen     *simulator.Generator
	rate    float64
	ingest  string
	prod    *kgo.Client
	topic   string
	httpCli *http.Client

	mu     sync.Mutex
	events []*event
	retry  []*event // gateway events to post again
	posts  int
	non202 int

	stop chan struct{}
	done chan struct{}
}

func newFleet(gen *simulator.Generator, rate float64, ingest string, brokers []string, topic string) (*fleet, error) {
	prod, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DialTimeout(2*time.Second), kgo.ProducerLinger(5*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("fleet producer: %w", err)
	}
	return &fleet{gen: gen, rate: rate, ingest: ingest, prod: prod, topic: topic, httpCli: &http.Client{Timeout: 30 * time.Second},
		stop: make(chan struct{}), done: make(chan struct{})}, nil
}

// run publishes until halt: every 100 ms a tenth of a second's events.
func (f *fleet) run() {
	go func() { // owned by the fleet: halt stops it
		defer close(f.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var owed float64
		for {
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
			owed += f.rate / 10
			var batch []*event
			for ; owed >= 1; owed-- {
				m, ok := f.gen.Next()
				if !ok {
					break
				}
				e := &event{key: string(m.Key), value: string(m.Value), kind: m.Kind, first: time.Now()}
				f.mu.Lock()
				e.viaKafka = len(f.events)%2 == 1
				f.events = append(f.events, e)
				f.mu.Unlock()
				if e.viaKafka {
					f.produce(e)
				} else {
					batch = append(batch, e)
				}
			}
			f.mu.Lock()
			n := min(len(f.retry), 50)
			batch = append(batch, f.retry[:n]...)
			f.retry = f.retry[n:]
			f.mu.Unlock()
			if len(batch) > 0 {
				go f.post(batch) // owned by the fleet: bounded by the client timeout; halt waits for the retries
			}
		}
	}()
}

func (f *fleet) produce(e *event) {
	f.prod.Produce(context.Background(), &kgo.Record{Topic: f.topic, Key: []byte(e.key), Value: []byte(e.value)}, func(_ *kgo.Record, err error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if err == nil {
			e.accepted = true
		}
	})
}

// post sends batch to the gateway and files each event by its answer.
func (f *fleet) post(batch []*event) {
	// NDJSON: a malformed event is refused alone (in a JSON array it
	// would make the whole batch malformed)
	var body bytes.Buffer
	for _, e := range batch {
		body.WriteString(e.value)
		body.WriteByte('\n')
	}
	var ans gateway.IngestResponse
	status := 0
	req, _ := http.NewRequest(http.MethodPost, "http://"+f.ingest+"/v1/events", &body)
	req.Header.Set("Content-Type", "application/x-ndjson")
	req.Header.Set("Authorization", "Bearer "+fleetKey)
	resp, err := f.httpCli.Do(req)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
		_ = json.Unmarshal(b, &ans)
	}
	byIndex := map[int]gateway.EventAnswer{}
	for _, a := range ans.Events {
		byIndex[a.Index] = a
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posts++
	if status != http.StatusAccepted {
		f.non202++
	}
	for i, e := range batch {
		a, ok := byIndex[i]
		switch {
		case ok && a.Status == "accepted":
			e.accepted = true
		case ok && a.Status == "refused":
			for _, v := range a.Reasons {
				e.refused = append(e.refused, v.Reason)
			}
			if len(e.refused) == 0 {
				e.refused = []string{"refused"}
			}
			e.refusedIn202 = status == http.StatusAccepted
		default:
			f.retry = append(f.retry, e)
		}
	}
}

// halt stops new events, then re-posts what the gateway has not accepted
// and waits for the producer, until all is accepted or no event was
// accepted for quiet.
func (f *fleet) halt(quiet time.Duration) (pending int) {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
	last, lastN := time.Now(), -1
	for {
		f.mu.Lock()
		retry := f.retry
		f.retry = nil
		n := 0
		for _, e := range f.events {
			if e.accepted || e.refused != nil {
				n++
			}
		}
		total := len(f.events)
		f.mu.Unlock()
		if n == total {
			return 0
		}
		if n != lastN {
			last, lastN = time.Now(), n
		}
		if time.Since(last) > quiet {
			return total - n
		}
		for len(retry) > 0 {
			k := min(len(retry), 50)
			f.post(retry[:k])
			retry = retry[k:]
		}
		time.Sleep(time.Second)
	}
}

// snapshot copies the events.
func (f *fleet) snapshot() (events []event, posts, non202 int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.events {
		events = append(events, *e)
	}
	return events, f.posts, f.non202
}

func (f *fleet) close() { f.prod.Close() }
