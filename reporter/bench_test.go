package reporter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// gatedAPI counts the reports live service accepted, and holds posts while
// its gate is closed (the benchmark alternates reporter and plain-client
// phases on the same machine).
type gatedAPI struct {
	API
	ok   atomic.Int64
	gate atomic.Pointer[chan struct{}]
}

func newGatedAPI(api API) *gatedAPI {
	g := &gatedAPI{API: api}
	open := make(chan struct{})
	close(open)
	g.gate.Store(&open)
	return g
}

func (g *gatedAPI) pause() {
	ch := make(chan struct{})
	g.gate.Store(&ch)
}

func (g *gatedAPI) resume() { close(*g.gate.Load()) }

func (g *gatedAPI) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	select {
	case <-*g.gate.Load():
	case <-ctx.Done():
		return partnerapi.ReportResult{}, ctx.Err()
	}
	res, err := g.API.ReportPlayJSON(ctx, body)
	if err == nil && !res.Meta.Standby() {
		g.ok.Add(1)
	}
	return res, err
}

// ceiling posts bodies to the sandbox with a plain Go client (its own
// keep-alive transport, conc goroutines) and returns posts/s.
func ceiling(b *testing.B, url, token string, bodies [][]byte, conc int) float64 {
	tr := &http.Transport{MaxIdleConns: conc, MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(bodies)) {
					return
				}
				req, _ := http.NewRequest(http.MethodPost, url+"/partners/royalty-tracking", bytes.NewReader(bodies[i]))
				req.Header["User-Agent"] = []string{testUA}
				req.Header["Authorization"] = []string{token}
				req.Header["Content-Type"] = []string{"application/json"}
				resp, err := hc.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(start)
	if failed.Load() > 0 {
		b.Fatalf("ceiling: %d posts failed", failed.Load())
	}
	return float64(len(bodies)) / el.Seconds()
}

// BenchmarkReporter measures delivered reports/s of the reporter (embedded
// Kafka broker → reporter → sandbox on loopback, every Delivery record
// published, every offset committed) next to the raw ceiling of the same
// HTTP path: a plain Go client posting the same bodies with the same number
// in flight. The two alternate in rounds within one run (the reporter's
// posts are held at a gate while the plain client runs), so machine noise
// hits both alike. b.N is the number of reports; use a fixed count:
//
//	go test -run '^$' -bench BenchmarkReporter -benchtime 200000x -count 3 ./reporter/
func BenchmarkReporter(b *testing.B) {
	const (
		conc   = 32
		rounds = 5
	)
	n := max(b.N, 10000)
	e := newE2E(b, 3, func(o *sandbox.Config) { o.MaxLedgerEntries = 1 })
	bodies := make([][]byte, n)
	recs := make([]*kgo.Record, n)
	for i := range n {
		tp := play(fmt.Sprintf("bench-%d", i), false, false)
		v, _ := json.Marshal(tp)
		recs[i] = &kgo.Record{Topic: e.kafka.Config.Topics().Reports, Key: []byte(tp.ReportID), Value: v}
		bodies[i], _ = json.Marshal(tp.Report)
	}
	for i := 0; i < n; i += 10000 {
		e.produce(recs[i:min(i+10000, n)])
	}
	token := e.sb.MintToken(time.Hour, false)

	api := newGatedAPI(e.client(testUA))
	api.pause()
	cfg := e.config()
	cfg.Concurrency, cfg.MaxConcurrency = conc, conc // the plain client's in-flight
	cfg.Logger = testLogger(b)
	stop := e.start(cfg, api)
	// Warm up: the group joined, the fetch buffers full, connections open.
	api.resume()
	waitFor(b, time.Minute, func() bool { return api.ok.Load() >= int64(n/20) })
	api.pause()
	b.ResetTimer()

	// Leave a round's worth of slack: posts past the gate finish after a pause.
	per := (n - int(api.ok.Load())) / (rounds + 1)
	var repN, ceilN int64
	var repT, ceilT time.Duration
	for r := range rounds {
		t0 := time.Now()
		rate := ceiling(b, e.sb.URL, token, bodies[r*per:(r+1)*per], conc)
		ceilT += time.Since(t0)
		ceilN += int64(per)
		from := api.ok.Load()
		t0 = time.Now()
		api.resume()
		var c int64
		for c = api.ok.Load(); c < from+int64(per); c = api.ok.Load() {
			time.Sleep(200 * time.Microsecond) // polls the answers counted (a benchmark measures real time)
		}
		el := time.Since(t0)
		api.pause()
		got := c - from
		repT += el
		repN += got
		b.Logf("round %d: plain client %.0f posts/s, reporter %.0f reports/s", r+1, rate, float64(got)/el.Seconds())
	}
	b.StopTimer()
	api.resume()
	waitFor(b, time.Minute, func() bool { return api.ok.Load() >= int64(n) })
	if err := stop(); err != nil {
		b.Fatalf("Run: %v", err)
	}
	e.checkAllCommitted()
	if got := e.sb.Ledger().AcceptedCount; got != int64(n)+ceilN {
		b.Fatalf("sandbox accepted %d, want %d reports + %d plain posts", got, n, ceilN)
	}
	rep := float64(repN) / repT.Seconds()
	ceil := float64(ceilN) / ceilT.Seconds()
	b.ReportMetric(rep, "reports/s")
	b.ReportMetric(ceil, "ceiling_posts/s")
	b.ReportMetric(rep/ceil*100, "%_of_ceiling")
	b.Logf("n=%d: reporter %.0f reports/s, plain client %.0f posts/s, ratio %.1f%%", n, rep, ceil, rep/ceil*100)
}

