//go:build linux

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/playpipe/playpipe/testkit/kafkanode"
)

// nemesis runs a schedule on a rig: each fault started at its time, ended
// after its duration, both written to the timeline.
type nemesis struct {
	r  *Rig
	tl *Timeline
	// tracks of the catalog: a track fault picks one by Fault.Pick.
	tracks []int64

	mu   sync.Mutex
	down map[int]bool // broker node ids killed and not yet restarted
}

// run plays the schedule from t0; it returns when every fault has ended
// or ctx is done (then the faults still active are lifted at once).
func (nm *nemesis) run(ctx context.Context, t0 time.Time, plan []Fault) {
	var wg sync.WaitGroup
	for _, f := range plan {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(t0.Add(f.At))):
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() { // owned by run: waited for below
			defer wg.Done()
			nm.play(ctx, f)
		}()
	}
	wg.Wait()
}

// play starts f, waits its duration (or ctx), and ends it.
func (nm *nemesis) play(ctx context.Context, f Fault) {
	end, note, err := nm.start(ctx, &f)
	if err != nil {
		note = strings.TrimPrefix(note+"; not applied: "+err.Error(), "; ")
	}
	nm.tl.Started(f, note)
	if err != nil || end == nil {
		nm.tl.Ended(f, "")
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(f.For):
	}
	nm.tl.Ended(f, end())
}

// start applies f and returns the function that lifts it (nil for an
// instant fault) and what was done.
func (nm *nemesis) start(ctx context.Context, f *Fault) (end func() string, note string, err error) {
	r := nm.r
	switch f.Kind {
	case KindKill9, KindTerm:
		sig := syscall.SIGKILL
		if f.Kind == KindTerm {
			sig = syscall.SIGTERM
		}
		pid, err := r.super.Signal(f.Target, sig)
		return nil, fmt.Sprintf("pid %d", pid), err
	case KindBroker, KindLeader, KindController:
		id, err := nm.brokerTarget(ctx, f)
		if err != nil {
			return nil, "", err
		}
		n := r.kafka.Node(id)
		f.Target = fmt.Sprintf("node-%d", id)
		nm.setDown(id, true)
		n.Kill()
		return func() string { return nm.restart(n) }, fmt.Sprintf("kill -9 node %d", id), nil
	case KindPartition:
		if r.net == nil {
			return nil, "", fmt.Errorf("no network namespace")
		}
		if nm.isDown(3) {
			return nil, "", fmt.Errorf("node 3 is down")
		}
		if err := r.net.Cut(); err != nil {
			return nil, "", err
		}
		return func() string {
			if err := r.net.Heal(); err != nil {
				return err.Error()
			}
			return "healed"
		}, "packets of node 3 dropped", nil
	case KindStorm:
		status, share, _ := strings.Cut(f.Param, "@")
		body := fmt.Sprintf(`{"report":{"rate_%s":%s,"retry_after":"2s"}}`, status, share)
		return func() string {
			return nm.admin(http.MethodPatch, "/admin/faults", fmt.Sprintf(`{"report":{"rate_%s":null,"retry_after":null}}`, status))
		}, "", nm.adminErr(http.MethodPatch, "/admin/faults", body)
	case KindStandby:
		return func() string { return nm.admin(http.MethodPut, "/admin/mode", `{"mode":"live"}`) },
			"", nm.adminErr(http.MethodPut, "/admin/mode", `{"mode":"standby"}`)
	case KindRevoke:
		return nil, "", nm.adminErr(http.MethodPost, "/admin/revoke-tokens", "")
	case KindTrack500:
		tr := nm.track(f)
		f.Target = fmt.Sprintf("track %d", tr)
		return nm.liftTrack, "", nm.adminErr(http.MethodPatch, "/admin/faults", fmt.Sprintf(`{"report":{"track_ids":[%d],"track_status":500}}`, tr))
	case KindHang:
		tr := nm.track(f)
		f.Target = fmt.Sprintf("track %d", tr)
		// HOOK(hang): the sandbox's hold fault (the reports of track_ids
		// held "hold" before their answer). A sandbox without it refuses
		// the unknown field and the timeline says "not applied". Each
		// report is held three times the reporters' --api-timeout.
		body := fmt.Sprintf(`{"report":{"track_ids":[%d],"track_status":500,"hold":"%s"}}`, tr, 3*apiTimeout)
		return func() string {
			return nm.admin(http.MethodPatch, "/admin/faults", `{"report":{"track_ids":null,"track_status":null,"hold":null}}`)
		}, "", nm.adminErr(http.MethodPatch, "/admin/faults", body)
	case KindLatency:
		return func() string { return nm.admin(http.MethodPatch, "/admin/faults", `{"report":{"latency":null}}`) },
			"", nm.adminErr(http.MethodPatch, "/admin/faults", fmt.Sprintf(`{"report":{"latency":%q}}`, f.Param))
	case KindScaleOut:
		return func() string { return errString(r.super.SetWant(f.Target, false)) }, "", r.super.SetWant(f.Target, true)
	case KindScaleIn:
		return func() string { return errString(r.super.SetWant(f.Target, true)) }, "", r.super.SetWant(f.Target, false)
	case KindCHSlow:
		pid := r.ch.PID()
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			return nil, "", err
		}
		return func() string { return errString(syscall.Kill(pid, syscall.SIGCONT)) }, fmt.Sprintf("SIGSTOP pid %d", pid), nil
	}
	return nil, "", fmt.Errorf("unknown kind %s", f.Kind)
}

