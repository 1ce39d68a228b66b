//go:build linux

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/version"
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
	posts      int
	elapsed    time.Duration
	clientCPU  time.Duration // this process during the run (the client; the broker is idle)
	sandboxCPU time.Duration
	busy       float64 // the machine's CPU busy share during the run
	steal      float64 // the machine's CPU share stolen by the hypervisor
}

func (c ceilingResult) rate() float64 { return float64(c.posts) / c.elapsed.Seconds() }

// cpuPerPost is the client's CPU µs per post.
func (c ceilingResult) cpuPerPost() float64 { return us(c.clientCPU) / float64(c.posts) }

// ceiling resets the sandbox's ledger (the bodies were accepted once
// already: posted again they would be answered as duplicates), mints a
// token, and posts every body with conc goroutines over conc keep-alive
// connections: a plain net/http client, the way a minimal reporter would.
// Every post must be answered 200.
func ceiling(ctx context.Context, apiURL, sbAdmin string, sbPID int, bodies [][]byte, conc int, latency time.Duration) (ceilingResult, error) {
	var res ceilingResult
	admin := &http.Client{Timeout: 10 * time.Second}
	if err := adminPost(ctx, admin, "http://"+sbAdmin+"/admin/reset", "", nil); err != nil {
		return res, err
	}
	if latency > 0 { // the reset cleared the faults
		if err := setLatency(ctx, sbAdmin, latency); err != nil {
			return res, err
		}
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
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ua := version.UserAgent()
	url := apiURL + "/partners/royalty-tracking"
	var next, failed atomic.Int64
	var firstErr atomic.Value
	post := func(body []byte) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			return
		}
		req.Header["User-Agent"] = []string{ua}
		req.Header["Authorization"] = []string{tok.Token}
		req.Header["Content-Type"] = []string{"application/json"}
		resp, err := hc.Do(req)
		if err != nil {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			failed.Add(1)
			firstErr.CompareAndSwap(nil, "HTTP "+resp.Status)
		}
	}
	self, sb0, m0 := cpuNow(), cpuOf(sbPID), sampleMachine()
	start := time.Now()
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(bodies)) || ctx.Err() != nil {
					return
				}
				post(bodies[i])
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.clientCPU, res.sandboxCPU = cpuNow()-self, cpuOf(sbPID)-sb0
	res.busy, res.steal = machineShare(m0, sampleMachine())
	res.posts = len(bodies)
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
