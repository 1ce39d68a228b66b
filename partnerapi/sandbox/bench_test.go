package sandbox_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// BenchmarkReportThroughput posts play reports over loopback with keep-alive
// clients (RunParallel: GOMAXPROCS × parallelism goroutines) and reports
// reports/s. Client and server share the machine, as in a load test.
//
//	go test -run '^$' -bench ReportThroughput -benchtime 3s ./partnerapi/sandbox/
func BenchmarkReportThroughput(b *testing.B) {
	for _, par := range []int{4, 16} {
		b.Run("inflight="+itoa(par*2), func(b *testing.B) {
			sb := testenv.StartSandbox(b)
			a := newAPI(b, sb)
			tok := a.session()
			body, _ := json.Marshal(validReport(sb))
			tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256, IdleConnTimeout: time.Minute}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			url := sb.URL + "/partners/royalty-tracking"
			b.SetParallelism(par)
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
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
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reports/s")
			if got := sb.Ledger().AcceptedCount; got < int64(b.N) {
				b.Fatalf("ledger has %d of %d reports", got, b.N)
			}
		})
	}
}

// BenchmarkValidateReport is the validator alone.
func BenchmarkValidateReport(b *testing.B) {
	body := []byte(`{"trackid":400001,"playedat":1763000000000,"playlength":30,"sourcestream":"mix","sourcedetail":"Ignite Horizon","os":"iOS 17.4","device":"phone","country":"US","vendor":7,"userid":"user-1","isrc":"USABC2412345","cachedplay":false}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sandbox.ValidateReport(body); err != nil {
			b.Fatal(err)
		}
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// BenchmarkBaselinePlainServer is the ceiling of the same client against a
// net/http server that only reads the body and answers a fixed 200: compare
// BenchmarkReportThroughput to it within one run (the machine is shared and
// noisy; ratios are what carry over).
func BenchmarkBaselinePlainServer(b *testing.B) {
	ok := []byte(`{"error":false,"message":"success"}`)
	url := testenv.ServeHandler(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(ok)
	}))
	body := []byte(`{"trackid":400001,"playedat":1763000000000,"playlength":30,"sourcestream":"mix","sourcedetail":"Ignite Horizon","os":"iOS 17.4","device":"phone","country":"US","vendor":7,"userid":"user-1","isrc":"USABC2412345"}`)
	tr := &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	b.SetParallelism(16)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest("POST", url+"/partners/royalty-tracking", bytes.NewReader(body))
			req.Header.Set("User-Agent", testUA)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "x")
			res, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reports/s")
}

// BenchmarkReportHandler is the server's own CPU per accepted report (no
// network): the handler called directly, in parallel.
func BenchmarkReportHandler(b *testing.B) {
	srv, err := sandbox.New(sandbox.Config{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	tok := srv.MintToken(0, false)
	m := srv.Catalog().Mixes[0]
	body, _ := json.Marshal(map[string]any{"trackid": m.Tracks[1].ID, "playedat": int64(1763000000000), "playlength": 30, "sourcestream": "mix", "sourcedetail": m.Title, "os": "iOS 17.4", "device": "phone", "country": "US", "vendor": 7, "userid": "user-1", "isrc": m.Tracks[1].ISRC})
	h := srv.Handler()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		w := &discardWriter{h: http.Header{}}
		for pb.Next() {
			req, _ := http.NewRequest("POST", "/partners/royalty-tracking", bytes.NewReader(body))
			req.Header.Set("User-Agent", testUA)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", tok)
			clear(w.h)
			h.ServeHTTP(w, req)
			if w.status != 200 {
				b.Fatalf("status %d", w.status)
			}
		}
	})
}

type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(s int)           { w.status = s }
