package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// instantAPI answers every report 200 at once, in the caller's goroutine:
// a partner that costs nothing, so what a report costs is the reporter's
// own work around its post (and the embedded broker's).
type instantAPI struct{ ok atomic.Int64 }

func (a *instantAPI) ReportPlayJSON(context.Context, []byte) (partnerapi.ReportResult, error) {
	a.ok.Add(1)
	return partnerapi.ReportResult{Meta: partnerapi.Meta{Status: 200, ServedBy: partnerapi.ServedLive}, Message: "ok", Latency: 100 * time.Microsecond}, nil
}

func (a *instantAPI) Session(context.Context) (partnerapi.Meta, error) {
	return partnerapi.Meta{Status: 200}, nil
}

// BenchmarkOverhead measures the reporter's own cost per report around its
// post (consuming the record, lease markers, the Delivery record, metrics
// through the OpenTelemetry SDK, commits) against a partner that answers
// at once: allocs/report and CPU µs/report of the whole process (the
// embedded broker included, the same in every run). Profile the reporter's
// part with -cpuprofile and -memprofile:
//
//	go test -run '^$' -bench BenchmarkOverhead -benchtime 100000x ./reporter/ -cpuprofile cpu.out
func BenchmarkOverhead(b *testing.B) {
	const conc = 48
	n := max(b.N, 20000)
	e := newE2E(b, 6, func(o *sandbox.Config) { o.MaxLedgerEntries = 1 })
	e.group = "overhead"
	recs := make([]*kgo.Record, n)
	for i := range n {
		tp := play(fmt.Sprintf("overhead-%d", i), false, false)
		v, _ := json.Marshal(tp)
		recs[i] = &kgo.Record{Topic: e.kafka.Config.Topics().Reports, Key: []byte(tp.ReportID), Value: v}
	}
	for i := 0; i < n; i += 10000 {
		e.produce(recs[i:min(i+10000, n)])
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	api := &instantAPI{}
	cfg := e.config()
	cfg.Concurrency, cfg.MaxConcurrency = conc, conc
	cfg.MeterProvider = mp
	cfg.Logger = testLogger(b)
	stop := e.start(cfg, api)
	waitFor(b, time.Minute, func() bool { return api.ok.Load() >= int64(n/10) })
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	from, cpu0, t0 := api.ok.Load(), cpuTime(), time.Now()
	b.ResetTimer()
	waitFor(b, 5*time.Minute, func() bool { return api.ok.Load() >= int64(n*9/10) })
	b.StopTimer()
	got, cpu, el := api.ok.Load()-from, cpuTime()-cpu0, time.Since(t0)
	runtime.ReadMemStats(&m1)
	if err := stop(); err != nil {
		b.Fatalf("Run: %v", err)
	}
	b.ReportMetric(float64(got)/el.Seconds(), "reports/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(got), "cpu_µs/report")
	b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/float64(got), "allocs/report")
	b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/float64(got), "B/report")
	b.ReportMetric(float64(m1.NumGC-m0.NumGC)*1e4/float64(got), "GCs/10k_reports")
}

// cpuTime is the CPU time (user and system) of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
