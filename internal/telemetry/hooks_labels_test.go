package telemetry

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHTTPHandlerLabelsBounded: requests with random Host headers, ports,
// paths and methods add no label value to the http.server.* metrics of an
// HTTPHandler: one series per (route, method, status) whatever the client sent.
func TestHTTPHandlerLabelsBounded(t *testing.T) {
	clearEnv(t)
	p := setup(t, Config{})
	mux := http.NewServeMux()
	mux.HandleFunc("GET /item/{id}", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := httptest.NewServer(HTTPHandler(mux, "bounded-labels-test", p))
	defer srv.Close()
	for i := range 300 {
		path, method := fmt.Sprintf("/item/%d", rand.Int64()), http.MethodGet
		switch i % 3 {
		case 1:
			path = fmt.Sprintf("/rand%x/%d", rand.Uint64(), i)
		case 2:
			method = fmt.Sprintf("VERB%d", i)
		}
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		req.Host = fmt.Sprintf("host-%x.example:%d", rand.Uint64(), 1+rand.IntN(65534))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	ms := httptest.NewServer(MetricsHandler())
	defer ms.Close()
	resp, err := http.Get(ms.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	series := grep(string(b), `server_address="bounded-labels-test"`)
	var counts []string
	for _, l := range strings.Split(series, "\n") {
		if strings.HasPrefix(l, "http_server_request_duration_seconds_count{") {
			counts = append(counts, l)
		}
	}
	// GET /item/{id} 204, GET 404 (no route), _OTHER 405 (method not allowed on an unknown path: 404).
	if len(counts) == 0 || len(counts) > 3 {
		t.Errorf("%d request-duration series, want 1–3:\n%s", len(counts), strings.Join(counts, "\n"))
	}
	for _, leak := range []string{".example", "server_port=", "/rand", "VERB"} {
		if strings.Contains(string(b), leak) {
			t.Errorf("/metrics holds %q:\n%s", leak, grep(string(b), leak))
		}
	}
}
