package partnerapi_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The play-report path against the real sandbox on loopback, next to a plain
// net/http client posting the same bytes to the same sandbox, so that the
// ratio is measured in one run:
//
//	go test -run '^$' -bench 'ReportPlay|RawPOST' -benchtime 2s -count 3 ./partnerapi/
//
// Both run 32 requests in flight (SetParallelism 16 × GOMAXPROCS 2).

const benchParallelism = 16

// cpuTime is the CPU time (user + system) this process has used. Client and
// sandbox share the process, and the sandbox's share is the same in every
// benchmark, so CPU-µs per report compares the clients even on a machine
// busy with other work, where reports/s swings with the neighbours.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// report ends a benchmark with reports/s and CPU-µs/report.
func report(b *testing.B, cpu0 time.Duration) {
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
	b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/report")
}

func benchReport(b *testing.B) (*testenv.Sandbox, schemas.PlayReport) {
	sb := testenv.StartSandbox(b)
	m := &sb.Catalog().Mixes[0]
	return sb, goodReport(m, 0)
}

func benchClient(b *testing.B, sb *testenv.Sandbox) *partnerapi.Client {
	c, err := partnerapi.New(partnerapi.Config{
		BaseURL:     sb.URL,
		Credentials: partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature},
		Logger:      slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.Close)
	if _, err := c.Session(context.Background()); err != nil {
		b.Fatal(err)
	}
	return c
}

// BenchmarkReportPlay: Client.ReportPlay (encoding included), parallel.
func BenchmarkReportPlay(b *testing.B) {
	sb, r := benchReport(b)
	c := benchClient(b, sb)
	ctx := context.Background()
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.ReportPlay(ctx, r); err != nil {
				b.Error(err)
				return
			}
		}
	})
	report(b, cpu0)
}

// BenchmarkReportPlayJSON: Client.ReportPlayJSON with a pre-encoded body.
func BenchmarkReportPlayJSON(b *testing.B) {
	sb, r := benchReport(b)
	c := benchClient(b, sb)
	body := schemas.AppendReportJSON(nil, &r)
	ctx := context.Background()
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.ReportPlayJSON(ctx, body); err != nil {
				b.Error(err)
				return
			}
		}
	})
	report(b, cpu0)
}

// BenchmarkRawPOST: the ceiling. A plain net/http client with a keep-alive
// transport sized like the client's, posting the same bytes with the same
// headers, reading and discarding the answer, checking only the status.
func BenchmarkRawPOST(b *testing.B) {
	sb, r := benchReport(b)
	body := schemas.AppendReportJSON(nil, &r)
	tok := sb.MintToken(0, false)
	tr := &http.Transport{MaxIdleConns: 64, MaxIdleConnsPerHost: 64, MaxConnsPerHost: 64}
	b.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	url := sb.URL + partnerapi.PathRoyaltyTracking
	ua := version.UserAgent()
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
			req.Header.Set("User-Agent", ua)
			req.Header.Set("Authorization", tok)
			req.Header.Set("Content-Type", "application/json")
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	report(b, cpu0)
}
