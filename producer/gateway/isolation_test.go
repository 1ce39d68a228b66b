package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/testkit/producertest"
)

// slowRequest is a POST /v1/events written by hand on a raw connection: it
// declares contentLength bytes, sends first at once, then one byte every
// interval until the server answers, the connection fails or stop closes.
type slowRequest struct {
	conn net.Conn
	resp chan slowAnswer
}

type slowAnswer struct {
	status int
	code   string
	err    error
	after  time.Duration
}

func startSlowRequest(addr, key string, contentLength int, first string, interval time.Duration, stop <-chan struct{}) *slowRequest {
	s := &slowRequest{resp: make(chan slowAnswer, 1)}
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil { // reported through the answer: this may run outside the test goroutine
		s.resp <- slowAnswer{err: err}
		return s
	}
	s.conn = conn
	began := time.Now()
	hdr := fmt.Sprintf("POST /v1/events HTTP/1.1\r\nHost: %s\r\nX-API-Key: %s\r\nContent-Type: application/x-ndjson\r\nContent-Length: %d\r\n\r\n%s", addr, key, contentLength, first)
	if _, err := io.WriteString(conn, hdr); err != nil {
		conn.Close()
		s.resp <- slowAnswer{err: err}
		return s
	}
	answered := make(chan struct{})
	go func() { // the trickle: ends with the answer, a write error or stop
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-answered:
				return
			case <-stop:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte{' '}); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		defer close(answered)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		a := slowAnswer{err: err, after: time.Since(began)}
		if err == nil {
			var er ErrorResponse
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			_ = json.Unmarshal(b, &er)
			resp.Body.Close()
			a.status, a.code = resp.StatusCode, er.Code
		}
		s.resp <- a
	}()
	return s
}

func (s *slowRequest) close() {
	if s.conn != nil {
		s.conn.Close()
	}
}

func (s *slowRequest) wait(t *testing.T, d time.Duration) slowAnswer {
	t.Helper()
	select {
	case a := <-s.resp:
		return a
	case <-time.After(d):
		t.Fatalf("no answer within %s", d)
		return slowAnswer{}
	}
}

func hostOf(t *testing.T, e *gatewayEnv) string {
	t.Helper()
	return strings.TrimPrefix(e.srv.URL, "http://")
}

// TestGatewaySlowBodyCut: a body that stops arriving is cut with 408
// slow_body once the grace period and its bytes' allowance are spent, and
// the connection is closed.
func TestGatewaySlowBodyCut(t *testing.T) {
	e := startGateway(t, Config{MinBodyRate: 1000, BodyGrace: 300 * time.Millisecond, ReadTimeout: 20 * time.Second}, producer.Config{})
	stop := make(chan struct{})
	defer close(stop)
	s := startSlowRequest(hostOf(t, e), acmeKey, 100_000, `{"event_id":`, time.Hour, stop)
	defer s.close()
	a := s.wait(t, 10*time.Second)
	if a.err != nil || a.status != http.StatusRequestTimeout || a.code != "slow_body" {
		t.Fatalf("answer %+v, want 408 slow_body", a)
	}
	// 12 bytes at 1000 B/s after 300 ms: cut at about 312 ms, never before the grace.
	if a.after < 300*time.Millisecond {
		t.Errorf("cut after %s, before the grace period", a.after)
	}
	_ = s.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := s.conn.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("connection still open after the cut: read %d, %v", n, err)
	}
	if e.gw.inflight[0].Load() != 0 || len(e.gw.slots) != 0 {
		t.Errorf("slots not released: key %d, global %d", e.gw.inflight[0].Load(), len(e.gw.slots))
	}
}

// TestGatewayReadTimeout: a body that keeps above the minimum rate but is
// not complete within ReadTimeout is cut with 408 read_timeout.
func TestGatewayReadTimeout(t *testing.T) {
	e := startGateway(t, Config{MinBodyRate: 1, BodyGrace: time.Millisecond, ReadTimeout: 800 * time.Millisecond}, producer.Config{})
	stop := make(chan struct{})
	defer close(stop)
	s := startSlowRequest(hostOf(t, e), acmeKey, 10_000, "{", 50*time.Millisecond, stop) // 20 B/s
	defer s.close()
	a := s.wait(t, 10*time.Second)
	if a.err != nil || a.status != http.StatusRequestTimeout || a.code != "read_timeout" {
		t.Fatalf("answer %+v, want 408 read_timeout", a)
	}
	if a.after < 800*time.Millisecond {
		t.Errorf("cut after %s, before the read timeout", a.after)
	}
	// A complete body within the limits still passes on the same gateway.
	if resp, b := e.post(t, "", producertest.ValidEvent("in-time"), bearer...); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("ordinary request: %d %s", resp.StatusCode, b)
	}
}