// sleepAPI answers every report 200 after a fixed latency, costing no CPU:
// a partner where nothing but our own bookkeeping can hold a slot.
type sleepAPI struct {
	lat time.Duration
	ok  atomic.Int64
}

func (a *sleepAPI) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	t := time.NewTimer(a.lat)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return partnerapi.ReportResult{}, ctx.Err()
	}
	a.ok.Add(1)
	return partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200, ServedBy: partnerapi.ServedLive}, Message: "ok", Latency: a.lat}, nil
}

func (a *sleepAPI) Session(context.Context) (partnerapi.Meta, error) {
	return partnerapi.Meta{Status: 200}, nil
}

// BenchmarkSlotIdle measures how long a slot waits on the reporter's own
// bookkeeping (lease markers, Delivery records, commits, the lock) beyond
// its answer: a partner answering after 5 ms with no CPU of its own, a
// fixed in-flight, every marker and answer through the embedded broker.
// idle_ms/slot = in flight / rate − latency (Little's law). Profile the
// waits with -trace, -blockprofile and -mutexprofile:
//
//	go test -run '^$' -bench BenchmarkSlotIdle -benchtime 40000x ./reporter/ -trace slot.trace -blockprofile block.out -mutexprofile mutex.out
func BenchmarkSlotIdle(b *testing.B) {
	for _, conc := range []int{64, 256} {
		b.Run(fmt.Sprintf("inflight=%d", conc), func(b *testing.B) {
			const lat = 5 * time.Millisecond
			n := max(b.N, 5000)
			e := newE2E(b, 3, func(o *sandbox.Config) { o.MaxLedgerEntries = 1 })
			e.group = fmt.Sprintf("slot-idle-%d", conc)
			recs := make([]*kgo.Record, n)
			for i := range n {
				tp := play(fmt.Sprintf("idle-%d-%d", conc, i), false, false)
				v, _ := json.Marshal(tp)
				recs[i] = &kgo.Record{Topic: e.kafka.Config.Topics().Reports, Key: []byte(tp.ReportID), Value: v}
			}
			for i := 0; i < n; i += 10000 {
				e.produce(recs[i:min(i+10000, n)])
			}
			api := &sleepAPI{lat: lat}
			cfg := e.config()
			cfg.Concurrency, cfg.MaxConcurrency = conc, conc
			cfg.Logger = testLogger(b)
			b.ResetTimer()
			stop := e.start(cfg, api)
			waitFor(b, time.Minute, func() bool { return api.ok.Load() >= int64(n/10) })
			from, t0 := api.ok.Load(), time.Now()
			waitFor(b, 5*time.Minute, func() bool { return api.ok.Load() >= int64(n*9/10) })
			rate := float64(api.ok.Load()-from) / time.Since(t0).Seconds()
			b.StopTimer()
			if err := stop(); err != nil {
				b.Fatalf("Run: %v", err)
			}
			bound := float64(conc) / lat.Seconds()
			b.ReportMetric(rate, "reports/s")
			b.ReportMetric(100*rate/bound, "%_of_little")
			b.ReportMetric(1000*(float64(conc)/rate-lat.Seconds()), "idle_ms/slot")
		})
	}
}
