//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/backoff"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/version"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/schemas"
)

// reportBodies reads the reports topic from the start until it holds want
// records, and returns the exact report bodies the reporter posts (the raw
// "report" member of every play that is not below the minimum).
func reportBodies(ctx context.Context, brokers []string, prefix string, want int64) ([][]byte, error) {
	topic := kafkax.TopicsFor(prefix).Reports
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(200*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("kafka client: %w", err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var bodies [][]byte
	var read int64
	for read < want {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("read back %s: %d of %d records: %w", topic, read, want, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) { ferr = fmt.Errorf("fetch %s[%d]: %w", t, p, err) })
		if ferr != nil {
			return nil, ferr
		}
		var derr error
		fs.EachRecord(func(r *kgo.Record) {
			read++
			var tp schemas.TrackPlayHead
			if err := schemas.DecodeTrackPlayHead(r.Value, &tp); err != nil {
				derr = fmt.Errorf("%s[%d]@%d: %w", r.Topic, r.Partition, r.Offset, err)
				return
			}
			if !tp.BelowMinimum {
				bodies = append(bodies, tp.Report)
			}
		})
		if derr != nil {
			return nil, derr
		}
	}
	return bodies, nil
}

// ceilingResult is the plain client's run.
type ceilingResult struct {
	posts      int // reports, each answered 200 once
	retried    int // answers retried (500, 503, 429 …, timeouts): posts beyond the reports
	elapsed    time.Duration
	half, most time.Duration // start → half, and nine tenths, of the reports final
	clientCPU  time.Duration // this process during the run (the client; the broker is idle)
	sandboxCPU time.Duration
	busy       float64 // the machine's CPU busy share during the run
	steal      float64 // the machine's CPU share stolen by the hypervisor
}

func (c ceilingResult) rate() float64 { return float64(c.posts) / c.elapsed.Seconds() }

// steadyRate is the rate between half and nine tenths of the reports
// final: the reporter's steady window (latencyRun.steady), without the
// tail of reports held until the timeout.
func (c ceilingResult) steadyRate() float64 {
	return 0.4 * float64(c.posts) / (c.most - c.half).Seconds()
}

// cpuPerPost is the client's CPU µs per report.
func (c ceilingResult) cpuPerPost() float64 { return us(c.clientCPU) / float64(c.posts) }

// plainRetry is the plain client's retry policy: the reporter's defaults
// (exponential from 100 ms to 10 s, equal jitter, Retry-After honoured up
// to 2 min), per report, without holding a slot while it waits.
var plainRetry = backoff.Policy{Initial: reporter.DefaultBackoffInitial, Max: reporter.DefaultBackoffMax, Jitter: backoff.Equal, RetryAfterMax: reporter.DefaultRetryAfterMax}

// plainTimeout is the plain client's timeout per post: the reporter's
// default --api-timeout. A post that times out is retried like a 500. A
// variable for the tests.
var plainTimeout = partnerapi.DefaultRequestTimeout

// retryable reports whether the plain client posts again after status:
// the transient answers the reporter retries (partnerapi: 408, 429, 5xx).
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500 || status == statusTimeout
}

// statusTimeout is post's status for a post with no answer within
// plainTimeout (the reporter retries a timeout too).
const statusTimeout = -1

