//go:build unix

package sandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// BenchmarkLeanVsDefault compares the sandbox as `playpipe sandbox` serves it
// (telemetry set up, every request in the otelhttp middleware, the default
// ledger) with `playpipe sandbox --lean` (no middleware, bounded ledger),
// under the same keep-alive load over loopback (32 requests in flight). It
// reports reports/s and the process's CPU µs per report (client included:
// the client is the same in both, so the difference is the server's).
//
//	go test -run '^$' -bench LeanVsDefault -benchtime 100000x -count 3 ./partnerapi/sandbox/
func BenchmarkLeanVsDefault(b *testing.B) {
	tel, shutdown, err := telemetry.Setup(context.Background(), telemetry.Config{ServiceName: "playpipe-sandbox-bench"})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = shutdown(context.Background()) }()
	for _, lean := range []bool{false, true} {
		name := "default"
		if lean {
			name = "lean"
		}
		b.Run(name, func(b *testing.B) {
			srv, err := sandbox.New(sandbox.Config{Seed: 1, Lean: lean})
			if err != nil {
				b.Fatal(err)
			}
			h := srv.Handler()
			if !lean {
				h = telemetry.HTTPHandler(h, "sandbox", tel)
			}
			url := testenv.ServeHandler(b, h) + "/partners/royalty-tracking"
			tok := srv.MintToken(0, false)
			m := srv.Catalog().Mixes[0]
			body, _ := json.Marshal(map[string]any{"trackid": m.Tracks[1].ID, "playedat": int64(1763000000000), "playlength": 30, "sourcestream": "mix", "sourcedetail": m.Title, "os": "iOS 17.4", "device": "phone", "country": "US", "vendor": 7, "userid": "user-1", "isrc": m.Tracks[1].ISRC})
			tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256, IdleConnTimeout: time.Minute}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			b.SetParallelism(16)
			b.ReportAllocs()
			cpu0 := cpuTime()
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
					req.Header.Set("User-Agent", testUA)
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Authorization", tok)
					res, err := hc.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						b.Errorf("status %d", res.StatusCode)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reports/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/report")
			if got := srv.Counts().Accepted; got != int64(b.N) {
				b.Fatalf("counted %d of %d reports", got, b.N)
			}
		})
	}
}

// cpuTime is the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
