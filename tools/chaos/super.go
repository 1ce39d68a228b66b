//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Role is one supervised instance of a playpipe role (consume-0, report-1,
// …): its command line, its admin address, whether it should run, and
// what was seen of it.
type Role struct {
	Name     string
	Args     []string // after the subcommand's --admin-addr
	Admin    string
	Progress string // the /metrics counter whose change is progress

	want     bool
	cmd      *exec.Cmd
	done     chan struct{}
	exitErr  error
	downAt   time.Time // when it was seen dead (zero while running)
	Exits    []string  // how each run ended that was not asked for
	Restarts int
	PeakRSS  int64 // KiB, the highest VmHWM of any of its runs

	lastVal    float64
	lastChange time.Time
	Stall      time.Duration // longest time without progress while the partner was reachable
}

// Super starts the roles, restarts what dies (after a second, as a
// deployment would), samples peak RSS and progress.
type Super struct {
	bin, logDir string
	env         []string
	log         *slog.Logger
	reachable   func(time.Time) bool   // the partner is reachable at t
	onExit      func(name, how string) // told of each exit it restarts after

	mu    sync.Mutex
	roles []*Role
	stop  chan struct{}
	done  chan struct{}
	// others are processes not started here whose peak RSS is reported
	// (brokers, clickhouse-server): name → PID function.
	others   map[string]func() int
	otherRSS map[string]int64
}

func newSuper(bin, logDir string, env []string, log *slog.Logger) *Super {
	return &Super{bin: bin, logDir: logDir, env: env, log: log, stop: make(chan struct{}), done: make(chan struct{}),
		others: map[string]func() int{}, otherRSS: map[string]int64{}, reachable: func(time.Time) bool { return true }}
}

// Add registers a role; want says whether it runs from the start.
func (s *Super) Add(r *Role, want bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r.want = want
	s.roles = append(s.roles, r)
	if want {
		s.startLocked(r)
	}
}

func (s *Super) startLocked(r *Role) {
	f, err := os.OpenFile(filepath.Join(s.logDir, r.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.log.Error("chaos: log file", "role", r.Name, "err", err)
		return
	}
	args := append([]string{r.Args[0], "--admin-addr", r.Admin}, r.Args[1:]...)
	fmt.Fprintf(f, "=== %s: playpipe %s\n", time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, s.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		s.log.Error("chaos: start", "role", r.Name, "err", err)
		return
	}
	done := make(chan struct{})
	r.cmd, r.done, r.exitErr, r.downAt = cmd, done, nil, time.Time{}
	r.lastChange, r.lastVal = time.Now(), -1
	go func() { // owned by the Super: every process is killed and waited for by Close
		err := cmd.Wait()
		f.Close()
		s.mu.Lock()
		r.exitErr = err
		s.mu.Unlock()
		close(done)
	}()
}

func running(r *Role) bool {
	if r.done == nil {
		return false
	}
	select {
	case <-r.done:
		return false
	default:
		return true
	}
}

// Signal sends sig to the running instance of name; it says the PID.
func (s *Super) Signal(name string, sig syscall.Signal) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.roles {
		if r.Name == name && running(r) {
			return r.cmd.Process.Pid, r.cmd.Process.Signal(sig)
		}
	}
	return 0, fmt.Errorf("%s is not running", name)
}

// SetWant starts (true) or stops with SIGTERM (false) a role: a scale-out
// or scale-in. A stopped role is not restarted.
func (s *Super) SetWant(name string, want bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.roles {
		if r.Name != name {
			continue
		}
		r.want = want
		if want && !running(r) {
			s.startLocked(r)
		}
		if !want && running(r) {
			return r.cmd.Process.Signal(syscall.SIGTERM)
		}
		return nil
	}
	return fmt.Errorf("no role %s", name)
}

// Run supervises until Close: every 200 ms a role that should run and has
// exited is restarted once it has been down a second; every second the
// peak RSS and the progress counters are sampled.
func (s *Super) Run() {
	go func() { // owned by the Super: Close stops it
		defer close(s.done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		var n int
		for {
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
			s.restartDead()
			if n++; n%5 == 0 {
				s.sample()
			}
		}
	}()
}

func (s *Super) restartDead() {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for _, r := range s.roles {
		if r.done == nil || running(r) || !r.want {
			continue
		}
		if r.downAt.IsZero() {
			r.downAt = now
			r.Exits = append(r.Exits, exitString(r.exitErr)+" at "+now.Format("15:04:05"))
			if s.onExit != nil {
				s.onExit(r.Name, exitString(r.exitErr))
			}
			continue
		}
		if now.Sub(r.downAt) >= time.Second {
			r.Restarts++
			s.startLocked(r)
		}
	}
}

func exitString(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "signal " + ws.Signal().String()
		}
		return fmt.Sprintf("exit %d", ee.ExitCode())
	default:
		return err.Error()
	}
}