// brokerTarget resolves the node a broker fault kills: the drawn one, the
// busiest leader of plays.reports, or the active controller. A node
// already down (by another fault's overlap) is refused.
func (nm *nemesis) brokerTarget(ctx context.Context, f *Fault) (int, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var id int
	var err error
	switch f.Kind {
	case KindBroker:
		id, err = strconv.Atoi(strings.TrimPrefix(f.Target, "node-"))
	case KindLeader:
		id, err = nm.r.busiestLeader(actx)
	case KindController:
		id, err = nm.r.kafka.ActiveController(actx)
	}
	if err != nil {
		return 0, err
	}
	if nm.isDown(id) {
		return 0, fmt.Errorf("node %d is down already", id)
	}
	return id, nil
}

func (nm *nemesis) setDown(id int, down bool) {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	nm.down[id] = down
}

func (nm *nemesis) isDown(id int) bool {
	nm.mu.Lock()
	defer nm.mu.Unlock()
	return nm.down[id]
}

// restart starts a killed node again and waits until it is registered.
func (nm *nemesis) restart(n *kafkanode.Node) string {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	var err error
	for try := 0; try < 3; try++ {
		if err = nm.r.kafka.Restart(ctx, n); err == nil {
			break
		}
		n.Kill()
	}
	nm.setDown(n.ID, false)
	if err != nil {
		return fmt.Sprintf("node %d NOT restarted: %v", n.ID, err)
	}
	return fmt.Sprintf("node %d back in %s", n.ID, time.Since(began).Round(time.Millisecond))
}

func (nm *nemesis) track(f *Fault) int64 {
	return nm.tracks[int(f.Pick%uint32(len(nm.tracks)))]
}

func (nm *nemesis) liftTrack() string {
	return nm.admin(http.MethodPatch, "/admin/faults", `{"report":{"track_ids":null,"track_status":null}}`)
}

// admin calls the sandbox's admin API and says the error, if any.
func (nm *nemesis) admin(method, path, body string) string {
	return errString(nm.adminErr(method, path, body))
}

func (nm *nemesis) adminErr(method, path, body string) error {
	return sandboxAdmin(nm.r.sbAdmin, method, path, body)
}

func sandboxAdmin(addr, method, path, body string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, bytes.NewBufferString(body))
	if err != nil {
		return err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// liftAll lifts whatever a fault may have left: the partner's faults and
// mode, the partition, a frozen ClickHouse, a node down, the reporters'
// scale. Idempotent.
func (nm *nemesis) liftAll() []string {
	r := nm.r
	var errs []string
	add := func(s string) {
		if s != "" {
			errs = append(errs, s)
		}
	}
	add(nm.admin(http.MethodDelete, "/admin/faults", ""))
	add(nm.admin(http.MethodPut, "/admin/mode", `{"mode":"live"}`))
	if r.net != nil {
		_ = r.net.Heal() // no table: nothing to heal
	}
	_ = syscall.Kill(r.ch.PID(), syscall.SIGCONT)
	for _, n := range r.kafka.Nodes() {
		if !n.Running() {
			if s := nm.restart(n); strings.Contains(s, "NOT") {
				add(s)
			}
		}
	}
	add(errString(r.super.SetWant("report-1", true)))
	add(errString(r.super.SetWant("report-2", false)))
	return errs
}
