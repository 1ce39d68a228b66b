package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestSandboxHelpDocumentsFlagsAndAdminAPI(t *testing.T) {
	var out syncBuffer
	err := runSandbox(context.Background(), []string{"--help"}, &out, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("help: err %v\n%s", err, out.String())
	}
	for _, want := range []string{"-addr", "-admin-addr", "-seed", "-client-signature", "-live-token-ttl", "-standby-token-ttl", "-strict", "-lean", "-faults", "PATCH  /admin/faults", "PUT    /admin/mode", "/admin/faults", "/admin/ledger", "/admin/reset", "/admin/counters"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestSandboxRefusesPublicAdminWithoutFlag(t *testing.T) {
	var out syncBuffer
	err := runSandbox(context.Background(), []string{"--addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0"}, &out, &out)
	if !errors.Is(err, errUsage) || !strings.Contains(out.String(), "--admin-public") {
		t.Fatalf("err %v, output %s", err, out.String())
	}
	err = runSandbox(context.Background(), []string{"--client-id", "short"}, &out, &out)
	if err == nil || !strings.Contains(err.Error(), "ClientID") {
		t.Fatalf("short client id: %v", err)
	}
}

func TestSandboxServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runSandbox(ctx, []string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--seed", "3", "--mode", "standby"}, &out, &out)
	}()
	re := regexp.MustCompile(`listener=(api|admin) url=(http://[0-9.:]+)`)
	urls := map[string]string{}
	for deadline := time.Now().Add(10 * time.Second); len(urls) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no listen lines in %s", out.String())
		}
		for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
			urls[m[1]] = m[2]
		}
	}
	req, _ := http.NewRequest("POST", urls["api"]+"/partners/session", strings.NewReader(`{}`))
	req.Header.Set("User-Agent", "playpipe-test/1 (partner integration)")
	req.Header.Set("Content-Type", "application/json") // strict by default
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("X-Service-Served-By") != "standby" || !strings.Contains(string(body), `"session":{"token":"`) {
		t.Fatalf("standby session: %d %s", res.StatusCode, body)
	}
	res, err = http.Get(urls["admin"] + "/admin/mode")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(string(body), `"standby"`) {
		t.Fatalf("admin mode %s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("sandbox did not stop")
	}
	if strings.Contains(out.String(), "SANDBOX-ONLY-signature") {
		t.Fatal("the client signature appears in the logs")
	}
}

// startSandboxCmd runs `playpipe sandbox args…` in-process on free loopback
// ports and returns the API and admin URLs; the run stops when the test ends.
func startSandboxCmd(t *testing.T, args ...string) (api, admin string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- runSandbox(ctx, append([]string{"--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, args...), &out, &out)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("sandbox run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("sandbox did not stop")
		}
	})
	re := regexp.MustCompile(`listener=(api|admin) url=(http://[0-9.:]+)`)
	urls := map[string]string{}
	for deadline := time.Now().Add(10 * time.Second); len(urls) < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no listen lines in %s", out.String())
		}
		for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
			urls[m[1]] = m[2]
		}
	}
	return urls["api"], urls["admin"]
}

// post sends a session request with the given Content-Type ("" for none).
func postSession(t *testing.T, api, contentType string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", api+"/partners/session", strings.NewReader(`{"client_id":"playpipe01","client_signature":"SANDBOX-ONLY-signature-not-a-real-secret"}`))
	req.Header.Set("User-Agent", "playpipe-test/1 (partner integration)")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// The command is strict by default; --strict=false is lenient.
func TestSandboxStrictByDefault(t *testing.T) {
	api, _ := startSandboxCmd(t)
	if st := postSession(t, api, "text/plain"); st != 415 {
		t.Fatalf("default: non-JSON session body answered %d, want 415", st)
	}
	if st := postSession(t, api, "application/json"); st != 200 {
		t.Fatalf("default: JSON session body answered %d", st)
	}
	api, _ = startSandboxCmd(t, "--strict=false")
	if st := postSession(t, api, "text/plain"); st != 200 {
		t.Fatalf("--strict=false: non-JSON session body answered %d, want 200", st)
	}
}

func metricsSize(t *testing.T, admin string) (int, string) {
	t.Helper()
	res, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("/metrics: %d %v", res.StatusCode, err)
	}
	return len(b), string(b)
}