// sample reads each process's peak RSS and each role's progress counter.
func (s *Super) sample() {
	s.mu.Lock()
	type probe struct {
		r    *Role
		pid  int
		addr string
	}
	var ps []probe
	for _, r := range s.roles {
		if running(r) {
			ps = append(ps, probe{r, r.cmd.Process.Pid, r.Admin})
		}
	}
	others := map[string]int{}
	for name, pid := range s.others {
		others[name] = pid()
	}
	reachableAt := s.reachable
	s.mu.Unlock()
	now := time.Now()
	reachable := reachableAt(now)
	for _, p := range ps {
		rss := peakRSS(p.pid)
		v, err := scrapeSum(p.addr, p.r.Progress)
		s.mu.Lock()
		p.r.PeakRSS = max(p.r.PeakRSS, rss)
		switch {
		case err == nil && v != p.r.lastVal:
			p.r.lastVal, p.r.lastChange = v, now
		case !reachable || !p.r.want:
			p.r.lastChange = now // the partner's fault, or scaled in: not a stall
		default:
			p.r.Stall = max(p.r.Stall, now.Sub(p.r.lastChange))
		}
		s.mu.Unlock()
	}
	for name, pid := range others {
		if pid == 0 {
			continue
		}
		rss := peakRSS(pid)
		s.mu.Lock()
		s.otherRSS[name] = max(s.otherRSS[name], rss)
		s.mu.Unlock()
	}
}

// SetOnExit sets the function told of each exit of a role that should
// run (the supervisor restarts it a second later).
func (s *Super) SetOnExit(fn func(name, how string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onExit = fn
}

// SetReachable says when the partner is reachable (progress is due);
// a function that always answers false ends the stall figures.
func (s *Super) SetReachable(fn func(time.Time) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reachable = fn
}

// peakRSS is VmHWM of pid in KiB (0 when unreadable).
func peakRSS(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// scrapeSum sums the samples of the metric family name at addr/metrics.
func scrapeSum(addr, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			sum += v
		}
	}
	return sum, sc.Err()
}

// Ready reports the roles that should run and are not running or not
// ready (/readyz not 200).
func (s *Super) NotReady() []string {
	s.mu.Lock()
	var check []*Role
	var out []string
	for _, r := range s.roles {
		if !r.want {
			continue
		}
		if !running(r) {
			out = append(out, r.Name+" (not running)")
			continue
		}
		check = append(check, r)
	}
	s.mu.Unlock()
	client := &http.Client{Timeout: 2 * time.Second}
	for _, r := range check {
		resp, err := client.Get("http://" + r.Admin + "/readyz")
		if err != nil {
			out = append(out, r.Name+" (readyz: "+err.Error()+")")
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			out = append(out, fmt.Sprintf("%s (readyz %d)", r.Name, resp.StatusCode))
		}
	}
	slices.Sort(out)
	return out
}

// Snapshot copies the roles' figures.
func (s *Super) Snapshot() ([]Role, map[string]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Role
	for _, r := range s.roles {
		c := *r
		c.cmd, c.done = nil, nil
		out = append(out, c)
	}
	return out, maps(s.otherRSS)
}

func maps(m map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Close stops supervising, then SIGTERMs every role, SIGKILLs what is left
// after 15 s, and waits for each.
func (s *Super) Close() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
		<-s.done
	}
	s.mu.Lock()
	roles := slices.Clone(s.roles)
	for _, r := range roles {
		r.want = false
		if running(r) {
			_ = r.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	s.mu.Unlock()
	deadline := time.Now().Add(15 * time.Second)
	for _, r := range roles {
		if r.done == nil {
			continue
		}
		select {
		case <-r.done:
		case <-time.After(time.Until(deadline)):
			_ = r.cmd.Process.Kill()
			<-r.done
		}
	}
}