// ceiling resets the sandbox's ledger (the bodies were accepted once
// already: posted again they would be answered as duplicates), sets the
// faults sf, mints a token, and posts every body with conc goroutines over
// conc keep-alive connections: a plain net/http client, the way a minimal
// reporter would. An answer retryable says is posted again after
// plainRetry's delay, as the reporter retries (the report waits in a queue,
// its goroutine posts the next one); any other non-200 answer fails the run.
func ceiling(ctx context.Context, apiURL, sbAdmin string, sbPID int, bodies [][]byte, conc int, sf sandboxFaults) (ceilingResult, error) {
	var res ceilingResult
	admin := &http.Client{Timeout: 10 * time.Second}
	if err := adminPost(ctx, admin, "http://"+sbAdmin+"/admin/reset", "", nil); err != nil {
		return res, err
	}
	if err := setFaults(ctx, sbAdmin, sf); err != nil { // the reset cleared them
		return res, err
	}
	var tok struct {
		Token string `json:"token"`
	}
	if err := adminPost(ctx, admin, "http://"+sbAdmin+"/admin/token", `{"ttl":"1h"}`, &tok); err != nil {
		return res, err
	}
	if tok.Token == "" {
		return res, fmt.Errorf("sandbox /admin/token: no token in the answer")
	}

	tr := &http.Transport{MaxIdleConns: conc, MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: plainTimeout}
	ua := version.UserAgent()
	url := apiURL + "/partners/royalty-tracking"
	var next, failed, retried, final, half, most atomic.Int64
	var firstErr atomic.Value
	// post answers the status and Retry-After of one post (0: no answer;
	// statusTimeout: none within plainTimeout).
	post := func(body []byte) (int, time.Duration) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			firstErr.CompareAndSwap(nil, err.Error())
			return 0, 0
		}
		req.Header["User-Agent"] = []string{ua}
		req.Header["Authorization"] = []string{tok.Token}
		req.Header["Content-Type"] = []string{"application/json"}
		resp, err := hc.Do(req)
		if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			return statusTimeout, 0
		}
		if err != nil {
			firstErr.CompareAndSwap(nil, err.Error())
			return 0, 0
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		var ra time.Duration
		if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
			ra = time.Duration(n) * time.Second
		}
		if resp.StatusCode != http.StatusOK && !retryable(resp.StatusCode) {
			firstErr.CompareAndSwap(nil, "HTTP "+resp.Status)
		}
		return resp.StatusCode, ra
	}
	type item struct{ i, failures int }
	n := int64(len(bodies))
	retries := make(chan item, len(bodies)) // at most one pending retry per body
	finished := make(chan struct{})
	if n == 0 {
		close(finished)
	}
	var start time.Time
	done := func() {
		switch k := final.Add(1); {
		case k == n/2:
			half.Store(int64(time.Since(start)))
		case k == n*9/10:
			most.Store(int64(time.Since(start)))
		case k == n:
			close(finished)
		}
	}
	// take is the next report to post: a retry that is due, else the next
	// body, else (all bodies taken) a retry when it falls due.
	take := func() (item, bool) {
		select {
		case it := <-retries:
			return it, true
		default:
		}
		if i := next.Add(1) - 1; i < n {
			return item{i: int(i)}, true
		}
		select {
		case it := <-retries:
			return it, true
		case <-finished:
		case <-ctx.Done():
		}
		return item{}, false
	}
	self, sb0, m0 := cpuNow(), cpuOf(sbPID), sampleMachine()
	start = time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				it, ok := take()
				if !ok {
					return
				}
				switch st, ra := post(bodies[it.i]); {
				case st == http.StatusOK:
					done()
				case st != 0 && retryable(st):
					retried.Add(1)
					it.failures++
					time.AfterFunc(plainRetry.Delay(it.failures, ra), func() { retries <- it })
				default:
					failed.Add(1)
					done()
				}
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.clientCPU, res.sandboxCPU = cpuNow()-self, cpuOf(sbPID)-sb0
	res.busy, res.steal = machineShare(m0, sampleMachine())
	res.posts, res.retried = len(bodies), int(retried.Load())
	res.half, res.most = time.Duration(half.Load()), time.Duration(most.Load())
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if n := failed.Load(); n > 0 {
		return res, fmt.Errorf("ceiling: %d of %d posts failed (first: %v)", n, len(bodies), firstErr.Load())
	}
	return res, nil
}

func cpuNow() time.Duration { return cpuOf(0) }

// cpuOf is cpuTime of pid (0: this process), 0 when unreadable.
func cpuOf(pid int) time.Duration {
	if pid == 0 {
		pid = selfPID
	}
	d, _ := cpuTime(pid)
	return d
}

func adminPost(ctx context.Context, hc *http.Client, url, body string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("sandbox admin: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("sandbox admin POST %s: %s: %s", url, resp.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("sandbox admin POST %s: %w", url, err)
		}
	}
	return nil
}