// No metric label value comes from the request. 5 000 requests
// with random Host headers (and random paths and ids) leave /metrics the
// same size (±10 %).
func TestSandboxMetricsBoundedUnderRandomHosts(t *testing.T) {
	for _, args := range [][]string{nil, {"--lean"}} {
		t.Run(strings.Join(append([]string{"args"}, args...), " "), func(t *testing.T) {
			api, admin := startSandboxCmd(t, args...)
			tr := &http.Transport{MaxIdleConnsPerHost: 8}
			defer tr.CloseIdleConnections()
			hc := &http.Client{Transport: tr}
			send := func(i int, host string) {
				paths := []string{"/partners/catalog", "/partners/mix/" + strconv.Itoa(i), "/random/" + strconv.Itoa(i), "/partners/page/x" + strconv.Itoa(i)}
				req, _ := http.NewRequest("GET", api+paths[i%len(paths)], nil)
				req.Header.Set("User-Agent", "playpipe-test/1 (partner integration)")
				req.Host = host
				res, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			// Warm up every bounded series: each path kind and answer, and a session.
			for i := range 40 {
				send(i, "")
			}
			if st := postSession(t, api, "application/json"); st != 200 {
				t.Fatalf("session %d", st)
			}
			before, _ := metricsSize(t, admin)
			for i := range 5000 {
				send(i, fmt.Sprintf("h%d-%x.example:%d", i, rand.Uint64(), 1+rand.IntN(65535)))
			}
			after, text := metricsSize(t, admin)
			if strings.Contains(text, ".example") {
				t.Fatal("a Host header value is a metric label")
			}
			if d := after - before; d*10 > before || -d*10 > before {
				t.Fatalf("/metrics grew from %d to %d bytes after 5000 random Host headers", before, after)
			}
			t.Logf("/metrics %d → %d bytes", before, after)
		})
	}
}

// --lean leaves out the tracing middleware. The meter provider is shared by
// the whole test binary (telemetry's is process-wide) and the middleware's
// series carry no per-run label (no Host or port: bounded labels), so a
// request must move its request count in the default mode and leave it
// alone in lean mode.
func TestSandboxLeanFlag(t *testing.T) {
	if err := runSandbox(context.Background(), []string{"--max-ledger-entries", "-1"}, io.Discard, io.Discard); !errors.Is(err, errUsage) {
		t.Fatalf("--max-ledger-entries -1: %v", err)
	}
	for _, lean := range []bool{true, false} {
		var args []string
		if lean {
			args = []string{"--lean"}
		}
		api, admin := startSandboxCmd(t, args...)
		_, text := metricsSize(t, admin)
		before := sumSeries(text, "http_server_request_duration_seconds_count")
		if st := postSession(t, api, "application/json"); st != 200 {
			t.Fatalf("session %d", st)
		}
		_, text = metricsSize(t, admin)
		after := sumSeries(text, "http_server_request_duration_seconds_count")
		if traced := after > before; traced == lean {
			t.Fatalf("lean=%v: otelhttp request count %v → %v", lean, before, after)
		}
	}
}

// sumSeries adds up the samples of one metric in a Prometheus text page.
func sumSeries(text, name string) float64 {
	var sum float64
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// TestSandboxProcessRefusesCrossOrigin runs the built `playpipe sandbox` as
// a separate process and drives its admin API as a hostile web page would
// (text/plain PUT, a foreign Origin, a rebound Host): refused with 415/403
// and nothing changes; the README's curl form (JSON with Content-Type) works.
func TestSandboxProcessRefusesCrossOrigin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := playpipeBinary(t)
	cmd := exec.Command(bin, "sandbox", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var w lineWatcher
	go w.read(pr)
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		pw.Close()
	})
	admin := w.wait(t, regexp.MustCompile(`listener=admin url=(http://[0-9.:]+)`), 30*time.Second)[1]
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(admin, "http://"))
	do := func(method, path, body string, hdr ...string) (int, string) {
		t.Helper()
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req, err := http.NewRequest(method, admin+path, rd)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			if hdr[i] == "Host" {
				req.Host = hdr[i+1]
			} else {
				req.Header.Set(hdr[i], hdr[i+1])
			}
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	standby := `{"mode":"standby"}`
	for _, c := range []struct {
		name, method, path, body string
		hdr                      []string
		want                     int
	}{
		{"text/plain PUT", "PUT", "/admin/mode", standby, []string{"Content-Type", "text/plain"}, 415},
		{"foreign Origin revoke", "POST", "/admin/revoke-tokens", "", []string{"Origin", "http://evil.example"}, 403},
		{"foreign Origin JSON PUT", "PUT", "/admin/mode", standby, []string{"Origin", "https://evil.example", "Content-Type", "application/json"}, 403},
		{"rebound Host", "PUT", "/admin/mode", standby, []string{"Host", "evil.example:" + port, "Content-Type", "application/json"}, 403},
	} {
		if got, body := do(c.method, c.path, c.body, c.hdr...); got != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, got, body, c.want)
		}
	}
	if _, body := do("GET", "/admin/mode", ""); !strings.Contains(body, `"live"`) {
		t.Fatalf("a refused request changed the mode: %s", body)
	}
	// The README's form: curl -X PUT -H 'Content-Type: application/json' -d '{"mode":"standby"}'.
	if got, body := do("PUT", "/admin/mode", standby, "Content-Type", "application/json"); got != 200 {
		t.Fatalf("JSON PUT: %d %s", got, body)
	}
	if _, body := do("GET", "/admin/mode", ""); !strings.Contains(body, `"standby"`) {
		t.Fatalf("mode after JSON PUT: %s", body)
	}
}
