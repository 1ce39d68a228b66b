package gateway

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/testkit/producertest"
)

// TestGatewayMetricLabelsBounded guards against unbounded /metrics growth: 5000
// requests with random Host headers (and random ports, paths and methods)
// must not add a series: the /metrics page stays within ±10 % of its size
// after a warm-up that made every bounded series once.
func TestGatewayMetricLabelsBounded(t *testing.T) {
	e := startGateway(t, Config{RatePerKey: 1e6}, producer.Config{})
	metrics := httptest.NewServer(promhttp.HandlerFor(producertest.PromRegistry, promhttp.HandlerOpts{}))
	t.Cleanup(metrics.Close)
	scrape := func() (int, string) {
		resp, err := http.Get(metrics.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("scrape: %d %v", resp.StatusCode, err)
		}
		return len(b), string(b)
	}
	// The kinds of request: an accepted event, a wrong key, a refused
	// media type, the health route, an unknown path, an unknown method.
	do := func(i int, host string, random bool) {
		var req *http.Request
		path, method := "/nowhere", "BREW"
		if random {
			path, method = fmt.Sprintf("/x%d/%d", rand.Int64(), i), fmt.Sprintf("M%d", rand.IntN(1e6))
		}
		switch i % 6 {
		case 0:
			req, _ = http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", bytes.NewReader(producertest.ValidEvent(fmt.Sprint("m-", host, i))))
			req.Header.Set("X-API-Key", acmeKey)
		case 1:
			req, _ = http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", strings.NewReader("{}"))
			req.Header.Set("X-API-Key", "wrong")
		case 2:
			req, _ = http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", strings.NewReader("<e/>"))
			req.Header.Set("X-API-Key", acmeKey)
			req.Header.Set("Content-Type", "application/xml")
		case 3:
			req, _ = http.NewRequest(http.MethodGet, e.srv.URL+"/healthz", nil)
		case 4:
			req, _ = http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
		case 5:
			req, _ = http.NewRequest(method, e.srv.URL+"/v1/events", nil)
		}
		req.Host = host
		resp, err := e.srv.Client().Do(req)
		if err != nil {
			t.Errorf("request %d: %v", i, err)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	run := func(n int, host func(i int) string, random bool) {
		var wg sync.WaitGroup
		next := make(chan int)
		for range 16 {
			wg.Go(func() {
				for i := range next {
					do(i, host(i), random)
				}
			})
		}
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
	}
	run(600, func(int) string { return "ingest.example:8090" }, false)
	before, _ := scrape()
	run(5000, func(i int) string {
		return fmt.Sprintf("h%d-%x.example:%d", i, rand.Uint64(), 1+rand.IntN(65534))
	}, true)
	after, page := scrape()
	t.Logf("/metrics: %d bytes after the warm-up, %d after 5000 random-Host requests", before, after)
	if d := float64(after-before) / float64(before); d > 0.10 || d < -0.10 {
		t.Errorf("/metrics grew from %d to %d bytes (%+.0f %%)", before, after, 100*d)
	}
	for _, leak := range []string{".example", "/x", `"M`} {
		if strings.Contains(page, leak) {
			i := strings.Index(page, leak)
			t.Errorf("/metrics holds a request value %q: …%s…", leak, page[max(0, i-200):min(len(page), i+100)])
		}
	}
}
