//go:build linux

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clkTck is USER_HZ, the unit of utime and stime in /proc/<pid>/stat: 100
// on every Linux architecture Go supports (the kernel's ABI constant).
const clkTck = 100

// cpuTime is the user+system CPU time the process has used so far, from
// fields 14 and 15 of /proc/<pid>/stat.
func cpuTime(pid int) (time.Duration, error) {
	return statCPU(fmt.Sprintf("/proc/%d/stat", pid))
}

// statCPU is utime+stime of a /proc stat file (a process's or a thread's).
func statCPU(path string) (time.Duration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing parenthesis.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("%s: %d fields", path, len(f)+2)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return time.Duration(ut+st) * time.Second / clkTck, nil
}

// peakRSS is VmHWM from /proc/<pid>/status: the process's peak resident set.
func peakRSS(pid int) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "VmHWM:") {
			continue
		}
		fs := strings.Fields(line)
		if len(fs) < 2 {
			break
		}
		kb, err := strconv.ParseInt(fs[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/status VmHWM: %w", pid, err)
		}
		return kb << 10, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmHWM", pid)
}

// child is one process the benchmark started. Its output goes to a log
// file in the run's folder.
type child struct {
	name, log string
	cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
	err       error         // Wait's error, set before done closes
}

// startChild runs bin with args; stdout and stderr go to dir/name.log. The
// child gets SIGKILL should the benchmark die first.
func startChild(dir, name string, env []string, bin string, args ...string) (*child, error) {
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	fmt.Fprintf(f, "=== %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = f, f, env
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() { // owner: the child; ends when the process exits (stop kills it)
		c.err = cmd.Wait()
		f.Close()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

func (c *child) running() bool {
	select {
	case <-c.done:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM, and SIGKILL after grace; it waits for the exit.
func (c *child) stop(grace time.Duration) {
	if !c.running() {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// tail returns the last n lines of the child's log.
func (c *child) tail(n int) string {
	b, err := os.ReadFile(c.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP polls url until it answers 200, the child exits, or d passes.
func waitHTTP(c *child, url string, d time.Duration) error {
	deadline := time.Now().Add(d)
	hc := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := hc.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("GET %s: %s", url, resp.Status)
		}
		if !c.running() {
			return fmt.Errorf("%s exited before it was ready (%v); log %s:\n%s", c.name, c.err, c.log, c.tail(20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s (last: %v); log %s", c.name, d, err, c.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

var scrapeTransport = &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 4}

// scrape fetches http://addr/metrics and returns, for each name, the sum of
// the samples of that metric whose labels contain every one of the given
// label matchers (name{a="b"} is written as "name" + `a="b"`).
func scrape(addr string, want map[string][]string) (map[string]float64, error) {
	// Uncompressed: gzip would cost the scraped process more than the
	// exposition itself.
	hc := &http.Client{Timeout: 2 * time.Second, Transport: scrapeTransport}
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s/metrics: %s", addr, resp.Status)
	}
	out := make(map[string]float64, len(want))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
	key:
		for key, labels := range want {
			metric, _, _ := strings.Cut(key, "|")
			if metric != name {
				continue
			}
			for _, l := range labels {
				if !strings.Contains(line, l) {
					continue key
				}
			}
			fields := strings.Fields(line)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				return nil, fmt.Errorf("metrics line %q: %w", line, err)
			}
			out[key] += v
		}
	}
	return out, sc.Err()
}

// machineCPU is a sample of the machine's CPU counters (the "cpu" line of
// /proc/stat, in USER_HZ ticks summed over all CPUs).
type machineCPU struct {
	total, idle, steal int64
}

// sampleMachine reads /proc/stat; a zero sample when it cannot.
func sampleMachine() machineCPU {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machineCPU{}
	}
	var m machineCPU
	for i, s := range f[1:9] { // user nice system idle iowait irq softirq steal
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return machineCPU{}
		}
		m.total += v
		switch i {
		case 3, 4:
			m.idle += v
		case 7:
			m.steal += v
		}
	}
	return m
}

// machineShare is what the machine did between two samples: the share of
// CPU time busy (neither idle nor stolen) and the share stolen by the
// hypervisor (another guest ran on our cores: a round with steal is slowed
// from outside).
func machineShare(a, b machineCPU) (busy, steal float64) {
	t := float64(b.total - a.total)
	if t <= 0 {
		return 0, 0
	}
	st := float64(b.steal - a.steal)
	return (t - float64(b.idle-a.idle) - st) / t, st / t
}