// TestGatewayPerKeyConcurrency: a key with MaxConcurrentPerKey requests in
// flight gets 429 concurrency_limited for the next one, before it takes a
// global slot; another key is served; the key's slots come back.
func TestGatewayPerKeyConcurrency(t *testing.T) {
	e := startGateway(t, Config{MaxConcurrent: 8, MaxConcurrentPerKey: 2, BodyGrace: time.Minute}, producer.Config{})
	stop := make(chan struct{})
	var held []*slowRequest
	for range 2 {
		held = append(held, startSlowRequest(hostOf(t, e), acmeKey, 1000, "", time.Hour, stop))
	}
	deadline := time.Now().Add(10 * time.Second)
	for e.gw.inflight[0].Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := e.gw.inflight[0].Load(); n != 2 {
		t.Fatalf("acme has %d requests in flight, want 2", n)
	}
	resp, b := e.post(t, "", producertest.ValidEvent("third"), bearer...)
	if resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(b), `"concurrency_limited"`) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("acme's third request: %d %s, want 429 concurrency_limited", resp.StatusCode, b)
	}
	if len(e.gw.slots) != 2 {
		t.Errorf("%d global slots taken, want 2 (the refused request must not take one)", len(e.gw.slots))
	}
	if resp, b := e.post(t, "", producertest.ValidEvent("other"), "X-API-Key", otherKey); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("other key while acme is at its limit: %d %s", resp.StatusCode, b)
	}
	close(stop)
	for _, s := range held {
		s.close()
	}
	deadline = time.Now().Add(10 * time.Second)
	for e.gw.inflight[0].Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if resp, b := e.post(t, "", producertest.ValidEvent("after"), bearer...); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("acme after its slow requests ended: %d %s", resp.StatusCode, b)
	}
}

// TestGatewaySlowBodyAttackIsolation is a slow-body attack, end to end over
// loopback HTTP with a kfake broker: for 6 s, 64 connections with fleet A's
// key each declare Content-Length 1000000 and send one byte a second
// (reconnecting when answered). Fleet B posts an event every 100 ms the whole
// time: every answer must be 202 within 1 s. The attack must have reached
// A's own limits (429 concurrency_limited, 408 slow_body), never B's.
func TestGatewaySlowBodyAttackIsolation(t *testing.T) {
	if testing.Short() {
		t.Skip("a 6 s attack")
	}
	e := startGateway(t, Config{MinBodyRate: 100, BodyGrace: 2 * time.Second}, producer.Config{}) // 64 slots, 16 per key
	addr := hostOf(t, e)
	if resp, b := e.post(t, "", producertest.ValidEvent("b-warm-up"), "X-API-Key", otherKey); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("warm-up: %d %s", resp.StatusCode, b)
	}

	const attackFor = 6 * time.Second
	stop := make(chan struct{})
	var (
		mu       sync.Mutex
		answers  = map[string]int{} // "status code" of A's answers
		maxHeld  atomic.Int32
		attackWG sync.WaitGroup
	)
	end := time.Now().Add(attackFor)
	for range 64 {
		attackWG.Add(1)
		go func() {
			defer attackWG.Done()
			for time.Now().Before(end) {
				s := startSlowRequest(addr, acmeKey, 1_000_000, "", time.Second, stop)
				var a slowAnswer
				select {
				case a = <-s.resp:
				case <-stop:
				}
				s.close()
				if a.err == nil && a.status != 0 {
					mu.Lock()
					answers[fmt.Sprint(a.status, " ", a.code)]++
					mu.Unlock()
				}
				select { // an attacker reconnects, but not in a tight loop
				case <-time.After(200 * time.Millisecond):
				case <-stop:
					return
				}
			}
		}()
	}
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				if n := e.gw.inflight[0].Load(); n > maxHeld.Load() {
					maxHeld.Store(n)
				}
			}
		}
	}()

	client := &http.Client{Timeout: 5 * time.Second}
	var worst time.Duration
	sent := 0
	// Let the attack take its slots first: fleet A at its per-key limit.
	for deadline := time.Now().Add(5 * time.Second); e.gw.inflight[0].Load() < 16; {
		if time.Now().After(deadline) {
			t.Fatalf("the attack holds %d requests after 5 s, want the per-key limit 16", e.gw.inflight[0].Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	for i := 0; time.Now().Before(end); i++ {
		body := strings.NewReader(string(producertest.ValidEvent(fmt.Sprintf("b-%d", i))))
		req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/events", body)
		req.Header.Set("X-API-Key", otherKey)
		began := time.Now()
		resp, err := client.Do(req)
		took := time.Since(began)
		if err != nil {
			t.Fatalf("fleet B request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted || !strings.Contains(string(b), `"accepted":1`) {
			t.Errorf("fleet B request %d during the attack: %d %s", i, resp.StatusCode, b)
		}
		worst = max(worst, took)
		sent++
		time.Sleep(100 * time.Millisecond) // fleet B's pace (scenario): an event every 100 ms
	}
	close(stop)
	attackWG.Wait()
	<-watchDone

	t.Logf("fleet B: %d requests, slowest answer %s; fleet A's answers: %v; A's most requests in flight: %d", sent, worst, answers, maxHeld.Load())
	if worst >= time.Second {
		t.Errorf("fleet B's slowest answer took %s, want < 1 s", worst)
	}
	if sent < 20 {
		t.Errorf("fleet B sent only %d requests during the attack", sent)
	}
	mu.Lock()
	defer mu.Unlock()
	if answers["429 concurrency_limited"] == 0 || answers["408 slow_body"] == 0 {
		t.Errorf("the attack did not reach fleet A's limits: %v", answers)
	}
	if answers["503 overloaded"] > 0 || answers["202 "] > 0 {
		t.Errorf("fleet A's answers: %v", answers)
	}
	if maxHeld.Load() != 16 {
		t.Errorf("fleet A held at most %d requests, want the per-key limit 16", maxHeld.Load())
	}
}
